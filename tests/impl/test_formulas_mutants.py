"""The formulas modules, function by function, against autodiff of the plain composite: the tests that kill
what mutation testing (``python -m mutation``, mutation/report.md) plants in ``torch_impl/formulas.py`` and
``jax_impl/formulas.py`` — a dropped conjugate, a dropped or added transpose, swapped matmul operands, a dropped
term of (9)/(14)/(16), ``1 − a`` for ``1 − a²``, a flipped mask or ``None`` branch.

Every check runs in complex dtypes (a dropped conjugate is invisible in real ones) with q (m, d), k (n, d), v (n, e)
and m, n, d, e all different (a transpose or an operand swap then changes the shape or the numbers; the formulas
do not need m = n, the sharded blocks use m ≠ n), for every cotangent / tangent present or absent and every
output mask, and in torch on single matrices and on stacks (the vmap rules' 3-D path).  Fast on purpose: mutation
testing runs this file once per mutant (``-k torch`` / ``-k jax``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from torch_impl import formulas as TF

from tests.conftest import require_jax

M, N, D, E = 5, 4, 3, 2
MASKS3 = list(itertools.product((False, True), repeat=3))
TANGENTS3 = [m for m in MASKS3 if any(m)]          # a JVP rule is called only with some tangent (both frameworks)
COTANGENTS = ("both", "o", "a")            # which output gradients are present


# --- torch ------------------------------------------------------------------------------------------------------------

def _t(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, dtype=torch.complex128, generator=g) * 0.6)


def _torch_inputs(batch=()):
    return (_t(*batch, M, D, seed=1), _t(*batch, N, D, seed=2), _t(*batch, N, E, seed=3))


def _ref(q, k, v):
    a = torch.tanh(q @ k.mT)
    return a @ v, a


def _torch_vjp(inputs, go, ga):
    """PyTorch's convention: torch.func.vjp of the composite, absent cotangents as zeros."""
    (o, a), pull = torch.func.vjp(_ref, *inputs)
    return pull((torch.zeros_like(o) if go is None else go, torch.zeros_like(a) if ga is None else ga))


def _close(got, want):
    if want is None:
        assert got is None
    else:
        assert got is not None
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("batch", [(), (2,)], ids=["matrix", "stack"])
def test_torch_forward(batch):
    q, k, v = _torch_inputs(batch)
    o, a = TF.attn_forward(q, k, v)
    want_o, want_a = _ref(q, k, v)
    _close(o, want_o)
    _close(a, want_a)


@pytest.mark.parametrize("batch", [(), (2,)], ids=["matrix", "stack"])
@pytest.mark.parametrize("cot", COTANGENTS)
@pytest.mark.parametrize("mask", MASKS3)
def test_torch_attn_backward(batch, cot, mask):
    q, k, v = _torch_inputs(batch)
    a = _ref(q, k, v)[1]
    go = None if cot == "a" else _t(*batch, M, E, seed=4)
    ga = None if cot == "o" else _t(*batch, M, N, seed=5)
    before = [None if g is None else g.clone() for g in (go, ga)]
    want = _torch_vjp((q, k, v), go, ga)
    # the saved tensors a masked-out gradient does not read may be absent: q only for G_K, k only for G_Q
    got = TF.attn_backward(go, ga, q if mask[1] else None, k if mask[0] else None, v, a, mask)
    for g, w, need, name in zip(got, want, mask, "qkv"):
        if not need or (name == "v" and go is None):
            assert g is None, name                     # not asked for, or exactly zero (no G_O): None
        else:
            _close(g, w)
    if all(mask):                                      # the default mask: every gradient
        for g, w in zip(TF.attn_backward(go, ga, q, k, v, a), got):
            assert (g is None) == (w is None) and (g is None or torch.equal(g, w))
    for g, b in zip((go, ga), before):                 # the caller's gradients are never written to
        if g is not None:
            assert torch.equal(g, b)


def test_torch_attn_backward_without_cotangents_is_all_none():
    q, k, v = _torch_inputs()
    a = _ref(q, k, v)[1]
    assert TF.attn_backward(None, None, q, k, v, a, (True, True, True)) == (None, None, None)
    assert TF.attn_backward(None, None, q, k, v, a) == (None, None, None)      # the default mask: all


@pytest.mark.parametrize("batch", [(), (2,)], ids=["matrix", "stack"])
@pytest.mark.parametrize("tangents", TANGENTS3)
def test_torch_attn_jvp(batch, tangents):
    q, k, v = _torch_inputs(batch)
    a = _ref(q, k, v)[1]
    tans = [_t(*x.shape, seed=6 + i) if on else None for i, (x, on) in enumerate(zip((q, k, v), tangents))]
    _, want = torch.func.jvp(_ref, (q, k, v), tuple(torch.zeros_like(x) if t is None else t
                                                   for x, t in zip((q, k, v), tans)))
    got = TF.attn_jvp(q, k, v, a, *tans)
    _close(got[0], want[0])
    _close(got[1], want[1])


