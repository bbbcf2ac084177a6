"""Tests of jax_impl.kernels (the Pallas kernels: attn_o, attn_fused) on CPU, where they run under Pallas'
interpreter (``interpret=True``): values and ``jax.vjp`` cotangents against JAX's autodiff of the composite
``tanh(q @ k.T) @ v``, finite differences (``check_grads``, float64, orders 1 and 2), second order (the gradient
of a gradient penalty, and Hessian-vector products), padding (n not a multiple of the tiles),
the causal mask, unused output cotangents (symbolic zeros), no n×n array in attn_o, ``jit`` and ``vmap``, and
the input checks.

Every distinct shape / tile / flag is a fresh XLA compile of the interpreted kernels (about a second each on
this machine), so the shapes are few and shared between tests: n in {1, 33, 100} with tiles 16 (queries) and 32
(keys), d = 5 != e = 3.  float32 tests run with x64 off (the module fixture); the float64 ones switch x64 on
locally with ``jax.enable_x64`` (a context manager: nothing leaks into other test files of the same worker).
"""

import importlib

import numpy as np
import pytest

from tests.conftest import require_jax

jax = require_jax()
require_jax("jax.experimental.pallas")
try:
    importlib.import_module("jax_impl.kernels")          # refuses a JAX older than its MIN_JAX, in one line
except ImportError as exc:  # pragma: no cover - depends on the installed jax
    if "needs JAX >=" not in str(exc):                   # only that refusal skips; any other import error fails
        raise
    pytest.skip(f"the Pallas kernels cannot be imported here: {exc}", allow_module_level=True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import attn_contract  # noqa: E402
import jax_impl  # noqa: E402
from jax_impl import kernels  # noqa: E402
from jax_impl.kernels import KERNEL_MESSAGES, attn_fused, attn_o  # noqa: E402

TILES = dict(block_q=16, block_k=32)
D, E = 5, 3


@pytest.fixture(autouse=True)
def x64_off():
    with jax.enable_x64(False):
        yield


def draw(*shape, dtype=np.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def inputs(n, batch=(), dtype=np.float32, seed=0):
    return (draw(*batch, n, D, dtype=dtype, seed=seed), draw(*batch, n, D, dtype=dtype, seed=seed + 1),
            draw(*batch, n, E, dtype=dtype, seed=seed + 2))


def reference_o(q, k, v, causal=False):
    """The composite, differentiated by JAX: a = tanh(q kᵀ) (masked to key index <= query index), o = a v."""
    a = jnp.tanh(q @ jnp.swapaxes(k, -1, -2))
    if causal:
        n = q.shape[-2]
        a = jnp.where(jnp.tril(jnp.ones((n, n), bool)), a, 0)
    return a @ v


def reference_fused(q, k, v):
    a = jnp.tanh(q @ k.T)
    return jax_impl.AttnOutput(a @ v, a)


def assert_close(actual, expected, tol=1e-5):
    # float32: the kernels sum the n ≤ 100 products of a dot tile by tile, the composite in one GEMM; the two
    # orders differ by rounding of order sqrt(n)·eps of the largest term (~1e-6 relative to the array's scale).
    for got, want in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
        scale = 1.0 + float(jnp.max(jnp.abs(want), initial=0.0))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=tol * scale)


# --- attn_o: values and cotangents ------------------------------------------------------------------------------

@pytest.mark.parametrize("n, causal", [(1, True), (33, False), (100, True)])
def test_attn_o_matches_the_composite(n, causal):
    # A stack of 2: the grid's batch axis.  n = 33 and 100 are not multiples of the tiles (padding).
    q, k, v = inputs(n, batch=(2,))
    o, vjp = jax.vjp(lambda *x: attn_o(*x, causal=causal, **TILES), q, k, v)
    o_ref, vjp_ref = jax.vjp(lambda *x: reference_o(*x, causal=causal), q, k, v)
    assert_close(o, o_ref)
    g = draw(*o.shape, seed=7)
    assert_close(vjp(g), vjp_ref(g))
    if causal:
        # Row 0 attends to key 0 only: o[0] = tanh(q0·k0) v0 (a mask that let a later or padded key into
        # row 0 changes this value).
        np.testing.assert_allclose(o[:, 0], jnp.tanh(jnp.sum(q[:, 0] * k[:, 0], -1, keepdims=True)) * v[:, 0],
                                   rtol=1e-6)


def test_attn_o_two_leading_dims():
    # (2, 1, 33, ·) is run as the stack (2, 33, ·): the same kernels as the n = 33 case above.
    q, k, v = inputs(33, batch=(2, 1))
    o = attn_o(q, k, v, **TILES)
    assert o.shape == (2, 1, 33, E)
    assert_close(o, reference_o(q, k, v))


def test_attn_o_float64_check_grads_and_rounding():
    # float64 (x64 on only here): the kernels equal the composite to rounding, and finite differences agree
    # with the backward kernels (order 1) and with the derivative of the backward (order 2: reverse over reverse,
    # kernels for the values and autodiff of the formulas for the tangents).  Inputs halved: |q kᵀ| stays where
    # tanh is not flat, so the central differences keep their digits.  jit: one compile per derivative order.
    with jax.enable_x64(True):
        q, k, v = (x / 2 for x in inputs(33, dtype=np.float64))
        o, vjp = jax.vjp(lambda *x: attn_o(*x, causal=True, **TILES), q, k, v)
        o_ref, vjp_ref = jax.vjp(lambda *x: reference_o(*x, causal=True), q, k, v)
        assert o.dtype == jnp.float64
        g = draw(*o.shape, dtype=np.float64, seed=7)
        assert_close((o, vjp(g)), (o_ref, vjp_ref(g)), tol=1e-12)
        check_grads(jax.jit(lambda *x: attn_o(*x, causal=True, **TILES)), (q, k, v), order=2, modes=["rev"])


def test_attn_o_bfloat16():
    # bfloat16 in and out, float32 inside: against the float32 composite on the same (rounded) inputs.  The
    # tolerance is bfloat16's resolution (2⁻⁸ ≈ 4e-3 relative; a few roundings deep: a, the results; measured
    # 2.7e-3 of the scale here), not float32's.
    q, k, v = (x.astype(jnp.bfloat16) for x in inputs(33, batch=(2,)))
    o, vjp = jax.vjp(lambda *x: attn_o(*x, causal=True, **TILES), q, k, v)
    assert o.dtype == jnp.bfloat16
    g = draw(*o.shape, seed=7).astype(jnp.bfloat16)
    f32 = [x.astype(jnp.float32) for x in (q, k, v, g)]
    o_ref, vjp_ref = jax.vjp(lambda *x: reference_o(*x, causal=True), *f32[:3])
    grads = vjp(g)
    assert all(x.dtype == jnp.bfloat16 for x in grads)
    assert_close([x.astype(jnp.float32) for x in (o, *grads)], [o_ref, *vjp_ref(f32[3])], tol=1e-2)


def _avals(jaxpr):
    """Every intermediate's shape in a jaxpr, descending into sub-jaxprs (jit, custom_vjp) but not into a
    pallas_call's kernel (whose tiles live in registers / VMEM): its inputs and outputs are listed."""
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(var.aval.shape) for var in eqn.outvars]
        if eqn.primitive.name == "pallas_call":
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes += _avals(inner)
    return shapes


