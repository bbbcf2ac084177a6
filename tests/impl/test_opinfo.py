"""OpInfo-driven tests for the torch entry points (``tests/support/opinfo_db.py``): the lab's three and ``attn_o``
(full and causal).

The test bodies follow PyTorch's own templates so that the OpInfo flags are checked the way PyTorch checks
them: ``TestBwdGradients`` (test/test_ops_gradients.py), ``TestFwdGradients`` (test/test_ops_fwd_gradients.py),
and from ``TestCommon`` / ``TestMathBits`` (test/test_ops.py) ``test_errors``, ``test_dtypes`` (simplified:
claimed dtypes work, every other dtype raises the contract's error), ``test_noncontiguous_samples``,
``test_out`` (only the ``supports_out=False`` branch) and ``test_conj_view``; plus a variant-consistency test
against each entry's ``ref`` (``attn_reference`` / ``attn_o_reference``) and ``torch.library.opcheck``, both on
every sample.  Every test runs under ``opinfo_db.small_tiles()`` (``attn_o``'s tiles; the other entries have
none), so that ``attn_o``'s small samples cross tiles with tails.
``instantiate_device_type_tests`` makes a CPU and (where a GPU exists) a CUDA copy of each class.

Not copied, because they would only ever skip here: ``test_fn_fail_gradgrad`` (every entry supports gradgrad)
and the inplace / method variants (there are none).
"""

from __future__ import annotations

from functools import partial

import torch
from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_dtype import all_types_and_complex_and
from torch.testing._internal.common_utils import TestCase, TestGradients, noncontiguous_like
from torch.testing._internal.opinfo.core import SampleInput

from tests.support.opinfo_db import FN_NAMES, attn_op_db, small_tiles
from torch_impl.validation import message

# gradcheck requires double precision (as in test_ops_gradients.py)
_gradcheck_ops = partial(ops, dtypes=OpDTypes.supported, allowed_dtypes=[torch.double, torch.cdouble])
_DEVICES = ("cpu", "cuda")


def _tensors_requiring_grad(sample):
    return [t for t in (sample.input, *sample.args) if isinstance(t, torch.Tensor) and t.requires_grad]


def _outputs(result):
    """The outputs as a tuple: ``(o, a)`` for the lab's entries, ``(o,)`` for attn_o's."""
    return tuple(result) if isinstance(result, tuple) else (result,)


def _outputs_and_grads(fn, sample, cotangents=None):
    """The outputs (``(o, a)``, or ``(o,)``) and the gradients of ``Σ <output, cotangent>`` with respect to every
    input requiring grad."""
    outputs = _outputs(fn(sample.input, *sample.args))
    inputs = _tensors_requiring_grad(sample)
    if cotangents is None:
        cotangents = tuple(torch.randn_like(t) for t in outputs)
    # When only v requires grad, a = tanh(q kᵀ) of the composites does not (it does not depend on v), while the
    # Function's a does (autograd.Function marks every output); either way its gradient contribution is zero.
    pairs = [(out, cot) for out, cot in zip(outputs, cotangents) if out.requires_grad]
    outs, cots = zip(*pairs) if pairs else ((), ())
    grads = torch.autograd.grad(outs, inputs, cots) if inputs else ()
    return outputs, grads, cotangents


class _SmallTiles:
    """Every test under ``small_tiles()``: attn_o's samples then cross tiles (the lab's entries have none)."""

    def setUp(self):
        super().setUp()
        tiles = small_tiles()
        tiles.__enter__()
        self.addCleanup(tiles.__exit__, None, None, None)


class TestAttnBwdGradients(_SmallTiles, TestGradients):
    @_gradcheck_ops(attn_op_db)
    def test_fn_grad(self, device, dtype, op):
        if dtype not in op.supported_backward_dtypes(torch.device(device).type):
            self.skipTest("Skipped! Dtype is not in supported backward dtypes!")
        self._grad_test_helper(device, dtype, op, op.get_op())

    @_gradcheck_ops(attn_op_db)
    def test_fn_gradgrad(self, device, dtype, op):
        self._skip_helper(op, device, dtype)
        self.assertTrue(op.supports_gradgrad)
        self._check_helper(device, dtype, op, op.get_op(), "bwgrad_bwgrad")