# the building blocks, each against autodiff of its own one-line definition

@pytest.mark.parametrize("batch", [(), (2,)], ids=["matrix", "stack"])
def test_torch_blocks(batch):
    q, k, v = _torch_inputs(batch)
    a = _ref(q, k, v)[1]
    gx, go = _t(*batch, M, N, seed=7), _t(*batch, M, E, seed=8)
    _, pull = torch.func.vjp(lambda q, k: q @ k.mT, q, k)
    for got, want in zip(TF.scores_vjp(gx, q, k), pull(gx)):
        _close(got, want)
    x = q @ k.mT
    _, pull = torch.func.vjp(torch.tanh, x)
    _close(TF.tanh_vjp(gx, a), pull(gx)[0])
    _, pull = torch.func.vjp(lambda a, v: a @ v, a, v)
    for got, want in zip(TF.mix_vjp(go, a, v), pull(go)):
        _close(got, want)
    qd, kd, xd, ad, vd = (_t(*batch, M, D, seed=10), _t(*batch, N, D, seed=11), _t(*batch, M, N, seed=12),
                          _t(*batch, M, N, seed=13), _t(*batch, N, E, seed=14))
    _close(TF.scores_jvp(q, k, qd, kd), torch.func.jvp(lambda q, k: q @ k.mT, (q, k), (qd, kd))[1])
    _close(TF.scores_jvp(q, k, qd, None), qd @ k.mT)
    _close(TF.scores_jvp(q, k, None, kd), q @ kd.mT)
    assert TF.scores_jvp(q, k, None, None) is None
    _close(TF.tanh_jvp(xd, a), torch.func.jvp(torch.tanh, (x,), (xd,))[1])
    _close(TF.mix_jvp(a, v, ad, vd), torch.func.jvp(lambda a, v: a @ v, (a, v), (ad, vd))[1])
    _close(TF.mix_jvp(a, v, ad, None), ad @ v)
    _close(TF.mix_jvp(a, v, None, vd), a @ vd)
    assert TF.mix_jvp(a, v, None, None) is None


def test_torch_block_masks_and_total_grad_a():
    q, k, v = _torch_inputs()
    a = _ref(q, k, v)[1]
    gx, go, ga = _t(M, N, seed=7), _t(M, E, seed=8), _t(M, N, seed=9)
    for mask in itertools.product((False, True), repeat=2):
        for got, need in zip(TF.scores_vjp(gx, q, k, mask) + TF.mix_vjp(go, a, v, mask), mask + mask):
            assert (got is None) == (not need)
    assert all(g is not None for g in TF.scores_vjp(gx, q, k) + TF.mix_vjp(go, a, v))
    assert TF.total_grad_a(None, ga, v) is ga                 # G_A alone: passed through, nothing built
    assert TF.total_grad_a(None, None, v) is None
    _close(TF.total_grad_a(go, None, v), go @ v.mH)
    _close(TF.total_grad_a(go, ga, v), go @ v.mH + ga)


def test_torch_tanh_vjp_writes_into_out():
    a = _ref(*_torch_inputs())[1]
    g = _t(M, N, seed=7)
    want = TF.tanh_vjp(g, a)
    buffer = torch.empty_like(g)
    got = TF.tanh_vjp(g, a, out=buffer)
    assert got.data_ptr() == buffer.data_ptr()
    _close(buffer, want)
    scratch = g.clone()
    got = TF.tanh_vjp(scratch, a, out=scratch)                # in place over the gradient itself
    assert got.data_ptr() == scratch.data_ptr()
    _close(scratch, want)
    with pytest.raises(TypeError):
        TF.tanh_vjp(g, a, buffer)                              # out is keyword-only: never written by position


# --- JAX --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def J():
    jax = require_jax()
    from jax_impl import formulas as JF
    return jax, JF


def _j(*shape, seed):
    r = np.random.default_rng(seed)
    return ((r.standard_normal(shape) + 1j * r.standard_normal(shape)) * 0.6).astype(np.complex64)


def _jax_inputs():
    return _j(M, D, seed=1), _j(N, D, seed=2), _j(N, E, seed=3)


def _jref(q, k, v):
    import jax.numpy as jnp
    a = jnp.tanh(q @ k.T)
    return a @ v, a


def _jclose(got, want):
    if want is None:
        assert got is None
    else:
        assert got is not None
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_jax_forward(J):
    jax, F = J
    for got, want in zip(F.attn_forward(*_jax_inputs()), _jref(*_jax_inputs())):
        _jclose(got, want)