def test_attn_o_builds_no_square_array():
    n = 100                                                         # padded to 128 by the tiles
    q, k, v = inputs(n, batch=(2,))

    def loss(q, k, v):
        return jnp.sum(jnp.sin(attn_o(q, k, v, causal=True, **TILES)))

    shapes = _avals(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr)
    assert shapes and not [s for s in shapes if len(s) >= 2 and min(s[-2:]) >= n], shapes
    # The same walk does see the composite's n×n scores (the check can fail).
    ref = _avals(jax.make_jaxpr(jax.grad(lambda *x: jnp.sum(jnp.sin(reference_o(*x))), (0, 1, 2)))(q, k, v).jaxpr)
    assert (2, n, n) in ref


def test_attn_o_jit_of_vmap_default_tiles():
    # vmap over the leading axis of 2-D examples (pallas_call's batching rule adds a grid axis), under jit, with
    # the default tiles (64: one tile covers n = 33 after padding).  One compile for all of it.
    q, k, v = inputs(33, batch=(2,))

    def value_and_grad(fn):
        loss = lambda q, k, v: (lambda o: (jnp.sum(jnp.sin(o)), o))(fn(q, k, v))  # noqa: E731
        return jax.vmap(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))

    (_, o), grads = jax.jit(value_and_grad(lambda *x: attn_o(*x, causal=True)))(q, k, v)
    (_, o_ref), grads_ref = value_and_grad(lambda *x: reference_o(*x, causal=True))(q, k, v)
    assert_close(o, o_ref)
    assert_close(grads, grads_ref)


