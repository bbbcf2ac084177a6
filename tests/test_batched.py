"""The batched path (issue 10): ``torch.vmap`` of ``torch_impl.attn`` and of ``torch.ops.attn_lab.attn``,
nested vmap (batch x heads), and ``BatchedAttnFunction`` itself.

Under vmap both entry points validate one example with the 2-D contract and apply ``BatchedAttnFunction``
to the 3-D stack, so autograd *outside* the vmap differentiates with ``formulas.attn_backward`` on the whole
stack (one autograd node) instead of per-example batching rules.  Here: values and gradients against the
3-D reference (first and second order, forward AD, gradcheck), that the hand-written formulas are what
runs, validation messages, inputs left alone.  The buffer counts are in tests/test_function.py.
"""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch
from torch.autograd import forward_ad as fwAD
from torch.autograd import gradcheck, gradgradcheck
from torch.func import vmap
from torch.testing import assert_close

import torch_impl
from torch_impl import formulas
from torch_impl.validation import MESSAGES

OP = torch.ops.attn_lab.attn.default


def reference_3d(q, k, v):
    """``a = tanh(q @ k.mT); o = a @ v`` on stacks, differentiated by autograd (the issue's batched reference)."""
    a = torch.tanh(q @ k.mT)
    return a @ v, a


def nested(fn):
    """vmap over batch and heads: (B, H, n, ·) inputs."""
    return vmap(vmap(fn))


ENTRY = {
    "vmap_attn": (lambda *x: vmap(torch_impl.attn)(*x), 1),
    "vmap_op": (lambda *x: vmap(OP)(*x), 1),
    "vmap_vmap_attn": (lambda *x: nested(torch_impl.attn)(*x), 2),
    "vmap_vmap_op": (lambda *x: nested(OP)(*x), 2),
    "batched_function": (lambda *x: torch_impl.BatchedAttnFunction.apply(*x), 1),
}


