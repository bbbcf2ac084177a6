"""AttnFunction / torch_impl.attn: lab part II.

gradcheck and gradgradcheck (finite differences) are the lab's checks; exact-autodiff comparisons against
``attn_reference`` and the efficiency contract (what is saved, what is allocated, what is computed) are
checked here too.  crosscheck/ adds torch.func and JAX oracles on top.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from torch.autograd import forward_ad, gradcheck, gradgradcheck
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

import torch_impl
from torch_impl import formulas, internals, performance
from torch_impl.validation import MESSAGES
from tests.conftest import attn_inputs

# (n, d, e): unit sizes, non-square d != e, n larger and smaller than d.
SHAPES = [(1, 1, 1), (1, 3, 2), (3, 1, 1), (2, 1, 3), (4, 3, 5), (5, 2, 2)]
GRAD_DTYPES = [torch.float64, torch.complex128]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


make_inputs = functools.partial(attn_inputs, requires_grad=True)


def grads_of(fn, inputs, loss):
    """Gradients of a scalar loss of fn's (o, a) w.r.t. the inputs that require grad (None where not)."""
    leaves = [t for t in inputs if t.requires_grad]
    value = loss(*fn(*inputs))
    if not value.requires_grad:  # e.g. an a-only loss with only v requiring grad: a does not depend on v
        return [None] * len(inputs)
    got = torch.autograd.grad(value, leaves, allow_unused=True)
    it = iter(got)
    return [next(it) if t.requires_grad else None for t in inputs]


# Scalar losses using o only, a only, or both, with fixed non-trivial weights so that a wrong term cannot cancel.
# The weights are deterministic (no RNG) so the losses can run inside torch.func transforms.
def _weight(like, seed):
    idx = torch.arange(like.numel(), dtype=torch.float64, device=like.device).reshape(like.shape)
    w = torch.cos(1.7 * idx + seed) + 0.5
    if like.is_complex():
        w = torch.complex(w, torch.sin(0.9 * idx - seed))
    return w.to(like.dtype)


def _weights(o, a, seed):
    return _weight(o, seed), _weight(a, seed + 10)


def loss_o(o, a):
    wo, _ = _weights(o, a, 1)
    return (o * wo).sum().abs()


def loss_a(o, a):
    _, wa = _weights(o, a, 2)
    return (a * wa).sum().abs()


def loss_both(o, a):
    wo, wa = _weights(o, a, 3)
    return ((o * wo).sum() + (a * wa).sum()).abs()


LOSSES = {"o_only": loss_o, "a_only": loss_a, "both": loss_both}


# ---------------------------------------------------------------------------------------------------------
# gradcheck / gradgradcheck (finite differences; PyTorch's complex convention is what gradcheck checks)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n%d_d%d_e%d" % s)
def test_gradcheck(shape, dtype, fast_mode):
    inputs = make_inputs(*shape, dtype=dtype)
    assert gradcheck(torch_impl.attn, inputs, fast_mode=fast_mode, check_forward_ad=True,
                     check_batched_grad=True, check_batched_forward_grad=True)


@pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 1, 3), (4, 3, 5)], ids=lambda s: "n%d_d%d_e%d" % s)
def test_gradgradcheck(shape, dtype, fast_mode):
    inputs = make_inputs(*shape, dtype=dtype)
    assert gradgradcheck(torch_impl.attn, inputs, fast_mode=fast_mode, check_fwd_over_rev=True,
                         check_batched_grad=True)


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("mask", [m for m in itertools.product([True, False], repeat=3) if any(m)],
                         ids=lambda m: "".join(n if r else "_" for n, r in zip("qkv", m)))
def test_gradcheck_each_subset_requiring_grad(mask, dtype):
    inputs = make_inputs(3, 2, 4, dtype=dtype, requires_grad=mask)
    assert gradcheck(torch_impl.attn, inputs, check_forward_ad=True)
    assert gradgradcheck(torch_impl.attn, inputs)


@pytest.mark.parametrize("output", ["o", "a"])
def test_gradcheck_single_output(output):
    """Only one output reaches the loss: the other output's gradient is None inside backward."""
    inputs = make_inputs(3, 2, 4)
    fn = lambda q, k, v: getattr(torch_impl.attn(q, k, v), output)  # noqa: E731
    assert gradcheck(fn, inputs, check_forward_ad=True)
    assert gradgradcheck(fn, inputs)