def test_attn_o_has_no_forward_mode():
    q, k, v = inputs(4)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(lambda q: attn_o(q, k, v, **TILES), (q,), (q,))
    with pytest.raises(ValueError) as info:
        jax_impl.attn_o_jvp(q, k, v[:3])                           # the same contract, under its own name
    assert str(info.value) == KERNEL_MESSAGES["n"].format(fn="attn_o_jvp", q=(4, D), k=(4, D), v=(3, E))


def test_attn_o_jvp_matches_the_composite():
    # Forward mode by the JVP kernel (36), causal, n = 33 (padded): all three tangents, then k's alone (the
    # others are symbolic zeros, so their terms are not compiled: a second kernel).
    q, k, v = inputs(33, batch=(2,))
    tangents = tuple(draw(*x.shape, seed=10 + i) for i, x in enumerate((q, k, v)))
    fn = lambda *x: jax_impl.attn_o_jvp(*x, causal=True, **TILES)  # noqa: E731
    ref = lambda *x: reference_o(*x, causal=True)  # noqa: E731
    assert_close(jax.jvp(fn, (q, k, v), tangents), jax.jvp(ref, (q, k, v), tangents))
    assert_close(jax.jvp(lambda k: fn(q, k, v), (k,), (tangents[1],)),
                 jax.jvp(lambda k: ref(q, k, v), (k,), (tangents[1],)))


def test_attn_o_jvp_check_grads_float64_and_no_reverse_mode():
    with jax.enable_x64(True):
        q, k, v = (x / 2 for x in inputs(33, dtype=np.float64))
        fn = lambda *x: jax_impl.attn_o_jvp(*x, causal=True, **TILES)  # noqa: E731
        check_grads(fn, (q, k, v), order=1, modes=["fwd"])
    # Reverse mode would transpose the tangent kernel's pallas_call: JAX refuses (attn_o is the reverse-mode
    # entry).
    q, k, v = inputs(4)
    with pytest.raises(NotImplementedError, match="reverse-mode differentiation"):
        jax.grad(lambda q: jnp.sum(jax_impl.attn_o_jvp(q, k, v, **TILES)))(q)


def test_attn_o_jvp_jacfwd_and_linearize():
    # The primal output depends on the primals only (its own forward kernel), the tangent kernel reads both: so
    # jacfwd (vmap over the tangents, the primal unbatched) and linearize (the primal known, the tangent staged
    # out) work.  With one kernel writing o and ȯ together, jacfwd raised "at vmap out_axes[0], got axis spec None
    # but output was batched" and linearize "Linearization failed to produce known values for all output
    # primals".  Causal, n = 5 (padded to one tile), d = 5, e = 3: a Jacobian of 15 × 25 per input.
    q, k, v = inputs(5)
    fn = lambda *x: jax_impl.attn_o_jvp(*x, causal=True, **TILES)  # noqa: E731
    ref = lambda *x: reference_o(*x, causal=True)  # noqa: E731
    assert_close(jax.jacfwd(fn, argnums=(0, 1, 2))(q, k, v), jax.jacfwd(ref, argnums=(0, 1, 2))(q, k, v))
    o, lin = jax.linearize(fn, q, k, v)
    o_ref, lin_ref = jax.linearize(ref, q, k, v)
    tangents = tuple(draw(*x.shape, seed=10 + i) for i, x in enumerate((q, k, v)))
    assert_close((o, lin(*tangents)), (o_ref, lin_ref(*tangents)))


# --- second order: gradient penalties (grad of grad) and Hessian-vector products (jvp of grad) ------------------

def _penalty_and_hvp(loss, args, tangents):
    """``grad`` of the gradient penalty ``Σ ||∂loss/∂x||²`` (reverse over reverse, as WGAN-GP / R1 train), and
    the Hessian-vector product ``jvp(grad(loss))`` (forward over reverse), in one ``jit`` (one compile)."""
    grad = jax.grad(loss, argnums=(0, 1, 2))
    penalty = lambda *x: sum(jnp.sum(g ** 2) for g in grad(*x))  # noqa: E731
    return jax.jit(lambda *x: (jax.grad(penalty, argnums=(0, 1, 2))(*x), jax.jvp(grad, x, tangents)[1]))(*args)