def make(batch, n, d, e, dtype=torch.float64, requires_grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in ((n, d), (n, d), (n, e)):
        t = torch.randn(*batch, *s, generator=g, dtype=torch.float64)
        if dtype.is_complex:
            t = torch.complex(t, torch.randn(*batch, *s, generator=g, dtype=torch.float64))
        out.append(t.to(dtype).requires_grad_(requires_grad))
    return out


def loss(o, a):
    return o.sin().sum().abs() + (a * a.conj()).real.sum() + (a * 0.3).sum().abs()


def batch_of(name):
    return (3,) if ENTRY[name][1] == 1 else (2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("name", list(ENTRY))
def test_values_and_gradients_match_3d_reference(name, dtype):
    fn = ENTRY[name][0]
    for n, d, e in ((4, 3, 5), (1, 1, 1), (6, 2, 2)):
        results = []
        for f in (fn, reference_3d):
            inputs = make(batch_of(name), n, d, e, dtype=dtype)
            out = f(*inputs)
            results.append((tuple(out), torch.autograd.grad(loss(*out), inputs)))
        assert_close(*results)


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_op", "vmap_vmap_attn"])
def test_one_batched_backward_call_of_the_formulas(name):
    """Autograd outside the vmap calls formulas.attn_backward once, on the whole 3-D stack (before the
    hand-written rule, the generated one called it with per-example BatchedTensors)."""
    fn = ENTRY[name][0]
    inputs = make(batch_of(name), 4, 3, 5)
    with mock.patch.object(formulas, "attn_backward", wraps=formulas.attn_backward) as spy:
        torch.autograd.grad(loss(*fn(*inputs)), inputs)
    assert spy.call_count == 1
    grad_o, grad_a, q, k, v, a, mask = spy.call_args.args
    assert grad_o.shape == (6, 4, 5) if name.startswith("vmap_vmap") else grad_o.shape == (3, 4, 5)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(grad_o)


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_op", "vmap_vmap_attn"])
def test_double_backward_and_forward_ad_match_3d_reference(name):
    fn = ENTRY[name][0]
    hvps, jvps = [], []
    for f in (fn, reference_3d):
        inputs = make(batch_of(name), 4, 3, 5, dtype=torch.complex128)
        grads = torch.autograd.grad(loss(*f(*inputs)), inputs, create_graph=True)
        hvps.append(torch.autograd.grad(sum((g.abs() ** 2).sum() for g in grads), inputs))
        tangents = make(batch_of(name), 4, 3, 5, dtype=torch.complex128, requires_grad=False, seed=1)
        with fwAD.dual_level():
            o, a = f(*(fwAD.make_dual(t.detach(), dt) for t, dt in zip(inputs, tangents)))
            jvps.append((fwAD.unpack_dual(o).tangent, fwAD.unpack_dual(a).tangent))
    assert_close(*hvps)
    assert_close(*jvps)


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_op", "vmap_vmap_attn", "batched_function"])
def test_gradcheck_batched(name):
    fn = ENTRY[name][0]
    inputs = make(batch_of(name), 3, 2, 2)
    assert gradcheck(fn, inputs, check_forward_ad=True, check_batched_grad=True)
    assert gradgradcheck(fn, inputs, check_fwd_over_rev=True)


@pytest.mark.parametrize("fn", [torch_impl.attn, OP], ids=["attn", "op"])
def test_in_dims_none_and_batch_dim_not_first(fn):
    q, k, v = make((3,), 4, 2, 5)
    o, a = vmap(fn, in_dims=(2, None, 0))(q.movedim(0, 2), k[0], v)
    want = reference_3d(q, k[0].expand(3, 4, 2), v)
    assert_close((o, a), want)
    got = torch.autograd.grad(loss(o, a), (q, k, v))
    assert_close(got, torch.autograd.grad(loss(*want), (q, k, v)))


@pytest.mark.parametrize("name", list(ENTRY)[:4])
def test_validation_is_per_example_with_2d_messages(name):
    fn = ENTRY[name][0]
    batch = batch_of(name)
    q, k, v = make(batch, 2, 3, 4)
    with pytest.raises(ValueError, match="^" + re.escape(MESSAGES["d"].format(q=(2, 3), k=(2, 2))) + "$"):
        fn(q, k[..., :2], v)
    msg = MESSAGES["n"].format(q=(2, 3), k=(2, 3), v=(3, 4))
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        fn(q, k, torch.zeros(*batch, 3, 4, dtype=q.dtype))
    with pytest.raises(ValueError, match=re.escape("argument 'q' must be 2-D (n, d), got 3-D with shape (2, 2, 3)")):
        fn(q.unsqueeze(-3).expand(*batch, 2, 2, 3), k, v)


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_op", "vmap_vmap_attn"])
def test_inputs_and_incoming_gradients_never_modified(name):
    fn = ENTRY[name][0]
    inputs = make(batch_of(name), 4, 3, 5)
    before = [t.detach().clone() for t in inputs]
    versions = [t._version for t in inputs]
    o, a = fn(*inputs)
    go, ga = torch.randn_like(o), torch.randn_like(a)
    keep = go.clone(), ga.clone()
    torch.autograd.backward((o, a), (go, ga))
    assert torch.equal(go, keep[0]) and torch.equal(ga, keep[1])
    for t, b, ver in zip(inputs, before, versions):
        assert torch.equal(t.detach(), b) and t._version == ver
    # only a reaches the loss: (10) must not run in place on autograd's G_A
    o, a = fn(*inputs)
    torch.autograd.backward(a, ga)
    assert torch.equal(ga, keep[1])


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", ["vmap_attn", "vmap_op", "vmap_vmap_attn"])
def test_inference(name, mode):
    fn = ENTRY[name][0]
    inputs = make(batch_of(name), 4, 3, 5, requires_grad=False)
    with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
        got = fn(*inputs)
    assert_close(tuple(got), reference_3d(*inputs))


def test_empty_batch_and_sizes():
    for batch, (n, d, e) in (((0,), (2, 3, 4)), ((3,), (0, 2, 2)), ((2,), (3, 0, 2)), ((2,), (3, 2, 0))):
        inputs = make(batch, n, d, e)
        for name in ("vmap_attn", "vmap_op"):
            o, a = ENTRY[name][0](*inputs)
            assert (o.shape, a.shape) == ((*batch, n, e), (*batch, n, n))
            grads = torch.autograd.grad((o.sum() + a.sum()), inputs, allow_unused=True, materialize_grads=True)
            assert [g.shape for g in grads] == [t.shape for t in inputs]


def test_transforms_inside_and_outside_the_vmap():
    """Per-example gradients (vmap of grad), grad of vmap, and jacrev of vmap agree with the reference."""
    q, k, v = make((3,), 2, 3, 4, requires_grad=False)
    scalar = lambda f: lambda *x: loss(*f(*x))  # noqa: E731
    for fn in (torch_impl.attn, OP):
        assert_close(vmap(torch.func.grad(scalar(fn), argnums=(0, 1, 2)))(q, k, v),
                     vmap(torch.func.grad(scalar(torch_impl.attn_reference), argnums=(0, 1, 2)))(q, k, v))
        assert_close(torch.func.grad(scalar(vmap(fn)), argnums=(0, 1, 2))(q, k, v),
                     torch.func.grad(scalar(reference_3d), argnums=(0, 1, 2))(q, k, v))
        assert_close(torch.func.jacrev(lambda *x: tuple(vmap(fn)(*x)))(q, k, v),
                     torch.func.jacrev(lambda *x: tuple(reference_3d(*x)))(q, k, v))


def test_autocast_batched():
    q, k, v = make((2,), 3, 4, 5, dtype=torch.float32)
    results = []
    for f in (vmap(torch_impl.attn), reference_3d):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            o, a = f(*inputs)
        results.append(((o, a), torch.autograd.grad(loss(o.float(), a.float()), inputs)))
    (outs, grads), (ref_outs, ref_grads) = results
    assert [t.dtype for t in outs] == [torch.bfloat16] * 2 and [g.dtype for g in grads] == [torch.float32] * 3
    # bfloat16 resolution, as in test_ops.test_cpu_autocast_matches_reference
    assert_close(outs, ref_outs, rtol=2e-2, atol=2e-2)
    assert_close(grads, ref_grads, rtol=5e-2, atol=5e-2)


# ----------------------------------------------------------------- the direct vmap path (function._vmap_direct)
class _Recorder:
    """Wraps a function and keeps what each call returned (``unittest.mock`` in Python 3.11 does not)."""

    def __init__(self, fn):
        self.fn, self.args, self.returns = fn, [], []

    def __call__(self, *args, **kwargs):
        self.args.append(args)
        self.returns.append(self.fn(*args, **kwargs))
        return self.returns[-1]


def _spy_paths():
    """Spies on the two ways ``vmap(attn)`` can reach the formulas: the direct path (its returns: ``None`` =
    declined) and functorch's ``custom_function_call`` -> ``AttnFunction.vmap`` -> ``attn_vmap``."""
    return (mock.patch.object(torch_impl.function, "_vmap_direct", _Recorder(torch_impl.function._vmap_direct)),
            mock.patch.object(torch_impl.function, "attn_vmap", _Recorder(torch_impl.function.attn_vmap)))


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_vmap_attn"])
def test_only_vmaps_on_the_stack_take_the_direct_path(name):
    """Under vmap alone (nested or not) attn skips functorch's per-call glue; its result is the same one
    BatchedAttnFunction node the general path builds."""
    inputs = make(batch_of(name), 4, 3, 5)
    direct, general = _spy_paths()
    with direct as d, general as g:
        o, a = ENTRY[name][0](*inputs)
    assert len(d.returns) == 1 and d.returns[0] is not None and not g.returns
    nodes, todo = [], [o.grad_fn, a.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in nodes:
            nodes.append(node)
            todo += [f for f, _ in node.next_functions]
    names = sorted(type(n).__name__ for n in nodes)
    assert names.count("BatchedAttnFunctionBackward") == 1, names
    assert not torch._C._are_functorch_transforms_active()      # every popped level was pushed back


@pytest.mark.parametrize("transform", ["grad_of_vmap", "vmap_of_grad", "jvp_of_vmap"])
def test_other_transforms_take_the_general_path(transform):
    """With a grad or jvp level on functorch's stack, the direct path declines (it would differentiate at
    the wrong level) and custom_function_call runs the vmap rule; the values agree with the reference."""
    q, k, v = make((3,), 2, 3, 4, requires_grad=False)
    scalar = lambda f: lambda *x: loss(*f(*x))  # noqa: E731
    run = {
        "grad_of_vmap": lambda f, f3: torch.func.grad(scalar(vmap(f) if f3 is None else f3), argnums=(0, 1, 2))(q, k, v),
        "vmap_of_grad": lambda f, f3: vmap(torch.func.grad(scalar(f), argnums=(0, 1, 2)))(q, k, v),
        "jvp_of_vmap": lambda f, f3: tuple(tuple(out) for out in
                                           torch.func.jvp(vmap(f) if f3 is None else f3, (q, k, v), (q, k, v))),
    }[transform]
    direct, general = _spy_paths()
    with direct as d, general as g:
        got = run(torch_impl.attn, None)
    assert d.returns and all(r is None for r in d.returns) and g.returns
    want = run(torch_impl.attn_reference, None if transform == "vmap_of_grad" else reference_3d)
    assert_close(got, want)


def test_direct_path_with_mixed_in_dims_across_levels():
    """Nested vmap where each level batches a different subset of the inputs, at different positions: q is
    batched by the outer level only, k by the inner only (at dim 1), v by both; and an outer level that
    batches none of attn's inputs (only the scale) is skipped, not computed B times."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)      # (outer=2, n, d)
    k = torch.randn(4, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)      # (n, inner=3, d)
    v = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)   # (outer, inner, n, e)
    direct, general = _spy_paths()
    with direct as d, general as g:
        o, a = vmap(lambda q1, v1: vmap(torch_impl.attn, in_dims=(None, 1, 0))(q1, k, v1))(q, v)
    assert len(d.returns) == 1 and d.returns[0] is not None and not g.returns
    q4, k4 = q[:, None].expand(2, 3, 4, 3), k.movedim(1, 0)[None].expand(2, 3, 4, 3)
    want = reference_3d(q4, k4, v)
    assert_close((o, a), want)
    assert_close(torch.autograd.grad(loss(o, a), (q, k, v)), torch.autograd.grad(loss(*want), (q, k, v)))

    q3, k3, v3 = make((3,), 4, 3, 5)
    scale = torch.arange(1.0, 3.0, dtype=torch.float64)
    stacks = _Recorder(torch_impl.function._apply_batched)
    with mock.patch.object(torch_impl.function, "_apply_batched", stacks):
        out = vmap(lambda s: vmap(torch_impl.attn)(q3, k3, v3)[0] * s)(scale)
    assert [tuple(t.shape) for t in stacks.args[0]] == [(3, 4, 3), (3, 4, 3), (3, 4, 5)]   # not (6, ...)
    assert_close(out, reference_3d(q3, k3, v3)[0] * scale[:, None, None, None])


def test_direct_path_restores_functorch_state_after_an_error():
    """A bad example raises the 2-D contract's error before any level is popped; an error raised while the
    levels are popped (inside the formulas) reaches the caller unchanged, and the popped levels are pushed
    back (without that, functorch reports an internal assert instead); later vmaps work."""
    q, k, v = make((2,), 3, 4, 5)
    with pytest.raises(ValueError, match="same second dimension d"):
        vmap(vmap(torch_impl.attn))(q[None], k[None, ..., :2], v[None])
    assert not torch._C._are_functorch_transforms_active()

    class Boom(Exception):
        pass

    def boom(*args):
        raise Boom("raised with the vmap levels popped")

    with mock.patch.object(formulas, "attn_forward", boom), pytest.raises(Boom):
        vmap(vmap(torch_impl.attn))(q[None], k[None], v[None])
    assert not torch._C._are_functorch_transforms_active()
    assert_close(tuple(vmap(vmap(torch_impl.attn))(q[None], k[None], v[None])),
                 tuple(t[None] for t in reference_3d(q, k, v)))


@pytest.mark.parametrize("fn", [torch_impl.attn, OP], ids=["attn", "op"])
def test_compile_of_vmap_with_inputs_that_require_grad(fn):
    """torch.compile(vmap(attn)) traces the op's batching rule under FakeTensor, where a Function cannot be
    applied from inside the rule (FakeTensor asserts on detach); the rule then emits the batched aten ops
    (1)-(3), which AOTAutograd differentiates.  Values and gradients match the 3-D reference."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda *x: tuple(vmap(fn)(*x)), backend="aot_eager", fullgraph=True)
    inputs = make((3,), 4, 3, 5)
    got = compiled(*inputs)
    want = reference_3d(*inputs)
    assert_close(got, want)
    assert_close(torch.autograd.grad(loss(*got), inputs), torch.autograd.grad(loss(*want), inputs))