# ---------------------------------------------------------------------------------------------------------
# Exact agreement with autograd of the reference composite
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128], ids=str)
def test_forward_matches_reference(dtype, device):
    for shape in SHAPES + [(64, 16, 8)]:
        q, k, v = make_inputs(*shape, dtype=dtype, device=device, requires_grad=(False,) * 3)
        got, want = torch_impl.attn(q, k, v), torch_impl.attn_reference(q, k, v)
        assert isinstance(got, torch_impl.AttnOutput)
        assert_close(got.o, want.o)
        assert_close(got.a, want.a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss", LOSSES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128], ids=str)
def test_gradients_match_reference(dtype, loss, device):
    for shape in SHAPES + [(33, 7, 5)]:
        for mask in [(True, True, True), (True, False, False), (False, True, False), (False, False, True)]:
            inputs = make_inputs(*shape, dtype=dtype, device=device, requires_grad=mask)
            got = grads_of(torch_impl.attn, inputs, LOSSES[loss])
            want = grads_of(torch_impl.attn_reference, inputs, LOSSES[loss])
            for g, w in zip(got, want):
                if w is None:
                    # Either the input does not require grad, or the loss does not depend on it (v with an
                    # a-only loss): the hand-written backward must not invent a gradient either.
                    assert g is None or not g.abs().any()
                else:
                    assert_close(g, w)


def test_double_backward_matches_reference():
    """Hessian-vector products through create_graph=True, compared with autograd of the reference."""
    for dtype in GRAD_DTYPES:
        inputs = make_inputs(4, 3, 5, dtype=dtype)
        hvps = []
        for fn in (torch_impl.attn, torch_impl.attn_reference):
            gs = torch.autograd.grad(loss_both(*fn(*inputs)), inputs, create_graph=True)
            s = sum((g.abs() ** 2).sum() for g in gs)
            hvps.append(torch.autograd.grad(s, inputs))
        for g, w in zip(*hvps):
            assert_close(g, w)


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd", "hessian", "vmap"])
def test_torch_func_transforms(transform):
    q, k, v = make_inputs(3, 2, 4, requires_grad=(False,) * 3)
    if transform == "vmap":
        batched = [torch.randn(5, *t.shape, dtype=t.dtype) for t in (q, k, v)]
        got = torch.func.vmap(torch_impl.attn)(*batched)
        want = torch.func.vmap(torch_impl.attn_reference)(*batched)
    else:
        tr = getattr(torch.func, transform)
        scalar = lambda f: lambda q, k, v: loss_both(*f(q, k, v))  # noqa: E731
        got = tr(scalar(torch_impl.attn), argnums=(0, 1, 2))(q, k, v)
        want = tr(scalar(torch_impl.attn_reference), argnums=(0, 1, 2))(q, k, v)
    torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------------------------------
# The efficiency contract of the backward
# ---------------------------------------------------------------------------------------------------------

class _BackwardSpy:
    """Records the arguments the backward's math receives from ``AttnFunction.backward`` and what it returns:
    ``performance.attn_backward``, which runs the formulas in place or as written (looked up at call time)."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = performance.attn_backward

        def spy(grad_o, grad_a, q, k, v, a, output_mask):
            result = real(grad_o, grad_a, q, k, v, a, output_mask)
            self.calls.append(dict(grad_o=grad_o, grad_a=grad_a, saved=(q, k, v), mask=tuple(output_mask),
                                   result=result))
            return result

        monkeypatch.setattr(performance, "attn_backward", spy)


@pytest.mark.parametrize("loss", LOSSES, ids=str)
def test_absent_output_gradient_is_none_not_zeros(loss, monkeypatch):
    spy = _BackwardSpy(monkeypatch)
    inputs = make_inputs(3, 2, 4)
    grads_of(torch_impl.attn, inputs, LOSSES[loss])
    (call,) = spy.calls
    assert (call["grad_o"] is None) == (loss == "a_only")
    assert (call["grad_a"] is None) == (loss == "o_only")


@pytest.mark.parametrize("mask", [m for m in itertools.product([True, False], repeat=3) if any(m)],
                         ids=lambda m: "".join(n if r else "_" for n, r in zip("qkv", m)))
def test_only_needed_gradients_computed_and_saved(mask, monkeypatch):
    spy = _BackwardSpy(monkeypatch)
    inputs = make_inputs(3, 2, 4, requires_grad=mask)
    grads_of(torch_impl.attn, inputs, loss_both)
    (call,) = spy.calls
    assert call["mask"] == mask
    for needed, grad in zip(mask, call["result"]):
        assert (grad is not None) == needed
    need_q, need_k, _ = mask
    q, k, v = call["saved"]
    # k is read only by G_Q (11), q only by G_K (12), v only by G_O Vᴴ (9) which only feeds G_Q / G_K.
    assert (q is not None) == need_k
    assert (k is not None) == need_q
    assert (v is not None) == (need_q or need_k)


def test_saved_tensors_are_inputs_and_output_a_never_x():
    q, k, v = make_inputs(6, 3, 2)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, a = torch_impl.attn(q, k, v)
    ptrs = sorted(t.data_ptr() for t in saved)
    assert ptrs == sorted(t.data_ptr() for t in (q, k, v, a))
    # The reference saves (at least) as much: the counter above is not vacuous.
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch_impl.attn_reference(q, k, v)
    assert sum(t.numel() for t in saved) >= q.numel() + k.numel() + v.numel() + a.numel()


class _NewSquareBuffers(TorchDispatchMode):
    """Counts n×n buffers in op outputs whose storage is new (not an input's, i.e. not in-place / out=): a
    ``(n, n)`` output counts 1, a stack ``(B, n, n)`` counts B (one per example of the batched path)."""

    def __init__(self, n):
        super().__init__()
        self.n, self.count = n, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        in_ptrs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if (isinstance(t, torch.Tensor) and tuple(t.shape[-2:]) == (self.n, self.n) and t.dim() <= 3
                    and t.untyped_storage().data_ptr() not in in_ptrs):
                self.count += t.numel() // (self.n * self.n)
        return out


@pytest.mark.parametrize("loss", LOSSES, ids=str)
def test_backward_allocates_at_most_one_square_buffer(loss):
    n = math.isqrt(performance.IN_PLACE_FROM_BYTES // 4)      # float32: the smallest a written in place (256)
    results = {}
    for fn in (torch_impl.attn, torch_impl.attn_reference):
        inputs = make_inputs(n, 3, 5, dtype=torch.float32)
        out = fn(*inputs)
        # The output gradients are what autograd hands in: make them first, outside the counter.
        out_grads = torch.autograd.grad(LOSSES[loss](*out), out, allow_unused=True, retain_graph=True)
        used = [(t, g) for t, g in zip(out, out_grads) if g is not None]
        with _NewSquareBuffers(n) as counter:
            torch.autograd.grad([t for t, _ in used], inputs, [g for _, g in used], allow_unused=True)
        results[fn.__name__] = counter.count
    assert results["attn"] <= 1, results
    if loss == "both":
        # Plain autograd needs G_O Vᵀ, the sum with G_A, and the tanh_backward output: proves the counter counts.
        assert results["attn_reference"] >= 3, results


def _stacked_inputs(batch, n, d, e, dtype, requires_grad=(True, True, True)):
    """``make_inputs`` reshaped to stacks ``(*batch, n, ·)`` (leaves, so autograd can differentiate them)."""
    flat = make_inputs(math.prod(batch) * n, d, e, dtype=dtype, requires_grad=(False,) * 3)
    return [t.reshape(*batch, n, -1).requires_grad_(rg) for t, rg in zip(flat, requires_grad)]


def _batched_entry_points():
    ref3 = lambda q, k, v: (lambda a: (a @ v, a))(torch.tanh(q @ k.mT))  # noqa: E731  the 3-D reference
    return {"vmap_attn": torch.func.vmap(torch_impl.attn),
            "vmap_op": torch.func.vmap(torch.ops.attn_lab.attn.default),
            # batch x heads: the outer vmap folds into the stack of the inner one
            "vmap_vmap_attn": lambda *x: torch.func.vmap(torch.func.vmap(torch_impl.attn))(
                *(t.unflatten(0, (2, -1)) for t in x)),
            "reference_3d": ref3}


@pytest.mark.parametrize("loss", LOSSES, ids=str)
@pytest.mark.parametrize("entry", ["vmap_attn", "vmap_vmap_attn"])
def test_batched_backward_allocates_at_most_one_square_buffer_per_example(entry, loss):
    """The batched path (torch.vmap of attn, nested vmap) keeps the 2-D buffer discipline: one new n×n
    buffer per example in backward, where the 3-D reference allocates three.  (Not the explicit operator:
    its vmap rule runs the formulas' aten ops, differentiated like the reference; see torch_impl.ops.)"""
    batch = 4
    n = math.isqrt(performance.IN_PLACE_FROM_BYTES // (4 * batch))   # the stack written in place: float32 (4, 128, 128)
    counts = {}
    for name in (entry, "reference_3d"):
        fn = _batched_entry_points()[name]
        inputs = _stacked_inputs((batch,), n, 3, 5, torch.float32)
        out = fn(*inputs)
        if name.startswith("vmap_vmap"):
            out = [t.flatten(0, 1) for t in out]
        out_grads = torch.autograd.grad(LOSSES[loss](*out), out, allow_unused=True, retain_graph=True)
        used = [(t, g) for t, g in zip(out, out_grads) if g is not None]
        with _NewSquareBuffers(n) as counter:
            torch.autograd.grad([t for t, _ in used], inputs, [g for _, g in used], allow_unused=True)
        counts[name] = counter.count
    assert counts[entry] <= batch, counts
    if loss == "both":
        assert counts["reference_3d"] >= 3 * batch, counts   # the counter counts stacks


@pytest.mark.parametrize("entry", ["vmap_attn", "vmap_op", "vmap_vmap_attn"])
def test_batched_forward_allocates_one_square_buffer_per_example(entry):
    n, batch = 8, 4
    q, k, v = _stacked_inputs((batch,), n, 3, 5, torch.float32)
    counts = []
    for name in (entry, "reference_3d"):
        with _NewSquareBuffers(n) as counter:
            _batched_entry_points()[name](q, k, v)
        counts.append(counter.count)
    assert counts == [batch, 2 * batch], counts


def test_forward_allocates_one_square_buffer():
    n = 8
    q, k, v = make_inputs(n, 3, 5, dtype=torch.float32)
    counts = []
    for fn in (torch_impl.attn, torch_impl.attn_reference):
        with _NewSquareBuffers(n) as counter:
            fn(q, k, v)
        counts.append(counter.count)
    assert counts == [1, 2], counts  # x is overwritten by tanh in place; the reference keeps x and a


@pytest.mark.parametrize("requires_grad", [True, False])
def test_inputs_never_modified(requires_grad):
    q, k, v = make_inputs(5, 3, 4, dtype=torch.complex128, requires_grad=(requires_grad,) * 3)
    before = [t.detach().clone() for t in (q, k, v)]
    versions = [t._version for t in (q, k, v)]
    o, a = torch_impl.attn(q, k, v)
    if requires_grad:
        go, ga = torch.randn_like(o), torch.randn_like(a)
        go_before, ga_before = go.clone(), ga.clone()
        torch.autograd.backward((o, a), (go, ga), create_graph=False)
        # The incoming gradients are autograd's buffers: the backward must not write into them either.
        assert torch.equal(go, go_before) and torch.equal(ga, ga_before)
    for t, b, ver in zip((q, k, v), before, versions):
        assert torch.equal(t.detach(), b)
        assert t._version == ver


def test_a_only_gradient_buffer_not_overwritten():
    """With only G_A given, (10) must not run in place on autograd's G_A (it may be shared)."""
    q, k, v = make_inputs(4, 3, 2)
    o, a = torch_impl.attn(q, k, v)
    ga = torch.randn_like(a)
    keep = ga.clone()
    torch.autograd.backward(a, ga)
    assert torch.equal(ga, keep)


# ---------------------------------------------------------------------------------------------------------
# The backward by blocks of rows, eq. (31): on CPU, from ``performance.BLOCKED_FROM_BYTES`` of ``a`` on, (9)-(12)
# run one block of rows (``SCRATCH_BLOCK_BYTES``) at a time.  These and ``IN_PLACE_FROM_BYTES`` are lowered here
# so that test sizes take that path.
# ---------------------------------------------------------------------------------------------------------

def _force_blocks(monkeypatch, nbytes):
    """Blocks of at most ``nbytes`` of ``a``; returns the list to which each blocked backward appends its
    number of blocks (so a test can tell the blocked path ran, and in how many pieces)."""
    calls, real = [], performance._row_blocks

    def spy(a, block_bytes):
        blocks = real(a, block_bytes)
        calls.append(len(blocks))
        return blocks

    monkeypatch.setattr(performance, "SCRATCH_BLOCK_BYTES", nbytes)
    monkeypatch.setattr(performance, "BLOCKED_FROM_BYTES", 0)
    monkeypatch.setattr(performance, "IN_PLACE_FROM_BYTES", 0)    # blocks are an in-place schedule
    monkeypatch.setattr(performance, "_row_blocks", spy)
    return calls


def _blocked_entry_points():
    ref3 = _batched_entry_points()["reference_3d"]
    return {  # name: (fn, batch dims, reference)
        "attn": (torch_impl.attn, (), torch_impl.attn_reference),
        "op": (torch.ops.attn_lab.attn.default, (), torch_impl.attn_reference),
        "vmap_attn": (torch.func.vmap(torch_impl.attn), (3,), ref3),
        "vmap_vmap_attn": (torch.func.vmap(torch.func.vmap(torch_impl.attn)), (2, 2), lambda *x: ref3(*x)),
    }


# rows per block (of n = 7 rows) or, in ``examples``, whole examples per block
BLOCKINGS = {"rows_2": lambda n, item: 2 * n * item, "rows_1": lambda n, item: 1,
             "examples_2": lambda n, item: 2 * n * n * item}


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True)], ids=str)
@pytest.mark.parametrize("loss", LOSSES, ids=str)
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("entry,blocking", [(e, b) for e in ("attn", "op", "vmap_attn", "vmap_vmap_attn")
                                            for b in BLOCKINGS if e.startswith("vmap") or b.startswith("rows")])
def test_blocked_backward_matches_reference(entry, blocking, dtype, loss, mask, monkeypatch):
    fn, batch, ref = _blocked_entry_points()[entry]
    n = 7
    inputs = _stacked_inputs(batch, n, 3, 5, dtype, mask)
    want = grads_of(ref, inputs, LOSSES[loss])
    calls = _force_blocks(monkeypatch, BLOCKINGS[blocking](n, torch.empty((), dtype=dtype).element_size()))
    got = grads_of(fn, inputs, LOSSES[loss])
    if any(w is not None for w in want[:2]):   # (9)-(12) are needed: the blocked schedule ran, in pieces
        assert calls and all(c > 1 for c in calls), calls
    for g, w in zip(got, want):
        if w is None:
            assert g is None or not g.any()   # the Function's a depends on v for autograd; the value is 0
        else:
            assert_close(g, w)


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("entry", ["attn", "vmap_attn"])
def test_blocked_backward_gradcheck(entry, dtype, monkeypatch):
    """Finite differences on the blocked schedule (gradcheck's backward runs without grad mode: blocked)."""
    fn, batch, _ = _blocked_entry_points()[entry]
    inputs = _stacked_inputs(batch, 5, 2, 3, dtype)
    calls = _force_blocks(monkeypatch, 2 * 5 * inputs[0].element_size())
    assert gradcheck(fn, inputs)
    assert calls and all(c > 1 for c in calls)
    # batched gradients (is_grads_batched: the grad outputs are vmap-wrapped) must take the one-shot path
    calls.clear()
    assert gradcheck(fn, inputs, check_batched_grad=True)


def test_blocked_backward_steps_aside_for_double_backward(monkeypatch):
    """With ``create_graph=True`` the one-shot, differentiable formulas run (the blocked schedule fills its
    results in place); second-order gradients match the reference."""
    calls = _force_blocks(monkeypatch, 1)
    q, k, v = make_inputs(5, 3, 4)
    results = []
    for fn in (torch_impl.attn, torch_impl.attn_reference):
        first = torch.autograd.grad(loss_both(*fn(q, k, v)), (q, k, v), create_graph=True)
        if fn is torch_impl.attn:
            assert calls == []
            # the second pass runs AttnFunction's backward again, now without grad mode: blocked, and exact
        results.append(torch.autograd.grad(sum((g * g).sum() for g in first), (q, k, v)))
    assert calls == [5]
    for g, w in zip(*results):
        assert_close(g, w)
    assert gradgradcheck(torch_impl.attn, make_inputs(3, 2, 2))


def test_blocked_backward_leaves_the_output_gradients_alone(monkeypatch):
    """With only G_A given, (10) runs out of place on each block of autograd's G_A (it may be shared)."""
    calls = _force_blocks(monkeypatch, 2 * 6 * 8)
    q, k, v = make_inputs(6, 3, 2)
    o, a = torch_impl.attn(q, k, v)
    go, ga = torch.randn_like(o), torch.randn_like(a)
    keep = (go.clone(), ga.clone())
    torch.autograd.backward(a, ga, inputs=[q, k], retain_graph=True)
    torch.autograd.backward((o, a), (go, ga), inputs=[q, k, v])
    assert calls == [3, 3] and torch.equal(go, keep[0]) and torch.equal(ga, keep[1])


def test_blocked_backward_keeps_low_precision_one_shot(monkeypatch):
    """float16 / bfloat16 (and autocast's outputs) are not blocked: (12)'s sum would round each partial sum."""
    calls = _force_blocks(monkeypatch, 2)
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (t.to(dtype).detach().requires_grad_() for t in make_inputs(6, 3, 2))
        torch.autograd.grad(loss_both(*torch_impl.attn(q, k, v)), (q, k, v))
    q, k, v = make_inputs(6, 3, 2, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch_impl.attn(q, k, v)
    torch.autograd.grad(loss_both(*(t.float() for t in out)), (q, k, v))
    assert calls == []


@pytest.mark.parametrize("entry", ["attn", "vmap_attn"])
@pytest.mark.parametrize("loss", LOSSES, ids=str)
def test_blocked_backward_allocates_no_square_buffer(entry, loss, monkeypatch):
    """The point of (31): the scratch is one block of rows, not an n×n buffer (nor a (B, n, n) stack); here
    blocks of 3 rows.  (A block of whole examples holds their n×n each: that is what the block budget buys.)"""
    fn, batch, _ = _blocked_entry_points()[entry]
    n = 8
    inputs = _stacked_inputs(batch, n, 3, 5, torch.float32)
    out = fn(*inputs)
    out_grads = torch.autograd.grad(LOSSES[loss](*out), out, allow_unused=True, retain_graph=True)
    used = [(t, g) for t, g in zip(out, out_grads) if g is not None]
    calls = _force_blocks(monkeypatch, 3 * n * 4)
    with _NewSquareBuffers(n) as counter:
        torch.autograd.grad([t for t, _ in used], inputs, [g for _, g in used], allow_unused=True)
    assert calls and counter.count == 0, (calls, counter.count)


@pytest.mark.parametrize("shape", [(7, 7), (1, 1), (3, 5, 5), (4, 6, 6), (2, 1, 1)], ids=str)
@pytest.mark.parametrize("budget_rows", [1, 2, 3, 5, 7, 12, 100])
def test_row_blocks_cover_every_row_once(shape, budget_rows):
    a = torch.empty(shape)
    row_bytes = shape[-1] * a.element_size()
    seen = torch.zeros(shape[:-1], dtype=torch.int64)
    blocks = performance._row_blocks(a, budget_rows * row_bytes)
    for examples, rows in blocks:
        assert seen[(*examples, rows)].numel() <= budget_rows, (examples, rows)   # (example, row) pairs
        seen[(*examples, rows)] += 1
    assert torch.equal(seen, torch.ones_like(seen))
    # as few blocks as the budget allows: whole examples together when one fits, else rows of one example
    n = shape[-2]
    examples = shape[0] if len(shape) == 3 else 1
    if len(shape) == 3 and n <= budget_rows:
        assert len(blocks) == -(-examples // (budget_rows // n))
    else:
        assert len(blocks) == examples * -(-n // budget_rows)


def test_blocked_schedule_only_on_cpu_and_only_from_the_threshold(monkeypatch):
    monkeypatch.setattr(performance, "SCRATCH_BLOCK_BYTES", 64)
    monkeypatch.setattr(performance, "BLOCKED_FROM_BYTES", 256)
    assert performance._blocks_pay(torch.empty(8, 8))                 # 256 bytes: from the threshold on
    assert not performance._blocks_pay(torch.empty(7, 7))             # below it: the heap recycles the buffer
    assert not performance._blocks_pay(torch.empty(8, 8, device="meta"))
    assert not performance._blocks_pay(torch.empty(8, 8, dtype=torch.bfloat16))   # (12) summed in low precision
    monkeypatch.setattr(performance, "SCRATCH_BLOCK_BYTES", 256)
    assert not performance._blocks_pay(torch.empty(8, 8))             # one block anyway: the one-shot path


def test_small_backward_does_not_ask_about_in_place_writes(monkeypatch):
    """Below ``IN_PLACE_FROM_BYTES`` of ``a`` the formulas run as written, without asking ``internals`` (the
    question costs more than the buffer saved); from it on, the backward asks once."""
    asked = []
    monkeypatch.setattr(internals, "may_write_in_place", lambda *t: asked.append(len(t)) or False)
    n = math.isqrt(performance.IN_PLACE_FROM_BYTES // 4)
    for rows, want in ((n - 1, []), (n, [6])):
        asked.clear()
        q, k, v = attn_inputs(rows, 3, 2, dtype=torch.float32, requires_grad=True)
        torch.autograd.grad(torch_impl.attn(q, k, v).o.sum(), (q, k, v))
        assert asked == want, rows


def test_in_place_writes_only_where_unobservable():
    """``internals.may_write_in_place``: never with grad mode on (create_graph=True), never on a functorch
    wrapper, a dual tensor or a tensor subclass (what AOTAutograd traces with); yes for plain tensors and
    parameters in a plain backward."""
    t = torch.empty(2, 2)

    class Traced(torch.Tensor):
        pass

    with torch.no_grad():
        assert internals.may_write_in_place(t, None)
        assert internals.may_write_in_place(torch.nn.Parameter(t), t)
        assert not internals.may_write_in_place(t, t.as_subclass(Traced))
        torch.func.vmap(lambda x: _assert(not internals.may_write_in_place(x)) or x)(torch.empty(3, 2))
        torch.func.grad(lambda x: _assert(not internals.may_write_in_place(x)) or x.sum())(torch.empty(2))
        with forward_ad.dual_level():
            assert not internals.may_write_in_place(forward_ad.make_dual(t, torch.ones_like(t)))
    with torch.enable_grad():
        assert not internals.may_write_in_place(t)


def _assert(condition):
    assert condition
    return None


# ---------------------------------------------------------------------------------------------------------
# Layouts, devices and dtypes
# ---------------------------------------------------------------------------------------------------------

def _noncontiguous_variants(n, d, e, dtype):
    g = torch.Generator().manual_seed(7)
    # transposed views
    yield [torch.randn(s[::-1], generator=g, dtype=dtype).mT for s in [(n, d), (n, d), (n, e)]]
    # strided slices
    yield [torch.randn(2 * s[0], s[1] + 2, generator=g, dtype=dtype)[::2, 1:-1] for s in [(n, d), (n, d), (n, e)]]
    # expanded (stride 0) rows
    yield [torch.randn(1, s[1], generator=g, dtype=dtype).expand(s) for s in [(n, d), (n, d), (n, e)]]


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_noncontiguous_inputs(dtype):
    for inputs in _noncontiguous_variants(4, 3, 5, dtype):
        assert not any(t.is_contiguous() for t in inputs)
        inputs = [t.requires_grad_() for t in inputs]
        if all(0 not in t.stride() for t in inputs):  # gradcheck cannot perturb overlapping (stride-0) memory
            assert gradcheck(torch_impl.attn, inputs)
        for loss in LOSSES.values():
            for g, w in zip(grads_of(torch_impl.attn, inputs, loss), grads_of(torch_impl.attn_reference, inputs, loss)):
                assert_close(g, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_against_float64(dtype, device):
    """Half / bfloat16 on every device: CPU builds of every supported torch multiply in both, and so does CUDA,
    except bfloat16 on a GPU without it (``torch.cuda.is_bf16_supported()``), the one stated skip; any other
    error is a failure.  Tolerances: the op rounds three times (two matmuls and tanh) in a format with an
    8 (bf16) / 11 (fp16) bit significand, so we compare with the float64 result at bf16/fp16 resolution,
    relative to the output scale."""
    if device == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16 (torch.cuda.is_bf16_supported() is False)")
    q, k, v = make_inputs(16, 8, 4, dtype=torch.float64, device=device)
    qs, ks, vs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    got = torch_impl.attn(qs, ks, vs)
    q64, k64, v64 = [t.detach().double().requires_grad_() for t in (qs, ks, vs)]
    want = torch_impl.attn_reference(q64, k64, v64)
    tol = {torch.bfloat16: 4e-2, torch.float16: 5e-3}[dtype]
    for g, w in zip(got, want):
        assert g.dtype == dtype
        assert_close(g.double(), w, atol=tol * w.abs().max().item(), rtol=tol)
    g_got = torch.autograd.grad(loss_both(*got), (qs, ks, vs))
    g_want = torch.autograd.grad(loss_both(*want), (q64, k64, v64))
    for g, w in zip(g_got, g_want):
        # Gradients round ~6 more times than the forward (four matmuls, the sum and tanh_backward): 4× tol.
        assert_close(g.double(), w, atol=4 * tol * w.abs().max().item(), rtol=4 * tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_gradcheck_cuda(dtype):
    inputs = make_inputs(4, 3, 5, dtype=dtype, device="cuda")
    assert gradcheck(torch_impl.attn, inputs, check_forward_ad=True)
    assert gradgradcheck(torch_impl.attn, inputs)


# ---------------------------------------------------------------------------------------------------------
# Empty sizes
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0, 3, 2), (3, 0, 2), (3, 2, 0), (0, 0, 0), (2, 0, 0)],
                         ids=lambda s: "n%d_d%d_e%d" % s)
def test_empty_sizes(shape, dtype):
    n, d, e = shape
    q, k, v = make_inputs(n, d, e, dtype=dtype)
    o, a = torch_impl.attn(q, k, v)
    assert o.shape == (n, e) and a.shape == (n, n)
    ref = torch_impl.attn_reference(q, k, v)
    assert_close(o, ref.o)
    assert_close(a, ref.a)  # d = 0: x = 0, so a = tanh(0) = 0
    go, ga = torch.randn_like(o), torch.randn_like(a)
    got = torch.autograd.grad((o, a), (q, k, v), (go, ga))
    want = torch.autograd.grad(ref, (q, k, v), (go, ga))
    for g, w, t in zip(got, want, (q, k, v)):
        assert g.shape == t.shape
        assert_close(g, w)
    assert gradcheck(torch_impl.attn, (q, k, v))


# ---------------------------------------------------------------------------------------------------------
# Input validation: every error, its exact message, raised before any compute
# ---------------------------------------------------------------------------------------------------------

def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


ERROR_CASES = {
    "q_not_tensor": (([[1.0]], _t(1, 1), _t(1, 1)), TypeError,
                     "attn(): argument 'q' must be a torch.Tensor, got list"),
    "v_not_tensor": ((_t(1, 1), _t(1, 1), 3.0), TypeError, "attn(): argument 'v' must be a torch.Tensor, got float"),
    "k_numpy": ((_t(1, 1), _t(1, 1).numpy(), _t(1, 1)), TypeError,
                "attn(): argument 'k' must be a torch.Tensor, got numpy.ndarray"),
    "q_1d": ((_t(3), _t(3, 2), _t(3, 2)), ValueError,
             "attn(): argument 'q' must be 2-D (n, d), got 1-D with shape (3,)"),
    "v_3d": ((_t(2, 3), _t(2, 3), _t(1, 2, 4)), ValueError,
             "attn(): argument 'v' must be 2-D (n, e), got 3-D with shape (1, 2, 4)"),
    "k_0d": ((_t(2, 3), _t(), _t(2, 4)), ValueError,
             "attn(): argument 'k' must be 2-D (n, d), got 0-D with shape ()"),
    "d_mismatch": ((_t(2, 3), _t(2, 4), _t(2, 4)), ValueError,
                   "attn(): q and k must have the same second dimension d, got q (2, 3) and k (2, 4)"),
    "k_n_mismatch": ((_t(2, 3), _t(3, 3), _t(2, 4)), ValueError,
                     "attn(): q, k and v must have the same first dimension n (the lab's contract: q is (n, d), "
                     "k is (n, d), v is (n, e)), got q (2, 3), k (3, 3) and v (2, 4)"),
    "v_n_mismatch": ((_t(2, 3), _t(2, 3), _t(5, 4)), ValueError,
                     "attn(): q, k and v must have the same first dimension n (the lab's contract: q is (n, d), "
                     "k is (n, d), v is (n, e)), got q (2, 3), k (2, 3) and v (5, 4)"),
    "int_dtype": ((_t(2, 3, dtype=torch.int64), _t(2, 3), _t(2, 4)), TypeError,
                  "attn(): argument 'q' must have a floating-point or complex dtype (float16, bfloat16, "
                  "float32, float64, complex64 or complex128), got int64"),
    "bool_dtype": ((_t(2, 3), _t(2, 3), _t(2, 4, dtype=torch.bool)), TypeError,
                   "attn(): argument 'v' must have a floating-point or complex dtype (float16, bfloat16, "
                   "float32, float64, complex64 or complex128), got bool"),
    "mixed_dtype": ((_t(2, 3), _t(2, 3, dtype=torch.float64), _t(2, 4)), TypeError,
                    "attn(): q, k and v must have the same dtype, got q float32, k float64 and v float32"),
    "mixed_device": ((_t(2, 3), _t(2, 3), _t(2, 4, device="meta")), ValueError,
                     "attn(): q, k and v must be on the same device, got q cpu, k cpu and v meta"),
}


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fn", [torch_impl.attn, torch_impl.attn_reference], ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", ERROR_CASES, ids=str)
def test_errors(case, fn):
    args, exc, message = ERROR_CASES[case]
    with _OpCounter() as counter, pytest.raises(exc) as info:
        fn(*args)
    assert str(info.value) == message
    assert counter.ops == [], "validation must run before any compute"


def test_error_messages_match_templates():
    """Every template of the lab's contract is exercised by ERROR_CASES (a new check must come with a test; the
    block contract's "kv_rows" is tested in tests/impl/test_messages.py)."""
    rendered = {msg for _, _, msg in ERROR_CASES.values()}
    for key in set(MESSAGES) - {"kv_rows"}:
        prefix = MESSAGES[key].replace("{fn}", "attn").split("{")[0]
        assert len(prefix) > len("attn(): ") and any(m.startswith(prefix) for m in rendered), key


def test_lab_example_runs():
    o, a = torch_impl.attn(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 4))
    assert o.shape == (2, 4) and a.shape == (2, 2)
    assert "AttnOutput(o=tensor(" in repr(torch_impl.attn(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 4)))


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_backward_formula_under_forward_ad_without_grad_mode(dtype):
    """Forward AD through the VJP formula with grad mode off (a dual level, no create_graph): the in-place
    ``tanh_backward`` shortcut must step aside for dual tensors (``out=`` ops have no forward-AD formula)."""
    q, k, v = make_inputs(4, 3, 5, dtype=dtype, requires_grad=(False,) * 3)
    a = torch.tanh(q @ k.mT)
    go, ga = torch.randn(4, 5, dtype=dtype), torch.randn(4, 4, dtype=dtype)
    dgo, dga = torch.randn_like(go), torch.randn_like(ga)

    def vjp(go, ga):
        return formulas.attn_backward(go, ga, q, k, v, a, (True, True, True))

    _, want = torch.func.jvp(vjp, (go, ga), (dgo, dga))   # functorch's jvp: the out-of-place path
    with torch.no_grad(), torch.autograd.forward_ad.dual_level():
        got = vjp(torch.autograd.forward_ad.make_dual(go, dgo), torch.autograd.forward_ad.make_dual(ga, dga))
        tangents = [torch.autograd.forward_ad.unpack_dual(g).tangent for g in got]
    for t, w in zip(tangents, want):
        assert_close(t, w)