@pytest.mark.parametrize("causal, dtype, tol", [(False, np.float32, 1e-5), (True, np.float64, 1e-12)])
def test_attn_o_second_order(causal, dtype, tol):
    # A loss linear in o (its G_O is a constant w): the penalty's gradient runs entirely through the derivative of
    # the backward kernels.  Stack of 2, n = 33 (padded), against JAX's autodiff of the composite.  float32: the
    # tolerance of assert_close (measured 6e-7 of the scale); float64: rounding.  (Causal float32 and non-causal
    # float64 cost a compile each and exercise no other code; float64 order 2 by finite differences, causal:
    # test_attn_o_float64_check_grads_and_rounding.)
    with jax.enable_x64(dtype == np.float64):
        q, k, v = inputs(33, batch=(2,), dtype=dtype)
        w = draw(2, 33, E, dtype=dtype, seed=7)
        tangents = tuple(draw(*x.shape, dtype=dtype, seed=10 + i) for i, x in enumerate((q, k, v)))
        got = _penalty_and_hvp(lambda *x: jnp.sum(attn_o(*x, causal=causal, **TILES) * w), (q, k, v), tangents)
        want = _penalty_and_hvp(lambda *x: jnp.sum(reference_o(*x, causal=causal) * w), (q, k, v), tangents)
        assert_close(got, want, tol=tol)


def test_attn_o_third_order():
    # Each derivative rule gives its value through its own custom_jvp again, so a third differentiation meets the
    # formulas' tangent rather than a bare pallas_call (whose JVP cannot be transposed).  n = 17 (padded), q only.
    q, k, v = inputs(17)

    def third(fn):
        grad = jax.grad(lambda q: jnp.sum(jnp.sin(fn(q, k, v))))
        return jax.jit(jax.grad(lambda q: jnp.sum(jax.grad(lambda q: jnp.sum(grad(q) ** 2))(q) ** 2)))(q)

    # float32, the tolerance of assert_close (measured 4e-7 of the scale).
    assert_close(third(lambda *x: attn_o(*x, causal=True, **TILES)), third(lambda *x: reference_o(*x, causal=True)))


@pytest.mark.parametrize("shapes", [((0, D), (0, D), (0, E)), ((3, 0), (3, 0), (3, E)), ((3, D), (3, D), (3, 0)),
                                    ((0, 3, D), (0, 3, D), (0, 3, E))])
def test_attn_o_empty_sizes(shapes):
    q, k, v = (jnp.zeros(s, jnp.float32) + 0.5 for s in shapes)
    o = attn_o(q, k, v, **TILES)
    assert o.shape == shapes[2] and o.dtype == jnp.float32
    np.testing.assert_array_equal(o, reference_o(q, k, v))          # d = 0: tanh(0) = 0, so o = 0
    grads = jax.grad(lambda *x: jnp.sum(attn_o(*x, **TILES)), (0, 1, 2))(q, k, v)
    assert [g.shape for g in grads] == list(shapes)


# --- attn_fused: the lab's op ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 100])         # n = 33: the one-output tests below
def test_attn_fused_matches_the_composite(n):
    q, k, v = inputs(n)
    out, vjp = jax.vjp(lambda *x: attn_fused(*x, **TILES), q, k, v)
    out_ref, vjp_ref = jax.vjp(reference_fused, q, k, v)
    assert_close(out, out_ref)
    ct = jax_impl.AttnOutput(draw(n, E, seed=7), draw(n, n, seed=8))  # both cotangents given
    assert_close(vjp(ct), vjp_ref(ct))


def _backward_kernels(fn, *args):
    """The pallas_calls of a gradient's jaxpr after the forward one: [(number of inputs, output shapes)]."""
    calls = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                calls.append((len(eqn.invars), [tuple(v.aval.shape) for v in eqn.outvars]))
                continue
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return calls[1:]


@pytest.mark.parametrize("output", ["o", "a"])
def test_attn_fused_one_output_unused(output):
    # The other output's cotangent is a symbolic zero: never built, never read by the kernels.
    n = 33
    q, k, v = inputs(n)
    idx = {"o": 0, "a": 1}[output]

    def loss(fn):
        return lambda *x: jnp.sum(jnp.sin(fn(*x)[idx]))

    fused = loss(lambda *x: attn_fused(*x, **TILES))
    grads = jax.grad(fused, (0, 1, 2))(q, k, v)
    assert_close(grads, jax.grad(loss(reference_fused), (0, 1, 2))(q, k, v))
    kernels_run = _backward_kernels(jax.grad(fused, (0, 1, 2)), q, k, v)
    # dK/dV then dQ; inputs q, k, v, a and the one given cotangent (5, not 6: no n×n zero G_A, no zero G_O).
    assert [count for count, _ in kernels_run] == [5, 5], kernels_run
    padded = (1, 64, 16)                                            # n = 33 padded to 64 rows, d and e to 16
    if output == "a":
        # No G_O: (35)'s G_V is not computed (a = tanh(q kᵀ) does not depend on v): one output, dK only.
        assert kernels_run[0][1] == [padded], kernels_run
        np.testing.assert_array_equal(grads[2], np.zeros_like(v))
    else:
        assert kernels_run[0][1] == [padded, padded], kernels_run
    # No kernel writes an n×n array (Ĝ_A, G_X stay in tiles).
    assert all(shape == padded for _, shapes in kernels_run for shape in shapes), kernels_run