@pytest.mark.parametrize("cot", COTANGENTS)
def test_jax_attn_backward(J, cot):
    """JAX's convention (jax.vjp: no conjugates), each cotangent present or a symbolic zero (None), each mask."""
    jax, F = J
    q, k, v = _jax_inputs()
    a = np.asarray(_jref(q, k, v)[1])
    go = None if cot == "a" else _j(M, E, seed=4)
    ga = None if cot == "o" else _j(M, N, seed=5)
    _, pull = jax.vjp(_jref, q, k, v)
    want = pull((np.zeros((M, E), np.complex64) if go is None else go,
                 np.zeros((M, N), np.complex64) if ga is None else ga))
    for mask in MASKS3:
        got = F.attn_backward(go, ga, q if mask[1] else None, k if mask[0] else None, v, a, mask)
        for g, w, need, name in zip(got, want, mask, "qkv"):
            if not need or (name == "v" and go is None):
                assert g is None, (mask, name)         # masked out, or no G_O: G_V is a symbolic zero
            else:
                _jclose(g, w)
    for g, w, name in zip(F.attn_backward(go, ga, q, k, v, a), want, "qkv"):     # the default mask: all
        assert (g is None) == (name == "v" and go is None)
    assert F.attn_backward(None, None, q, k, v, a) == (None, None, None)


@pytest.mark.parametrize("tangents", TANGENTS3)
def test_jax_attn_jvp(J, tangents):
    jax, F = J
    q, k, v = _jax_inputs()
    a = np.asarray(_jref(q, k, v)[1])
    tans = [_j(*x.shape, seed=6 + i) if on else None for i, (x, on) in enumerate(zip((q, k, v), tangents))]
    _, want = jax.jvp(_jref, (q, k, v), tuple(np.zeros_like(x) if t is None else t for x, t in zip((q, k, v), tans)))
    got = F.attn_jvp(q, k, v, a, *tans)
    _jclose(got[0], want[0])
    _jclose(got[1], want[1])
    assert got[0].shape == (M, E) and got[1].shape == (M, N)


def test_jax_blocks(J):
    jax, F = J
    import jax.numpy as jnp
    q, k, v = _jax_inputs()
    a = np.asarray(_jref(q, k, v)[1])
    gx, go, ga = _j(M, N, seed=7), _j(M, E, seed=8), _j(M, N, seed=9)
    _, pull = jax.vjp(lambda q, k: q @ k.T, q, k)
    for got, want in zip(F.scores_vjp(gx, q, k), pull(gx)):
        _jclose(got, want)
    x = q @ k.T
    _jclose(F.tanh_vjp(gx, a), jax.vjp(jnp.tanh, x)[1](gx)[0])
    _, pull = jax.vjp(lambda a, v: a @ v, a, v)
    for got, want in zip(F.mix_vjp(go, a, v), pull(go)):
        _jclose(got, want)
    for mask in itertools.product((False, True), repeat=2):
        for got, need in zip(F.scores_vjp(gx, q, k, mask) + F.mix_vjp(go, a, v, mask), mask + mask):
            assert (got is None) == (not need)
    assert all(g is not None for g in F.scores_vjp(gx, q, k) + F.mix_vjp(go, a, v))   # default masks: both
    assert F.total_grad_a(None, ga, v) is ga
    _jclose(F.total_grad_a(go, ga, v), go @ v.T + ga)
    _jclose(F.total_grad_a(go, None, v), go @ v.T)
    _jclose(F.total_grad_a(None, ga, v), ga)
    assert F.total_grad_a(None, None, v) is None
    qd, kd, xd, ad, vd = _j(M, D, seed=10), _j(N, D, seed=11), _j(M, N, seed=12), _j(M, N, seed=13), _j(N, E, seed=14)
    _jclose(F.scores_jvp(q, k, qd, kd), jax.jvp(lambda q, k: q @ k.T, (q, k), (qd, kd))[1])
    _jclose(F.scores_jvp(q, k, qd, None), qd @ k.T)
    _jclose(F.scores_jvp(q, k, None, kd), q @ kd.T)
    assert F.scores_jvp(q, k, None, None) is None
    _jclose(F.tanh_jvp(xd, a), jax.jvp(jnp.tanh, (x,), (xd,))[1])
    _jclose(F.mix_jvp(a, v, ad, vd), jax.jvp(lambda a, v: a @ v, (a, v), (ad, vd))[1])
    _jclose(F.mix_jvp(a, v, ad, None), ad @ v)
    _jclose(F.mix_jvp(a, v, None, vd), a @ vd)
    assert F.mix_jvp(a, v, None, None) is None
