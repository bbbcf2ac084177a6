"""OpInfo entries for tanh attention: the Function, the composite operator and the explicit operator; and
``attn_o`` (the output alone, tiled; ``causal=True`` a variant of its own).

Modelled on ``torch/testing/_internal/autograd_function_db.py`` and ``custom_op_db.py``: one ``OpInfo`` per
entry point, sharing one ``sample_inputs_func`` and one ``error_inputs_func``, so the device-generic test
templates in ``tests/impl/test_opinfo.py`` (copies of ``test/test_ops*.py``'s) run unchanged against all three.

The flags are claims the templates verify: every entry point supports backward, double backward, forward AD,
forward-over-reverse, and batched (vmap) gradients of all three kinds.  ``attn_reference`` and
``attn_o_reference`` are *not* entries: they are the oracles (each entry's ``ref``) the entries are compared
against (``test_variant_consistency``).

``attn_o`` takes stacks ``(..., n, ·)`` and runs by tiles of A: its samples are stacks (batch × heads), and the
tests run it under ``small_tiles()`` so that these small sizes cross several row and key tiles with tails (and
a stack split across tiles).
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from torch.testing import make_tensor
from torch.testing._internal.common_dtype import floating_and_complex_types_and
from torch.testing._internal.opinfo.core import DecorateInfo, ErrorInput, OpInfo, SampleInput

import attn_contract
import torch_impl  # registers torch.ops.attn_lab.*
from torch_impl.kernels import o_only
from torch_impl.validation import message

# (n, d, e).  Each size is 1 somewhere and 0 somewhere (the contract allows empty sizes), and d != e.
SHAPES = (
    (2, 3, 4),                          # the lab's size
    (1, 1, 1),
    (1, 3, 2), (3, 1, 2), (3, 2, 1),    # n = 1, d = 1, e = 1 one at a time
    (4, 2, 5), (3, 5, 2),               # d < e, d > e
    (0, 3, 4), (3, 0, 4), (3, 3, 0),    # n = 0, d = 0, e = 0
)
# Values in [-1, 1): x = q kᵀ then stays where tanh is far from saturation, so tanh'(x) = 1 − a² is not ~0 and
# a wrong gradient formula cannot hide behind a vanishing derivative.
LOW, HIGH = -1.0, 1.0


def _make(shape, device, dtype, requires_grad, noncontiguous=False):
    return make_tensor(shape, device=device, dtype=dtype, low=LOW, high=HIGH,
                       requires_grad=requires_grad, noncontiguous=noncontiguous)


def _transposed(shape, device, dtype, requires_grad):
    """A column-major (n, m) view: ``.mT`` of a contiguous (m, n) tensor (strides (1, n))."""
    base = _make(shape[::-1], device, dtype, requires_grad=False)
    return base.mT.requires_grad_(requires_grad)


def sample_inputs_attn(op_info, device, dtype, requires_grad, **kwargs):
    """``SampleInput(q, args=(k, v))``.  Every tensor is new (OpInfo gradient tests require no sharing)."""
    def make(shape, **kw):
        return _make(shape, device, dtype, requires_grad, **kw)

    for n, d, e in SHAPES:
        yield SampleInput(make((n, d)), args=(make((n, d)), make((n, e))), name=f"n{n}_d{d}_e{e}")
    # Non-contiguous (make_tensor's: every other element of a larger buffer), all three or just one.
    for n, d, e in ((2, 3, 4), (3, 1, 2)):
        yield SampleInput(make((n, d), noncontiguous=True),
                          args=(make((n, d), noncontiguous=True), make((n, e), noncontiguous=True)),
                          name=f"noncontiguous_n{n}_d{d}_e{e}")
    yield SampleInput(make((3, 2)), args=(make((3, 2)), make((3, 4), noncontiguous=True)), name="noncontiguous_v")
    # Transposed (column-major) views, as a caller slicing a (d, n) buffer would pass.
    yield SampleInput(_transposed((3, 4), device, dtype, requires_grad),
                      args=(_transposed((3, 4), device, dtype, requires_grad), make((3, 2))),
                      name="transposed_qk")
    yield SampleInput(make((2, 3)), args=(make((2, 3)), _transposed((2, 5), device, dtype, requires_grad)),
                      name="transposed_v")
    # Only some inputs need a gradient: exercises the output_mask / needs_input_grad paths (and saving less).
    if requires_grad:
        yield SampleInput(make((3, 2)), args=(_make((3, 2), device, dtype, False), make((3, 4))),
                          name="k_no_grad")
        yield SampleInput(_make((3, 2), device, dtype, False), args=(_make((3, 2), device, dtype, False),
                                                                    make((3, 4))), name="only_v_grad")
        yield SampleInput(make((3, 2)), args=(make((3, 2)), _make((3, 4), device, dtype, False)),
                          name="v_no_grad")


def _error(sample, error_type, key, **fields):
    # exact text: the template filled in and escaped, anchored at both ends
    return ErrorInput(sample, error_type=error_type, error_regex="^" + re.escape(message(key, **fields)) + "$")


def _validation_errors(device):
    """One ErrorInput per ``torch_impl.validation`` check except the argument-type one."""
    f32 = torch.float32

    def t(*shape, dtype=f32, dev=device):
        return torch.zeros(shape, dtype=dtype, device=dev)

    yield _error(SampleInput(t(2, 3, 1), args=(t(2, 3), t(2, 4))), ValueError, "ndim",
                 name="q", dims="n, d", ndim=3, shape=(2, 3, 1))
    yield _error(SampleInput(t(2, 3), args=(t(3), t(2, 4))), ValueError, "ndim",
                 name="k", dims="n, d", ndim=1, shape=(3,))
    yield _error(SampleInput(t(2, 3), args=(t(2, 3), t())), ValueError, "ndim",
                 name="v", dims="n, e", ndim=0, shape=())
    yield _error(SampleInput(t(2, 3, dtype=torch.int64), args=(t(2, 3), t(2, 4))), TypeError, "dtype",
                 name="q", dtype="int64")
    yield _error(SampleInput(t(2, 3), args=(t(2, 3), t(2, 4, dtype=torch.bool))), TypeError, "dtype",
                 name="v", dtype="bool")
    yield _error(SampleInput(t(2, 3), args=(t(2, 5), t(2, 4))), ValueError, "d", q=(2, 3), k=(2, 5))
    yield _error(SampleInput(t(2, 3), args=(t(3, 3), t(2, 4))), ValueError, "n", q=(2, 3), k=(3, 3), v=(2, 4))
    yield _error(SampleInput(t(2, 3), args=(t(2, 3), t(5, 4))), ValueError, "n", q=(2, 3), k=(2, 3), v=(5, 4))
    yield _error(SampleInput(t(2, 3), args=(t(2, 3, dtype=torch.float64), t(2, 4))), TypeError, "same_dtype",
                 q="float32", k="float64", v="float32")
    # A second device that exists everywhere: "meta" next to CPU, CPU next to an accelerator.
    other = "meta" if torch.device(device).type == "cpu" else "cpu"
    yield _error(SampleInput(t(2, 3), args=(t(2, 3), t(2, 4, dev=other))), ValueError, "same_device",
                 q=str(t(0).device), k=str(t(0).device), v=other)


def error_inputs_function(op_info, device, **kwargs):
    """``torch_impl.attn`` validates in Python, so a non-tensor argument gets the contract's TypeError."""
    yield _error(SampleInput([[1.0]], args=(torch.zeros(1, 1, device=device), torch.zeros(1, 1, device=device))),
                 TypeError, "type", name="q", accepted="torch.Tensor", type="list")
    yield _error(SampleInput(torch.zeros(1, 1, device=device), args=(torch.zeros(1, 1, device=device), 2.0)),
                 TypeError, "type", name="v", accepted="torch.Tensor", type="float")
    yield from _validation_errors(device)


