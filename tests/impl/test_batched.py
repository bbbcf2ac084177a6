"""The batched path: ``torch.vmap`` of ``torch_impl.attn`` and of ``torch.ops.attn_lab.attn``, nested vmap
(batch x heads), and ``AttnFunction`` applied to stacks.

Under vmap both entry points validate one example with the 2-D contract.  ``AttnFunction``'s vmap rule applies
the Function to the 3-D stack, so autograd *outside* the vmap differentiates with ``formulas.attn_backward`` on
the whole stack (one autograd node); the operator's rule runs the formulas' aten ops (see torch_impl.ops).  Here:
values and gradients against the 3-D reference (first and second order, forward AD, gradcheck), that the
hand-written formulas are what runs, validation messages, inputs left alone.  The buffer counts are in
tests/impl/test_function.py.
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
from torch_impl import formulas, performance
from torch_impl.validation import message
from tests.conftest import attn_inputs

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
    "function_on_stacks": (lambda *x: torch_impl.AttnFunction.apply(*x), 1),
}


def make(batch, n, d, e, dtype=torch.float64, requires_grad=True, seed=0):
    return attn_inputs(n, d, e, dtype, batch=batch, requires_grad=requires_grad, seed=seed)


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


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_vmap_attn"])
def test_one_batched_backward_call_of_the_formulas(name, monkeypatch):
    """Autograd outside the vmap runs the backward's math once, on the whole 3-D stack (a generated vmap rule
    would call it with per-example BatchedTensors), with (10) in place.  Not the operator: its rule runs aten ops."""
    monkeypatch.setattr(performance, "IN_PLACE_FROM_BYTES", 0)   # in place at this test's small size too
    fn = ENTRY[name][0]
    inputs = make(batch_of(name), 4, 3, 5)
    with mock.patch.object(performance, "attn_backward", wraps=performance.attn_backward) as spy, \
            mock.patch.object(formulas, "tanh_vjp", wraps=formulas.tanh_vjp) as tanh_spy:
        torch.autograd.grad(loss(*fn(*inputs)), inputs)
    assert spy.call_count == 1
    grad_o = spy.call_args.args[0]
    assert grad_o.shape == (6, 4, 5) if name.startswith("vmap_vmap") else grad_o.shape == (3, 4, 5)
    # plain tensors in a plain backward: (10) writes over (9)'s buffer (internals.may_write_in_place)
    assert tanh_spy.call_count == 1 and tanh_spy.call_args.kwargs.get("out") is tanh_spy.call_args.args[0]


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


@pytest.mark.parametrize("name", ["vmap_attn", "vmap_op", "vmap_vmap_attn", "function_on_stacks"])
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
    with pytest.raises(ValueError, match="^" + re.escape(message("d", q=(2, 3), k=(2, 2))) + "$"):
        fn(q, k[..., :2], v)
    msg = message("n", q=(2, 3), k=(2, 3), v=(3, 4))
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


@pytest.mark.parametrize("fn", [torch_impl.attn, OP], ids=["attn", "op"])
def test_compile_of_vmap_with_inputs_that_require_grad(fn):
    """torch.compile(vmap(attn)) traces the op's batching rule under FakeTensor, where a Function cannot be
    applied from inside the rule (FakeTensor asserts on detach); the rule then emits the batched aten ops
    (1)-(3), which AOTAutograd differentiates.  Values and gradients match the 3-D reference."""
    torch.compiler.reset()
    compiled = torch.compile(lambda *x: tuple(vmap(fn)(*x)), backend="aot_eager", fullgraph=True)
    inputs = make((3,), 4, 3, 5)
    got = compiled(*inputs)
    want = reference_3d(*inputs)
    assert_close(got, want)
    assert_close(torch.autograd.grad(loss(*got), inputs), torch.autograd.grad(loss(*want), inputs))
