"""Property tests (hypothesis): random shapes (empty sizes included), strides (transposed and sliced storage),
dtypes, cotangent patterns and requires-grad patterns, through every entry point, against the reference.

The fixed-case tests pin known edge cases; these search the combinations none of them lists (e.g. a
non-contiguous k with only v requiring grad and o unused, in complex128).  Examples are few and seeded
(``derandomize``), so a run is reproducible and cheap; a failure prints the falsifying example.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import torch_impl  # noqa: E402
from tests.conftest import require_jax  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)
DTYPES = {"float32": (torch.float32, 1e-5), "float64": (torch.float64, 1e-12), "complex128": (torch.complex128, 1e-12)}
ENTRY_POINTS = {
    "torch_impl.attn": torch_impl.attn,
    "attn_lab::attn": lambda q, k, v: torch.ops.attn_lab.attn(q, k, v),
    "attn_lab::attn_composite": lambda q, k, v: torch.ops.attn_lab.attn_composite(q, k, v),
}


@st.composite
def cases(draw):
    n, d, e = (draw(st.integers(0, 5)) for _ in range(3))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    layouts = [draw(st.sampled_from(["contiguous", "transposed", "sliced"])) for _ in range(3)]
    wrt = draw(st.lists(st.booleans(), min_size=3, max_size=3).filter(any))
    outputs = draw(st.sampled_from(["o,a", "o", "a"]))
    seed = draw(st.integers(0, 2**31 - 1))
    return (n, d, e), dtype, layouts, tuple(wrt), outputs, seed


def _tensor(rng, shape, dtype, layout):
    """A tensor of ``shape`` whose storage is laid out as asked (same values whatever the layout)."""
    tdtype = DTYPES[dtype][0]
    x = rng.standard_normal(shape) * 0.7
    if tdtype.is_complex:
        x = x + 1j * rng.standard_normal(shape) * 0.7
    t = torch.tensor(x, dtype=tdtype)
    if layout == "transposed":
        return t.mT.contiguous().mT                                    # column-major storage
    if layout == "sliced":
        wide = torch.zeros(shape[0], 2 * shape[1] + 1, dtype=tdtype)
        wide[:, 1::2] = t
        return wide[:, 1::2]                                           # row stride 2*cols+1, column stride 2
    return t


def _grads(fn, inputs, wrt, cots):
    leaves = [x.detach().clone().requires_grad_(w) for x, w in zip(inputs, wrt)]
    outs = fn(*leaves)
    pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
    asked = [x for x, w in zip(leaves, wrt) if w]
    if not pairs:
        return [None] * len(asked), outs
    return list(torch.autograd.grad([o for o, _ in pairs], asked, [c for _, c in pairs], allow_unused=True)), outs


@SETTINGS
@given(cases())
def test_every_torch_entry_point_matches_the_reference(case):
    (n, d, e), dtype, layouts, wrt, outputs, seed = case
    rng = np.random.default_rng(seed)
    inputs = [_tensor(rng, s, dtype, lay) for s, lay in zip(((n, d), (n, d), (n, e)), layouts)]
    before = [x.clone() for x in inputs]
    cots = [_tensor(rng, s, dtype, "contiguous") if name in outputs.split(",") else None
            for s, name in (((n, e), "o"), ((n, n), "a"))]
    tol = DTYPES[dtype][1]
    want, want_outs = _grads(torch_impl.attn_reference, inputs, wrt, cots)
    for name, fn in ENTRY_POINTS.items():
        got, outs = _grads(fn, inputs, wrt, cots)
        for o, r in zip(outs, want_outs):
            torch.testing.assert_close(o.detach(), r.detach(), rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
        for g, r in zip(got, want):
            g = torch.zeros_like(r) if (g is None and r is not None) else g
            r = torch.zeros_like(g) if (r is None and g is not None) else r
            if g is not None:
                torch.testing.assert_close(g, r, rtol=tol, atol=tol, msg=lambda m: f"{name} grads: {m}")
    for x, b in zip(inputs, before):                                   # inputs never modified
        assert torch.equal(x, b)


@settings(SETTINGS, max_examples=15)   # JAX compiles every primitive per new shape: ~1 s an example
@given(cases())
def test_jax_entry_points_match_the_reference(case):
    jax = require_jax()
    import jax.numpy as jnp
    import jax_impl
    (n, d, e), dtype, _, wrt, outputs, seed = case
    rng = np.random.default_rng(seed)
    # jax.enable_x64 from JAX 0.7 on; jax.experimental.enable_x64 before (both public)
    with (jax.enable_x64(True) if hasattr(jax, "enable_x64")
          else __import__("jax.experimental").experimental.enable_x64()):
        inputs = [jnp.asarray(_tensor(rng, s, dtype, "contiguous").numpy()) for s in ((n, d), (n, d), (n, e))]
        used = [i for i, name in enumerate(("o", "a")) if name in outputs.split(",")]
        cots = tuple(jnp.asarray(_tensor(rng, s, dtype, "contiguous").numpy())
                     for i, s in enumerate(((n, e), (n, n))) if i in used)
        idx = [i for i, w in enumerate(wrt) if w]
        tol = DTYPES[dtype][1] * 10

        def restricted(fn):
            def f(*xs):
                full = list(inputs)
                for i, x in zip(idx, xs):
                    full[i] = x
                out = fn(*full)
                return tuple(out[j] for j in used)          # an unused output: a symbolic zero for the rule
            return f

        _, ref_pull = jax.vjp(restricted(jax_impl.attn_reference), *(inputs[i] for i in idx))
        want = ref_pull(cots)
        for fn in (jax_impl.attn, jax_impl.attn_jvp):
            _, pull = jax.vjp(restricted(fn), *(inputs[i] for i in idx))
            for g, r in zip(pull(cots), want):
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=tol, atol=tol)