class TestAttnFwdGradients(_SmallTiles, TestGradients):
    @_gradcheck_ops(attn_op_db)
    def test_fn_fwgrad_bwgrad(self, device, dtype, op):
        self._skip_helper(op, device, dtype)
        if op.supports_fwgrad_bwgrad:
            self._check_helper(device, dtype, op, op.get_op(), "fwgrad_bwgrad")
        else:
            with self.assertRaisesRegex(NotImplementedError,
                                        r"Trying to use forward AD with .* that does not support it"):
                self._check_helper(device, dtype, op, op.get_op(), "fwgrad_bwgrad")

    @_gradcheck_ops(attn_op_db)
    def test_forward_mode_AD(self, device, dtype, op):
        self._skip_helper(op, device, dtype)

        def check():
            self._grad_test_helper(device, dtype, op, op.get_op(), check_forward_ad=True, check_backward_ad=False,
                                   check_batched_grad=False, check_batched_forward_grad=op.check_batched_forward_grad)

        if op.supports_forward_ad:
            check()
        else:
            with self.assertRaisesRegex(NotImplementedError,
                                        r"Trying to use forward AD with .* that does not support it"):
                check()


class TestAttnCommon(_SmallTiles, TestCase):
    exact_dtype = True

    @ops(attn_op_db, dtypes=OpDTypes.none)
    def test_errors(self, device, op):
        error_inputs = list(op.error_inputs(device))
        self.assertGreaterEqual(len(error_inputs), 11)
        for ei in error_inputs:
            si = ei.sample_input
            with self.assertRaisesRegex(ei.error_type, ei.error_regex):
                op(si.input, *si.args, **si.kwargs)

    @ops(attn_op_db, dtypes=OpDTypes.none)
    def test_dtypes(self, device, op):
        """The claimed dtypes are exactly those that work (forward and backward); every other dtype is refused
        with the contract's TypeError, before any compute."""
        device_type = torch.device(device).type
        claimed, claimed_bwd = op.supported_dtypes(device_type), op.supported_backward_dtypes(device_type)
        for dtype in all_types_and_complex_and(torch.bool, torch.half, torch.bfloat16):
            q = torch.ones(2, 3, device=device, dtype=dtype)
            v = torch.ones(2, 4, device=device, dtype=dtype)
            if dtype not in claimed:
                msg = message("dtype", FN_NAMES[op.name], name="q", dtype=str(dtype).removeprefix("torch."))
                with self.assertRaises(TypeError) as cm:
                    op(q, q.clone(), v)
                self.assertEqual(str(cm.exception), msg)
                continue
            outputs = _outputs(op(q, q.clone(), v))
            self.assertEqual([t.dtype for t in outputs], [dtype] * len(outputs))
            if dtype in claimed_bwd:
                qg = q.clone().requires_grad_()
                outputs = _outputs(op(qg, q.clone(), v))
                (gq,) = torch.autograd.grad(outputs, qg, [torch.ones_like(t) for t in outputs])
                self.assertEqual(gq.dtype, dtype)
        self.assertEqual(set(claimed), {torch.float32, torch.float64, torch.complex64, torch.complex128,
                                        torch.bfloat16, torch.float16})

    @ops(attn_op_db, allowed_dtypes=(torch.float32, torch.complex64))
    def test_noncontiguous_samples(self, device, dtype, op):
        """Same values, same gradients, on non-contiguous copies of every sample (and non-contiguous
        cotangents), as in PyTorch's test/test_ops.py."""
        for sample in op.sample_inputs(device, dtype, requires_grad=True):
            noncontig = sample.noncontiguous()
            self.assertFalse(noncontig.input.numel() > 1 and noncontig.input.is_contiguous())
            expected, grads, cotangents = _outputs_and_grads(op, sample)
            actual, ncgrads, _ = _outputs_and_grads(op, noncontig, tuple(map(noncontiguous_like, cotangents)))
            self.assertEqual(actual, expected)
            self.assertEqual(ncgrads, grads)

    @ops(attn_op_db, allowed_dtypes=(torch.float32, torch.float64, torch.complex128))
    def test_variant_consistency(self, device, dtype, op):
        """Each entry agrees with its ``ref`` (``attn_reference`` / ``attn_o_reference``: plain autograd) on
        every sample, in values and in the gradients of every output."""
        for sample in op.sample_inputs(device, dtype, requires_grad=True):
            actual, grads, cot = _outputs_and_grads(op, sample)
            ref_sample = sample.transform(lambda t: t.detach().requires_grad_(t.requires_grad)
                                          if isinstance(t, torch.Tensor) else t)
            expected, ref_grads, _ = _outputs_and_grads(op.ref, ref_sample, cot)
            self.assertEqual(actual, expected)
            self.assertEqual(grads, ref_grads)

    @ops(attn_op_db, allowed_dtypes=(torch.complex128,))
    def test_conj_view(self, device, dtype, op):
        """A lazily conjugated input (conj bit set) gives the same values and gradients as its materialised
        conjugate (PyTorch's test/test_ops.py TestMathBits): the conj-aware matmuls of (11)-(13) must not double-apply it."""
        for sample in op.sample_inputs(device, dtype):
            for index in range(3):
                base = [t.detach() for t in (sample.input, *sample.args)]
                lazy = [t.conj() if i == index else t.clone() for i, t in enumerate(base)]
                self.assertTrue(lazy[index].is_conj())
                resolved = [t.resolve_conj().requires_grad_() for t in lazy]
                lazy = [t.requires_grad_() for t in lazy]
                actual, grads, cot = _outputs_and_grads(op, SampleInput(lazy[0], args=tuple(lazy[1:])))
                expected, ref_grads, _ = _outputs_and_grads(op, SampleInput(resolved[0], args=tuple(resolved[1:])), cot)
                self.assertEqual(actual, expected)
                self.assertEqual(grads, ref_grads)

    @ops(attn_op_db, allowed_dtypes=(torch.float32,))
    def test_out(self, device, dtype, op):
        """supports_out=False is true: an ``out=`` argument is refused (PyTorch's test/test_ops.py check for such ops)."""
        self.assertFalse(op.supports_out)
        sample = next(iter(op.sample_inputs(device, dtype)))
        expected = op(sample.input, *sample.args)
        # TypeError: the Function's Python signature has no ``out``; RuntimeError: the op schema has none.
        with self.assertRaises((TypeError, RuntimeError)):
            op(sample.input, *sample.args, out=tuple(torch.empty_like(t) for t in expected))