def error_inputs_op(op_info, device, **kwargs):
    """For the dispatcher operators a non-tensor never reaches our kernel: the dispatcher checks arguments
    against the schema first and raises its own RuntimeError naming the argument."""
    name = op_info.name.replace(".", "::")
    for arg, value, index in (("q", [[1.0]], 0), ("v", 2.0, 2)):
        args = [torch.zeros(1, 1, device=device), torch.zeros(1, 1, device=device), torch.zeros(1, 1, device=device)]
        args[index] = value
        yield ErrorInput(SampleInput(args[0], args=tuple(args[1:])), error_type=RuntimeError,
                         error_regex=rf"^{re.escape(name)}\(\) Expected a value of type 'Tensor' for argument '{arg}'")
    yield from _validation_errors(device)


# --- attn_o -----------------------------------------------------------------------------------------------
# Tiles of 4 keys and 16 elements: n = 6 in a stack of 2 is 3 row blocks × 2 key blocks, the last of each a
# tail; 9 stacks of 2 keys are split 8 + 1 (one row of keys per stack already fills a tile).  Sizes kept small:
# gradgradcheck of the complex causal entry is the slowest test of the file.
SMALL_TILES = {"KEY_BLOCK": 4, "TILE_ELEMENTS": 16}


@contextlib.contextmanager
def small_tiles():
    """``attn_o``'s tile sizes set to ``SMALL_TILES`` (module globals of ``o_only``), restored after."""
    saved = {name: getattr(o_only, name) for name in SMALL_TILES}
    for name, value in SMALL_TILES.items():
        setattr(o_only, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(o_only, name, value)


# (n, d, e, batch): d != e, stacks of one and two leading dimensions, tails of the tiles, sizes 1 and 0.
O_SHAPES = (
    (2, 3, 4, ()),                      # the lab's size, unstacked
    (1, 1, 1, ()),
    (6, 2, 3, (2,)),                    # 3 row blocks × 2 key blocks, tails in both
    (3, 2, 1, (2, 2)),                  # batch × heads: one row per tile
    (2, 1, 2, (9,)),                    # the stack split across tiles (8 + 1)
    (0, 3, 4, (2,)), (3, 0, 4, (2,)), (3, 3, 0, ()),    # n = 0, d = 0, e = 0
)


def sample_inputs_attn_o(op_info, device, dtype, requires_grad, **kwargs):
    """``SampleInput(q, args=(k, v))`` of stacks.  Every tensor is new."""
    def make(shape, **kw):
        return _make(shape, device, dtype, requires_grad, **kw)

    for n, d, e, batch in O_SHAPES:
        yield SampleInput(make((*batch, n, d)), args=(make((*batch, n, d)), make((*batch, n, e))),
                          name=f"n{n}_d{d}_e{e}_b{'x'.join(map(str, batch)) or 0}")
    # Non-contiguous (every other element of a larger buffer), all three or just v.
    yield SampleInput(make((2, 5, 3), noncontiguous=True),
                      args=(make((2, 5, 3), noncontiguous=True), make((2, 5, 2), noncontiguous=True)),
                      name="noncontiguous")
    yield SampleInput(make((2, 5, 2)), args=(make((2, 5, 2)), make((2, 5, 3), noncontiguous=True)),
                      name="noncontiguous_v")
    # Transposed views (column-major rows) and a stack dimension that is not the outermost in memory.
    yield SampleInput(_transposed((5, 3), device, dtype, requires_grad),
                      args=(_transposed((5, 3), device, dtype, requires_grad), make((5, 2))), name="transposed_qk")
    base = _make((5, 2, 3), device, dtype, False)
    yield SampleInput(base.transpose(0, 1).requires_grad_(requires_grad),
                      args=(make((2, 5, 3)), make((2, 5, 2))), name="stack_strided_q")
    if requires_grad:
        yield SampleInput(make((2, 5, 2)), args=(_make((2, 5, 2), device, dtype, False), make((2, 5, 3))),
                          name="k_no_grad")
        yield SampleInput(_make((2, 5, 2), device, dtype, False), args=(_make((2, 5, 2), device, dtype, False),
                                                                       make((2, 5, 3))), name="only_v_grad")
        yield SampleInput(make((2, 5, 2)), args=(make((2, 5, 2)), _make((2, 5, 3), device, dtype, False)),
                          name="v_no_grad")


def _o_error(sample, error_type, text):
    return ErrorInput(sample, error_type=error_type, error_regex="^" + re.escape(text) + "$")


def error_inputs_attn_o(op_info, device, **kwargs):
    """One ErrorInput per check of ``o_only.check_o_inputs``: its own messages where its stacked contract
    differs from the lab's (ndim, d, n), the contract's with fn ``attn_o`` elsewhere."""
    f32 = torch.float32

    def t(*shape, dtype=f32, dev=device):
        return torch.zeros(shape, dtype=dtype, device=dev)

    msg, contract = o_only.MESSAGES, attn_contract.message
    yield _o_error(SampleInput([[1.0]], args=(t(1, 1), t(1, 1))), TypeError,
                   contract("type", "attn_o", name="q", accepted="torch.Tensor", type="list"))
    yield _o_error(SampleInput(t(1, 1), args=(t(1, 1), 2.0)), TypeError,
                   contract("type", "attn_o", name="v", accepted="torch.Tensor", type="float"))
    yield _o_error(SampleInput(t(3), args=(t(3, 2), t(3, 4))), ValueError,
                   msg["ndim"].format(name="q", dims="..., n, d", ndim=1, shape=(3,)))
    yield _o_error(SampleInput(t(3, 2), args=(t(3, 2), t())), ValueError,
                   msg["ndim"].format(name="v", dims="..., n, e", ndim=0, shape=()))
    yield _o_error(SampleInput(t(2, 3, dtype=torch.int64), args=(t(2, 3), t(2, 4))), TypeError,
                   contract("dtype", "attn_o", name="q", dtype="int64"))
    yield _o_error(SampleInput(t(2, 3), args=(t(2, 3), t(2, 4, dtype=torch.bool))), TypeError,
                   contract("dtype", "attn_o", name="v", dtype="bool"))
    yield _o_error(SampleInput(t(2, 3), args=(t(2, 5), t(2, 4))), ValueError, msg["d"].format(q=(2, 3), k=(2, 5)))
    yield _o_error(SampleInput(t(2, 2, 3), args=(t(1, 2, 3), t(2, 2, 4))), ValueError,
                   msg["n"].format(q=(2, 2, 3), k=(1, 2, 3), v=(2, 2, 4)))
    yield _o_error(SampleInput(t(2, 3), args=(t(2, 3), t(5, 4))), ValueError,
                   msg["n"].format(q=(2, 3), k=(2, 3), v=(5, 4)))
    yield _o_error(SampleInput(t(2, 3), args=(t(2, 3, dtype=torch.float64), t(2, 4))), TypeError,
                   contract("same_dtype", "attn_o", q="float32", k="float64", v="float32"))
    other = "meta" if torch.device(device).type == "cpu" else "cpu"
    yield _o_error(SampleInput(t(2, 3), args=(t(2, 3), t(2, 4, dev=other))), ValueError,
                   contract("same_device", "attn_o", q=str(t(0).device), k=str(t(0).device), v=other))
    nested = torch.nested.nested_tensor([t(2, 3), t(1, 3)], layout=torch.jagged)
    yield _o_error(SampleInput(t(2, 2, 3), args=(nested, t(2, 2, 4))), TypeError,
                   contract("nested", "attn_o", name="k", layout="jagged"))


def _attn_o_op(causal):
    def attn_o(q, k, v):
        return torch_impl.attn_o(q, k, v, causal=causal)
    return attn_o


def _attn_o_ref(causal):
    def attn_o_reference(q, k, v):
        return o_only.attn_o_reference(q, k, v, causal=causal)
    return attn_o_reference


# float32/64, complex64/128; bfloat16 and float16 too: CPU (and CUDA) matmul and tanh support them.
DTYPES = floating_and_complex_types_and(torch.bfloat16, torch.float16)

_COMMON = dict(
    dtypes=DTYPES,
    sample_inputs_func=sample_inputs_attn,
    supports_out=False,                 # no out= overload
    supports_autograd=True,
    supports_gradgrad=True,             # backward is made of differentiable ops (formulas.attn_backward)
    supports_forward_ad=True,           # AttnFunction.jvp / formulas.attn_jvp; aten's for the composite
    supports_fwgrad_bwgrad=True,        # forward AD through the backward's aten ops
    check_batched_grad=True,            # vmap over the backward (aten batching rules of the formulas' ops)
    check_batched_gradgrad=True,
    check_batched_forward_grad=True,    # vmap over the jvp
    supports_scripting=False,           # a Python function / out-of-tree op: not TorchScript's business here
)

# The complex128 gradient checks (gradcheck, gradgradcheck, forward AD, forward over reverse: 150 s of the
# README's test command on 2 cores) run for the lab's explicit op in the default run and for the other entries in
# the slow tier (pyproject.toml), where CI runs them: every entry keeps its float64 checks by default, and the
# complex path of the formulas they share is held by attn_lab.attn's.
COMPLEX_GRADIENTS_SLOW = tuple(
    DecorateInfo(pytest.mark.slow, cls, test, dtypes=(torch.complex128,))
    for cls, test in (("TestAttnBwdGradients", "test_fn_grad"), ("TestAttnBwdGradients", "test_fn_gradgrad"),
                      ("TestAttnFwdGradients", "test_forward_mode_AD"),
                      ("TestAttnFwdGradients", "test_fn_fwgrad_bwgrad")))

attn_op_db = [
    OpInfo("torch_impl.attn", op=torch_impl.attn, ref=torch_impl.attn_reference,
           error_inputs_func=error_inputs_function, decorators=COMPLEX_GRADIENTS_SLOW, **_COMMON),
    OpInfo("attn_lab.attn_composite", op=torch.ops.attn_lab.attn_composite.default, ref=torch_impl.attn_reference,
           aten_name="attn_composite", error_inputs_func=error_inputs_op, decorators=COMPLEX_GRADIENTS_SLOW,
           **_COMMON),
    OpInfo("attn_lab.attn", op=torch.ops.attn_lab.attn.default, ref=torch_impl.attn_reference,
           aten_name="attn", error_inputs_func=error_inputs_op, **_COMMON),
    *(OpInfo("torch_impl.attn_o", variant_test_name="causal" if causal else "", op=_attn_o_op(causal),
             ref=_attn_o_ref(causal), error_inputs_func=error_inputs_attn_o,
             # gradcheck's fast mode (a random projection of each Jacobian, what PyTorch sets for its slow
             # ops): the full Jacobians of the tiled op over these samples took 6 minutes on 2 cores, the
             # complex causal gradgradcheck alone 84 s; the exact comparisons with attn_o_reference stay.
             gradcheck_fast_mode=True, decorators=COMPLEX_GRADIENTS_SLOW,
             **{**_COMMON, "sample_inputs_func": sample_inputs_attn_o})
      for causal in (False, True)),
]

# The entry point's name in its messages (attn_contract's ``fn``), per entry.
FN_NAMES = {"torch_impl.attn": "attn", "attn_lab.attn_composite": "attn", "attn_lab.attn": "attn",
            "torch_impl.attn_o": "attn_o"}