def test_attn_fused_check_grads_float64():
    # As test_attn_o_float64_check_grads_and_rounding: orders 1 and 2 (both cotangents given), halved inputs.
    with jax.enable_x64(True):
        q, k, v = (x / 2 for x in inputs(33, dtype=np.float64))
        check_grads(jax.jit(lambda *x: attn_fused(*x, **TILES)), (q, k, v), order=2, modes=["rev"])


@pytest.mark.parametrize("outputs", ["o", "a"])
def test_attn_fused_second_order(outputs):
    # Gradient penalty and HVP, float32, n = 33 (padded), a loss linear in o (no G_A: a symbolic zero in the
    # backward) and one linear in a (no G_O: the backward's g_v is None, and so is its tangent).  Both cotangents
    # given: test_attn_fused_check_grads_float64 (order 2).  The tolerance of assert_close, as above.
    q, k, v = inputs(33)
    w, w_a = draw(33, E, seed=7), draw(33, 33, seed=8)
    tangents = tuple(draw(*x.shape, seed=10 + i) for i, x in enumerate((q, k, v)))

    def loss(fn):
        def value(*x):
            out = fn(*x)
            return jnp.sum(out.o * w) if outputs == "o" else jnp.sum(out.a * w_a)
        return value

    got = _penalty_and_hvp(loss(lambda *x: attn_fused(*x, **TILES)), (q, k, v), tangents)
    assert_close(got, _penalty_and_hvp(loss(reference_fused), (q, k, v), tangents))


def test_attn_fused_backward_with_no_cotangent():
    q, k, v = inputs(5)
    a = jnp.tanh(q @ k.T)
    g_q, g_k, g_v = kernels.fused_backward(None, None, q, k, v, a, **TILES)
    np.testing.assert_array_equal(g_q, np.zeros_like(q))
    np.testing.assert_array_equal(g_k, np.zeros_like(k))
    assert g_v is None


def test_attn_fused_jit_of_vmap():
    q, k, v = inputs(33, batch=(2,))

    def value_and_grad(fn):
        def loss(q, k, v):
            out = fn(q, k, v)
            return jnp.sum(jnp.sin(out.o)) + jnp.sum(out.a ** 2), out
        return jax.vmap(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))

    (_, out), grads = jax.jit(value_and_grad(lambda *x: attn_fused(*x, **TILES)))(q, k, v)
    (_, out_ref), grads_ref = value_and_grad(reference_fused)(q, k, v)
    assert_close(out, out_ref)
    assert_close(grads, grads_ref)


def test_attn_fused_empty():
    out = attn_fused(jnp.zeros((0, D)), jnp.zeros((0, D)), jnp.zeros((0, E)), **TILES)
    assert out.o.shape == (0, E) and out.a.shape == (0, 0)


def test_jax_impl_exports_attn_o():
    assert jax_impl.attn_o is attn_o and jax_impl.kernels is kernels
    assert jax_impl.attn_o_jvp is kernels.attn_o_jvp


def test_interpret_defaults_to_the_cpu_backend():
    assert kernels.default_interpret() == (jax.default_backend() == "cpu")


# --- input checks: before any compute, naming the argument ---------------------------------------------------

def _message(key, **fields):
    return KERNEL_MESSAGES[key].format(fn="attn_o", **fields)


