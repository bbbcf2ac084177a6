"""torch_impl/internals.py: the private PyTorch APIs the package uses, and what happens on a torch without them.

Each question ``internals`` answers has a fallback for a torch where the private API is missing or changed.
Here the APIs are removed by monkeypatching, and every entry point must still give the reference's numbers
(a slower path) or a clear error (a refused path), never a crash inside PyTorch or a wrong number.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad
from torch.func import hessian, jacfwd, jacrev, vmap
from torch.testing import assert_close

import torch_impl
from torch_impl import internals
from tests.conftest import attn_inputs, loss

OP = torch.ops.attn_lab.attn.default
ENTRY_POINTS = {"attn": torch_impl.attn, "explicit": OP, "composite": torch.ops.attn_lab.attn_composite.default}


def make(seed=0):
    return attn_inputs(3, 2, 4, seed=seed)


def scalar(fn, k, v):
    return lambda q: loss(*fn(q, k, v))


def test_the_private_apis_exist_on_this_torch():
    """Every torch of the CI matrix has them: the fallbacks below are for a future torch."""
    assert internals.CAN_CHECK_WRAPPERS and internals.CAN_SEE_LEVELS


def test_transforms_active_and_nested_forward_levels():
    NO, YES = internals.Answer.NO, internals.Answer.YES
    assert internals.transforms_active() is NO and internals.nested_forward_levels() is NO
    seen = []

    def probe(x):
        seen.append((internals.transforms_active(), internals.nested_forward_levels()))
        return x.sin()

    jacfwd(probe)(torch.ones(2))
    jacfwd(jacfwd(probe))(torch.ones(2))
    vmap(probe)(torch.ones(2, 2))
    assert seen == [(YES, NO), (YES, YES), (YES, NO)]


def test_explicit_op_uses_the_function_in_plain_autograd_and_aten_ops_under_torch_func():
    q, k, v = make()
    q.requires_grad_()
    o, a = OP(q, k, v)
    assert type(o.grad_fn).__name__ == "AttnFunctionBackward"
    names = []
    torch.func.grad(lambda q: names.append(type(OP(q, k, v)[0].grad_fn).__name__) or OP(q, k, v)[0].sum())(
        q.detach())
    assert names and names[0] != "AttnFunctionBackward", names


@pytest.fixture
def no_private_apis(monkeypatch):
    """A torch where ``torch._C._functorch`` lacks everything ``internals`` asks."""
    monkeypatch.setattr(internals, "CAN_CHECK_WRAPPERS", False)
    monkeypatch.setattr(internals, "CAN_SEE_LEVELS", False)


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_without_private_apis_reverse_mode_is_still_right(name, no_private_apis):
    fn = ENTRY_POINTS[name]
    q, k, v = make()
    want = hessian(scalar(torch_impl.attn_reference, k, v))(q)
    assert_close(jacrev(jacrev(scalar(fn, k, v)))(q), want)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    assert_close(torch.autograd.grad(loss(*fn(*inputs)), inputs),
                 torch.autograd.grad(loss(*torch_impl.attn_reference(*inputs)), inputs))
    assert_close(tuple(t[0] for t in vmap(fn)(*(t[None] for t in (q, k, v)))),
                 tuple(torch_impl.attn_reference(q, k, v)))


@pytest.mark.parametrize("name", ["explicit", "composite"])
def test_without_private_apis_the_operators_forward_ad_is_still_right(name, no_private_apis):
    """The explicit op then always runs its formulas' aten ops (the composite always does)."""
    fn = ENTRY_POINTS[name]
    primals, tangents = make(), make(seed=1)
    results = []
    for f in (fn, torch_impl.attn_reference):
        with forward_ad.dual_level():
            out = f(*(forward_ad.make_dual(p, t) for p, t in zip(primals, tangents)))
            results.append([forward_ad.unpack_dual(t).tangent for t in out])
    assert_close(*results)


def test_without_private_apis_the_function_refuses_forward_mode(no_private_apis):
    """Two forward levels cannot be told from one: AttnFunction.jvp refuses forward mode (a clear error naming
    the way out), where it would otherwise risk jacfwd(jacfwd)'s wrong second derivative.  The operators are
    aten ops there and stay right."""
    q, k, v = make()
    for transform in (jacfwd, hessian):
        with pytest.raises(NotImplementedError, match="does not let torch_impl see its torch.func levels"):
            transform(scalar(torch_impl.attn, k, v))(q)
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="attn_composite, or reverse mode"):
        torch_impl.attn(forward_ad.make_dual(q, torch.ones_like(q)), k, v)
    for fn in (OP, torch.ops.attn_lab.attn_composite.default):
        assert_close(jacfwd(jacfwd(scalar(fn, k, v)))(q), hessian(scalar(torch_impl.attn_reference, k, v))(q))


def test_without_wrapper_checks_no_write_is_in_place(no_private_apis):
    t = torch.empty(2, 2)
    with torch.no_grad():
        assert not internals.may_write_in_place(t)
