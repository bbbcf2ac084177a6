"""The formulas modules on their masked and absent paths: every ``output_mask`` of the block VJPs (both
frameworks), ``attn_backward``'s mask (torch), and both cotangents absent (JAX ``attn_backward(None, None, …)``,
reachable when attn's outputs feed a ``custom_vjp`` whose backward returns None)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from torch_impl import formulas as TF

from tests.conftest import require_jax

MASKS = list(itertools.product((False, True), repeat=2))


def _rand(*shape, dtype=torch.complex128, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, dtype=dtype, generator=g)


@pytest.mark.parametrize("mask", MASKS)
def test_torch_scores_vjp_mask(mask):
    q, k, g = _rand(4, 3), _rand(4, 3, seed=1), _rand(4, 4, seed=2)
    full = TF.scores_vjp(g, q, k)
    # with every tensor given, and with a masked-out gradient's input absent (k is read only for G_Q, q only for G_K)
    for got in (TF.scores_vjp(g, q, k, mask), TF.scores_vjp(g, q if mask[1] else None, k if mask[0] else None, mask)):
        for want, value, asked in zip(full, got, mask):
            if asked:
                torch.testing.assert_close(value, want, rtol=0, atol=0)
            else:
                assert value is None


@pytest.mark.parametrize("mask", MASKS)
def test_torch_mix_vjp_mask(mask):
    a, v, g = _rand(4, 4), _rand(4, 2, seed=1), _rand(4, 2, seed=2)
    full = TF.mix_vjp(g, a, v)
    for got in (TF.mix_vjp(g, a, v, mask),
                TF.mix_vjp(g, a if mask[1] else None, v if mask[0] else None, mask)):  # v only for G_A, a for G_V
        for want, value, asked in zip(full, got, mask):
            if asked:
                torch.testing.assert_close(value, want, rtol=0, atol=0)
            else:
                assert value is None


@pytest.mark.parametrize("mask", list(itertools.product((False, True), repeat=3)))
@pytest.mark.parametrize("absent", ["none", "o", "a"])
def test_torch_attn_backward_mask(mask, absent):
    q, k, v = _rand(4, 3), _rand(4, 3, seed=1), _rand(4, 2, seed=2)
    o, a = TF.attn_forward(q, k, v)
    go = None if absent == "o" else _rand(4, 2, seed=3)
    ga = None if absent == "a" else _rand(4, 4, seed=4)
    full = TF.attn_backward(go, ga, q, k, v, a, (True, True, True))
    need_q, need_k, need_v = mask
    # saved as AttnFunction.setup_context saves them: q for G_K, k for G_Q, v for G_Q or G_K
    for got in (TF.attn_backward(go, ga, q, k, v, a, mask),
                TF.attn_backward(go, ga, q if need_k else None, k if need_q else None,
                                 v if (need_q or need_k) else None, a, mask)):
        for want, value, asked in zip(full, got, mask):
            if asked and want is not None:
                torch.testing.assert_close(value, want, rtol=1e-14, atol=0)
            else:
                assert value is None


def test_torch_attn_backward_both_absent():
    q, k, v = _rand(3, 2), _rand(3, 2, seed=1), _rand(3, 4, seed=2)
    _, a = TF.attn_forward(q, k, v)
    assert TF.attn_backward(None, None, q, k, v, a, (True, True, True)) == (None, None, None)


# --- JAX ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def J():
    jax = require_jax()
    from jax_impl import formulas
    return jax, formulas


def _np(*shape, seed=0):
    r = np.random.default_rng(seed + sum(shape))
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(np.complex64)


@pytest.mark.parametrize("block", ["scores", "mix"])
@pytest.mark.parametrize("mask", MASKS)
def test_jax_block_vjp_mask(J, block, mask):
    jax, F = J
    if block == "scores":
        x, y, g = _np(4, 3), _np(4, 3, seed=1), _np(4, 4, seed=2)
        fn = F.scores_vjp
        args = (g, x if mask[1] else None, y if mask[0] else None)     # k only for G_Q, q only for G_K
    else:
        x, y, g = _np(4, 4), _np(4, 2, seed=1), _np(4, 2, seed=2)
        fn = F.mix_vjp
        args = (g, x if mask[1] else None, y if mask[0] else None)     # v only for G_A, a only for G_V
    full = fn(g, x, y)
    for got in (fn(g, x, y, mask), fn(*args, mask)):            # every tensor given / only the needed ones
        for want, value, asked in zip(full, got, mask):
            if asked:
                np.testing.assert_array_equal(np.asarray(value), np.asarray(want))
            else:
                assert value is None


def test_jax_attn_backward_both_cotangents_absent(J):
    jax, F = J
    q, k, v = _np(3, 2), _np(3, 2, seed=1), _np(3, 4, seed=2)
    _, a = F.attn_forward(q, k, v)
    assert F.attn_backward(None, None, q, k, v, a) == (None, None, None)


def test_jax_attn_under_a_custom_vjp_returning_none(J):
    """attn's outputs feed a custom_vjp whose backward returns None (symbolic zeros): the gradient is exactly
    zero, whether JAX calls attn's rule with two symbolic zeros or skips it."""
    jax, F = J
    import jax.numpy as jnp
    import jax_impl

    @jax.custom_vjp
    def blocked(o, a):
        return jnp.sum(o) + jnp.sum(a)

    blocked.defvjp(lambda o, a: (blocked(o, a), None), lambda res, g: (None, None))
    q, k, v = (np.abs(_np(3, 2)).real.astype(np.float32), np.abs(_np(3, 2, seed=1)).real.astype(np.float32),
               np.abs(_np(3, 4, seed=2)).real.astype(np.float32))
    grads = jax.grad(lambda q, k, v: blocked(*jax_impl.attn(q, k, v)), argnums=(0, 1, 2))(q, k, v)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and not np.any(np.asarray(g))