@pytest.mark.parametrize("args, exc, text", [
    (([[1.0]], "k", "v"), TypeError, attn_contract.message("type", "attn_o", name="q",
                                                             accepted="jax.Array or numpy.ndarray", type="list")),
    ((np.zeros(3, np.float32), None, None), ValueError,
     _message("ndim", name="q", dims="..., n, d", ndim=1, shape=(3,))),
    ((np.zeros((2, 2), np.complex64),) * 3, TypeError, _message("dtype", name="q", dtype="complex64")),
    ((np.zeros((2, 2), np.int32),) * 3, TypeError, _message("dtype", name="q", dtype="int32")),
    ((np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32), np.zeros((2, 1), np.float32)), ValueError,
     _message("d", q=(2, 3), k=(2, 4))),
    ((np.zeros((2, 3, 4), np.float32), np.zeros((1, 3, 4), np.float32), np.zeros((2, 3, 1), np.float32)),
     ValueError, _message("n", q=(2, 3, 4), k=(1, 3, 4), v=(2, 3, 1))),
    ((np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32), np.zeros((2, 1), np.float32)), ValueError,
     _message("n", q=(3, 4), k=(3, 4), v=(2, 1))),
    ((np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float16), np.zeros((3, 1), np.float32)), TypeError,
     attn_contract.message("same_dtype", "attn_o", q="float32", k="float16", v="float32")),
])
def test_attn_o_input_errors(args, exc, text):
    q, k, v = (a if not isinstance(a, str) and a is not None else np.zeros((2, 2), np.float32) for a in args)
    with pytest.raises(exc) as info:
        attn_o(q, k, v)
    assert str(info.value) == text


def test_causal_must_be_a_bool():
    q = np.zeros((2, 2), np.float32)
    with pytest.raises(TypeError) as info:
        attn_o(q, q, q, causal=1)
    assert str(info.value) == _message("causal", type="int")


def test_messages_match_torch_impl():
    # attn_o's contract is worded once per framework: the same text where the two contracts agree (torch also
    # takes complex dtypes and checks devices).
    o_only = pytest.importorskip("torch_impl.kernels.o_only")
    for key in ("ndim", "d", "n", "causal"):
        assert KERNEL_MESSAGES[key].replace("{fn}", "attn_o") == o_only.MESSAGES[key], key


@pytest.mark.parametrize("block", [0, -16, 16.0, True])
def test_block_sizes_are_checked(block):
    q = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="block_q must be a positive int or None"):
        attn_o(q, q, q, block_q=block)
    with pytest.raises(ValueError, match="block_k must be a positive int or None"):
        attn_fused(q, q, q, block_k=block)
    with pytest.raises(ValueError, match="num_warps must be a positive int or None"):
        jax_impl.attn_o_jvp(q, q, q, num_warps=block)
    with pytest.raises(ValueError, match="num_stages must be a positive int or None"):
        attn_o(q, q, q, num_stages=block)


# --- launch configurations: one record per kernel, data chosen by the GPU-static check ------------------------

def test_launch_configs_are_records_per_kernel_dtype_and_width():
    for kernel in kernels.KERNELS:
        for dtype in ("bfloat16", "float16", "float32"):
            for d in (16, 64, 100, 128, 256):
                bs = kernels.launch_config(kernel, dtype, d, d)
                assert isinstance(bs, kernels.LaunchConfig)
                assert all(isinstance(x, int) and x > 0 for x in bs), (kernel, dtype, d, bs)
                assert bs.block_q & (bs.block_q - 1) == 0 and bs.block_k & (bs.block_k - 1) == 0
    # The widest padded head dimension picks the column: d = 100 pads to 128; e wider than d counts.
    assert kernels.launch_config("o_dkdv", "bfloat16", 100, 8) == \
        kernels.launch_config("o_dkdv", "bfloat16", 128, 128)
    assert kernels.launch_config("o_dkdv", "float32", 8, 256) == \
        kernels.launch_config("o_dkdv", "float32", 256, 256)
    with pytest.raises(ValueError, match="kernel must be one of o_forward"):
        kernels.launch_config("forward", "float32", 64, 64)


def test_given_sizes_replace_the_defaults_field_by_field():
    from jax_impl.kernels import pallas_attn as P
    cfg = P._config("attn_o", False, None, 32, None, 1, True)
    want = kernels.launch_config("o_dq", "bfloat16", 64, 64)._replace(block_k=32, num_stages=1)
    assert P._launch("o_dq", cfg, jnp.bfloat16, 64, 64) == want


def test_kernels_select_pallas_triton_backend():
    # Without compiler_params JAX >= 0.10 lowers a pallas_call with Mosaic GPU, where these kernels fail; the
    # Triton backend's record carries the launch's num_warps / num_stages under this JAX's name for it.
    from jax_impl.kernels import pallas_attn as P
    params = P._triton_params(8, 2)
    if isinstance(params, dict):                                   # JAX 0.4.30's form
        assert params == {"triton": {"num_warps": 8, "num_stages": 2}}
    else:
        assert (params.num_warps, params.num_stages) == (8, 2) and "mosaic" not in type(params).__module__