# Samples opcheck would only repeat: sizes 2-5 with no 0 or 1 in a new place (the lab size, (1, 1, 1) and the
# empty sizes stay, as do every layout and requires-grad pattern). The other OpInfo tests run them all.
_OPCHECK_REPEATS = {"n1_d3_e2", "n3_d1_e2", "n3_d2_e1", "n4_d2_e5", "n3_d5_e2"}


class TestAttnOpcheck(TestCase):
    # torch.library.opcheck (schema, autograd registration, FakeTensor, AOT dispatch) on the samples, for the
    # two dispatcher operators (the Function is not one).  float64 only: ~0.2 s per call, and the other
    # dtypes / no-grad inputs get a few samples in tests/impl/test_ops.py::test_opcheck.
    @ops([op for op in attn_op_db if isinstance(op.op, torch._ops.OpOverload)], allowed_dtypes=(torch.float64,))
    def test_opcheck(self, device, dtype, op):
        samples = [s for s in op.sample_inputs(device, dtype, requires_grad=True) if s.name not in _OPCHECK_REPEATS]
        self.assertEqual(len(samples), 13)
        for sample in samples:
            result = torch.library.opcheck(op.op, (sample.input, *sample.args))
            self.assertTrue(all(v == "SUCCESS" for v in result.values()), result)


instantiate_device_type_tests(TestAttnBwdGradients, globals(), only_for=_DEVICES)
instantiate_device_type_tests(TestAttnFwdGradients, globals(), only_for=_DEVICES)
instantiate_device_type_tests(TestAttnCommon, globals(), only_for=_DEVICES)
instantiate_device_type_tests(TestAttnOpcheck, globals(), only_for=_DEVICES)