LOWERED = {"attn_o": lambda q, k, v: attn_o(q[None], k[None], v[None], causal=True, interpret=False),
           "attn_o grad": lambda q, k, v: jax.grad(lambda *x: jnp.sum(attn_o(*x, interpret=False)), (0, 1, 2))(
               q[None], k[None], v[None]),
           "attn_o_jvp": lambda q, k, v: jax.jvp(lambda *x: jax_impl.attn_o_jvp(*x, interpret=False), (q, k, v),
                                                 (q, k, v)),
           "attn_fused vjp": lambda q, k, v: jax.grad(lambda *x: jnp.sum(attn_fused(*x, interpret=False).a),
                                                      (0, 1, 2))(q, k, v)}


@pytest.mark.parametrize("entry", sorted(LOWERED))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_entry_lowers_for_cuda_on_triton(entry, dtype):
    # jax.export for CUDA needs no GPU: under the installed JAX's defaults each entry lowers to Pallas' Triton
    # custom call.  Before the kernels passed compiler_params, Mosaic GPU was picked: here (no Mosaic GPU
    # installed) "Cannot lower pallas_call on platform: gpu", with jax-cuda13-plugin "exceeds available shared
    # memory" / "Unimplemented primitive ... dot_general".  16-bit kernels carry the hardware tanh
    # (tanh.approx.f32, one MUFU.TANH: its inline assembly is in the embedded Triton module's bytes), float32 ones
    # libdevice's accurate tanhf.  benchmarks/gpu_static/pallas_side.py compiles those modules for sm_90a / sm_80.
    shape = jax.ShapeDtypeStruct((256, 128), getattr(jnp, dtype))
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    text = jax.export.export(jax.jit(LOWERED[entry]), platforms=["cuda"], disabled_checks=checks)(
        shape, shape, shape).mlir_module()
    assert "__gpu$xla.gpu.triton" in text and "mosaic" not in text.lower()
    assert ("tanh.approx.f32" in text) == (dtype == "bfloat16")


def test_gpu_static_reads_the_embedded_triton_modules():
    # benchmarks/gpu_static/pallas_side.py takes each Triton custom call out of the lowered module: its name, the
    # Triton-dialect module as text (what it compiles for sm_90a / sm_80), and the launch options the kernel asked
    # for -- the default record of its launch.
    pallas_side = pytest.importorskip("benchmarks.gpu_static.pallas_side")
    shape = jax.ShapeDtypeStruct((1, 256, 128), jnp.bfloat16)
    exported = pallas_side.lower(lambda q, k, v: attn_o(q, k, v, causal=True, interpret=False), [shape] * 3)
    [module] = pallas_side.triton_modules(exported)
    bs = kernels.launch_config("o_forward", "bfloat16", 128, 128)
    assert module["name"] == "tanh_attn_o_forward"
    assert (module["num_warps"], module["num_stages"]) == (bs.num_warps, bs.num_stages)
    assert module["grid"] == (1, 256 // bs.block_q, 1)
    assert "tt.func" in module["ttir"] and "tanh.approx.f32" in module["ttir"]


# --- tanh in the kernels ---------------------------------------------------------------------------------------

def test_kernel_tanh_keeps_relative_precision_at_small_scores():
    # Issue 37: a = tanh x ≈ x for small |x|; a 2σ(2x) − 1 or exp(−2|x|) form keeps absolute precision only (a = 0
    # below |x| ≈ 3e-8).  o_i = tanh(q_i · k_0) v_0 with k_0 = e_1, v_0 = 1 and every other key and value zero:
    # o is the kernels' tanh of each |x| in [1e-30, 10] (and its negative), within 4 float32 ulps relative.
    x = np.concatenate([np.geomspace(1e-30, 10, 2000), -np.geomspace(1e-30, 10, 48)]).astype(np.float32)
    n = x.size
    q = np.zeros((n, D), np.float32)
    q[:, 0] = x
    k = np.zeros((n, D), np.float32)
    k[0, 0] = 1
    v = np.zeros((n, 1), np.float32)
    v[0, 0] = 1
    for o in (attn_o(q, k, v), jax_impl.attn_o_jvp(q, k, v), attn_fused(q, k, v).o):
        want = np.tanh(x.astype(np.float64))
        ulps = np.abs(np.asarray(o)[:, 0] - want) / np.spacing(np.abs(want).astype(np.float32))
        assert ulps.max() <= 4, (ulps.max(), x[ulps.argmax()])


# bfloat16 in the slow tier (14 s through the interpreter on 2 cores): float16's run covers the same path with the
# smaller tolerance, and the Triton side tests both dtypes by default.
@pytest.mark.parametrize("dtype, tol", [pytest.param(jnp.bfloat16, 1e-2, marks=pytest.mark.slow),
                                        (jnp.float16, 5e-3)])
def test_hardware_tanh_error_bound_keeps_outputs_within_tolerance(monkeypatch, dtype, tol):
    # On the GPU the 16-bit kernels' tanh is tanh.approx.f32, relative error <= 2^-10.987 (PTX ISA).  The
    # interpreter cannot run it, so here the kernels' tanh is the exact one perturbed by that bound in the worst
    # direction for a sum (every a scaled by 1 + bound): o and the gradients stay within the dtype's tolerance of
    # the float32 composite.  bfloat16: this file's 1e-2 (test_attn_o_bfloat16); measured 2.7e-3 exact, 4.0e-3
    # perturbed.  float16: 5e-3, half of bfloat16's; measured 3.4e-4 with the exact tanh, 2.5e-3 perturbed (G_Q:
    # the bias is the same sign in every term of its sum and 1 - a² loses 2·bound·a² absolutely) -- the hardware
    # tanh costs float16 about five of its ulps at worst, stated in docs/kernels-pallas.md.  crosscheck checks
    # float32 / float64 only, whose kernels keep the accurate tanh.  The same check with 16× the bound fails (the
    # perturbation is seen: 3.9e-2 / 3.8e-2).
    from jax_impl.kernels import pallas_attn as P
    q, k, v = (x.astype(dtype) for x in inputs(33, batch=(2,)))
    g = draw(2, 33, E, seed=7).astype(dtype)
    f32 = [x.astype(jnp.float32) for x in (q, k, v, g)]
    o_ref, vjp_ref = jax.vjp(lambda *x: reference_o(*x, causal=True), *f32[:3])
    want = [o_ref, *vjp_ref(f32[3])]

    def run(bound):
        # The drivers are jitted: a kernel traced with another tanh (by this test or an earlier one) must not be
        # served from the cache, nor a perturbed one to the tests after this one.
        jax.clear_caches()
        monkeypatch.setattr(P, "_tanh", lambda x, fast: jnp.tanh(x) * (1 + bound))
        o, vjp = jax.vjp(lambda *x: attn_o(*x, causal=True, **TILES), q, k, v)
        return [x.astype(jnp.float32) for x in (o, *vjp(g))]

    try:
        assert_close(run(kernels.APPROX_TANH_REL_ERROR), want, tol=tol)
        with pytest.raises(AssertionError):
            assert_close(run(16 * kernels.APPROX_TANH_REL_ERROR), want, tol=tol)
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_attn_fused_input_errors():
    q = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError) as info:
        attn_fused(q, q, np.zeros((3, 1), np.float32))
    assert str(info.value) == attn_contract.message("n", "attn_fused", q=(2, 3), k=(2, 3), v=(3, 1))
    c = np.zeros((2, 3), np.complex64)
    with pytest.raises(TypeError) as info:
        attn_fused(c, c, c)
    assert str(info.value) == KERNEL_MESSAGES["dtype"].format(fn="attn_fused", name="q", dtype="complex64")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_is_the_composite_per_stack_member_and_checks_as_attn_o(causal):
    """``kernels.attn_o_reference`` (crosscheck's oracle of ``attn_o``): on a stack, each member's
    ``tanh(q kᵀ [masked]) v`` written out here; a bad input gets ``attn_o``'s error."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 5, m)), jnp.float32) for m in (3, 3, 4))
    keep = np.tril(np.ones((5, 5), bool)) if causal else np.ones((5, 5), bool)
    want = np.stack([np.where(keep, np.tanh(np.asarray(q[b]) @ np.asarray(k[b]).T), 0) @ np.asarray(v[b])
                     for b in range(2)])
    np.testing.assert_allclose(kernels.attn_o_reference(q, k, v, causal=causal), want, rtol=1e-5, atol=1e-6)
    bad = jnp.zeros((2, 5, 3), jnp.int32)
    for fn in (kernels.attn_o_reference, attn_o):
        with pytest.raises(TypeError, match=r"attn_o\(\): argument 'q' must have a real floating-point dtype"):
            fn(bad, k, v, causal=causal)
