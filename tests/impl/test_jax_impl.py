"""Tests of jax_impl: the hand-written VJP (custom_vjp) and JVP (custom_jvp) against JAX's own autodiff of the
plain composite, jax.test_util.check_grads (finite differences, to order 2), transforms, errors, empty sizes.

Skips cleanly where JAX is not installed.  float64 / complex128 need x64: the ``x64`` fixture switches it on for
this module through ``jax.config`` and restores the previous value afterwards, so nothing leaks into other test
modules of the same pytest process.
"""

import re

import numpy as np
import pytest

from tests.conftest import require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402
import jax.ad_checkpoint  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import jax_impl  # noqa: E402
from jax_impl import formulas  # noqa: E402
from tests.conftest import jax_inputs  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


# (n, d, e): n=1 / d=1 / e=1, and d != e both ways (d < e, d > e).  Kept to four so the file stays within its
# time budget on a loaded 2-core machine (every shape is a fresh trace and compile).
SHAPES = [(1, 1, 1), (4, 1, 3), (3, 2, 1), (5, 3, 4)]

# Comparisons of two float64 computations of the same math (hand formula vs JAX autodiff) differ only by
# rounding: a few ulps per element, accumulated over dot products of length <= 6.
TIGHT = dict(rtol=1e-12, atol=1e-13)


def random_like(tree, seed):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    rng = np.random.default_rng(seed)
    out = []
    for x in leaves:
        r = rng.standard_normal(x.shape)
        if jnp.iscomplexobj(x):
            r = r + 1j * rng.standard_normal(x.shape)
        out.append(jnp.asarray(r.astype(x.dtype)))
    return jax.tree_util.tree_unflatten(treedef, out)


def assert_trees_close(actual, expected, **tol):
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, **tol), actual, expected)


# --- finite differences (check_grads) -------------------------------------------------------------------------

# Finite differences to second order compile each shape anew (2-3 s a shape on 2 cores): the first and the last
# shape (a 1x1x1 corner and the general n != d != e case) in the README's test command, the two between in the slow
# tier; test_vjp_matches_autodiff checks every shape.
CHECK_GRADS_SHAPES = [SHAPES[0], *(pytest.param(s, marks=pytest.mark.slow) for s in SHAPES[1:-1]), SHAPES[-1]]


@pytest.mark.parametrize("shape", CHECK_GRADS_SHAPES)
def test_check_grads_custom_vjp(shape):
    # custom_vjp has no forward mode, so only 'rev' (to second order: the bwd rule is differentiated too).
    check_grads(jax_impl.attn, jax_inputs(*shape), order=2, modes=["rev"])


@pytest.mark.parametrize("shape", CHECK_GRADS_SHAPES)
def test_check_grads_custom_jvp(shape):
    check_grads(jax_impl.attn_jvp, jax_inputs(*shape), order=2, modes=["fwd", "rev"])


@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp], ids=["attn", "attn_jvp"])
def test_check_grads_complex128(fn):
    modes = ["rev"] if fn is jax_impl.attn else ["fwd", "rev"]
    # Complex tanh has poles at x = i(π/2 + mπ); with unit-variance entries some x = q kᵀ land near one, where
    # second derivatives are ~1e3 and central differences lose digits (seen: 1.1e-5 relative).  Halving the
    # inputs keeps |x| away from the poles so check_grads' default tolerances test the math, not conditioning.
    q, k, v = jax_inputs(3, 2, 4, np.complex128)
    check_grads(fn, (q / 2, k / 2, v), order=2, modes=modes)


# --- hand formulas == JAX autodiff of the composite, to rounding --------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("shape", SHAPES)
def test_vjp_matches_autodiff(shape, dtype):
    q, k, v = jax_inputs(*shape, dtype)
    out_ref, vjp_ref = jax.vjp(jax_impl.attn_reference, q, k, v)
    out, vjp = jax.vjp(jax_impl.attn, q, k, v)
    ct = random_like(out_ref, seed=1)                               # both output cotangents given
    expected = vjp_ref(ct)
    assert_trees_close(out, out_ref, **TIGHT)
    assert_trees_close(vjp(ct), expected, **TIGHT)
    # The formula itself, called directly (JAX's convention: same as jax.vjp, no conjugates, (18)-(22)).
    assert_trees_close(formulas.attn_backward(ct.o, ct.a, q, k, v, out_ref.a), expected, **TIGHT)
    # JAX derives attn_jvp's reverse mode by transposing the JVP rule: an independent check of (14)-(16).
    _, vjp_t = jax.vjp(jax_impl.attn_jvp, q, k, v)
    assert_trees_close(vjp_t(ct), expected, **TIGHT)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("shape", SHAPES)
def test_jvp_matches_autodiff(shape, dtype):
    primals = jax_inputs(*shape, dtype)
    tangents = random_like(primals, seed=2)
    out_ref, dout_ref = jax.jvp(jax_impl.attn_reference, primals, tangents)
    out, dout = jax.jvp(jax_impl.attn_jvp, primals, tangents)
    assert_trees_close(out, out_ref, **TIGHT)
    assert_trees_close(dout, dout_ref, **TIGHT)
    q, k, v = primals
    assert_trees_close(formulas.attn_jvp(q, k, v, out_ref.a, *tangents), tuple(dout_ref), **TIGHT)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_jvp_single_tangent(which):
    # Tangents for one argument only: JAX passes the others to the rule as SymbolicZero (-> None in formulas).
    primals = jax_inputs(5, 3, 2)
    tangent = random_like(primals[which], seed=3)

    def restrict(fn):
        return lambda x: fn(*primals[:which], x, *primals[which + 1:])

    expected = jax.jvp(restrict(jax_impl.attn_reference), (primals[which],), (tangent,))
    actual = jax.jvp(restrict(jax_impl.attn_jvp), (primals[which],), (tangent,))
    assert_trees_close(actual, expected, **TIGHT)
    # The formula with None for the absent tangents equals the formula with dense zeros.
    q, k, v = primals
    a = jnp.tanh(q @ k.T)
    dense = [jnp.zeros_like(p) for p in primals]
    dense[which] = tangent
    sparse = [None, None, None]
    sparse[which] = tangent
    assert_trees_close(formulas.attn_jvp(q, k, v, a, *sparse), formulas.attn_jvp(q, k, v, a, *dense), **TIGHT)


def test_jacfwd_and_jacrev_agree():
    q, k, v = jax_inputs(3, 2, 4)
    jac_fwd = jax.jacfwd(jax_impl.attn_jvp, argnums=(0, 1, 2))(q, k, v)
    jac_rev = jax.jacrev(jax_impl.attn, argnums=(0, 1, 2))(q, k, v)
    jac_ref = jax.jacrev(jax_impl.attn_reference, argnums=(0, 1, 2))(q, k, v)
    assert_trees_close(jac_fwd, jac_ref, **TIGHT)
    assert_trees_close(jac_rev, jac_ref, **TIGHT)


def test_custom_vjp_has_no_forward_mode():
    # JAX's design, and why attn_jvp exists.
    q, k, v = jax_inputs(2, 2, 2)
    # TypeError "can't apply forward-mode autodiff" through JAX 0.10; a bare NotImplementedError in some
    # versions with symbolic_zeros=True (jax-ml/jax#39004).  Either way: forward mode is refused.
    with pytest.raises((TypeError, NotImplementedError)):
        jax.jvp(jax_impl.attn, (q, k, v), (q, k, v))


# --- losses that use one output only (symbolic zero cotangent for the other) ---------------------------------

def _loss(fn, output):
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)[output]))   # nonlinear, so the cotangent is not constant


@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp], ids=["attn", "attn_jvp"])
@pytest.mark.parametrize("output", ["o", "a"])
def test_grad_of_one_output(fn, output):
    idx = {"o": 0, "a": 1}[output]
    q, k, v = jax_inputs(5, 3, 4)
    expected = jax.grad(_loss(jax_impl.attn_reference, idx), argnums=(0, 1, 2))(q, k, v)
    actual = jax.grad(_loss(fn, idx), argnums=(0, 1, 2))(q, k, v)
    assert_trees_close(actual, expected, **TIGHT)
    if output == "a":                                               # a = tanh(q kᵀ) does not depend on v
        np.testing.assert_array_equal(actual[2], np.zeros_like(v))


def test_backward_none_equals_zeros():
    q, k, v = jax_inputs(4, 3, 2)
    a = jnp.tanh(q @ k.T)
    g_o, g_a = random_like((jnp.zeros((4, 2)), a), seed=4)
    zero_o, zero_a = jnp.zeros_like(g_o), jnp.zeros_like(g_a)
    assert_trees_close(formulas.attn_backward(None, g_a, q, k, v, a)[:2],
                       formulas.attn_backward(zero_o, g_a, q, k, v, a)[:2], **TIGHT)
    assert formulas.attn_backward(None, g_a, q, k, v, a)[2] is None    # G_V = Aᵀ G_O (22) skipped
    assert_trees_close(formulas.attn_backward(g_o, None, q, k, v, a),
                       formulas.attn_backward(g_o, zero_a, q, k, v, a), **TIGHT)


def test_residuals_are_inputs_and_a_only(capsys):
    # fwd saves q, k, v and the output a = tanh(x); never x = q kᵀ (tanh is not recomputed).
    q, k, v = jax_inputs(6, 3, 2)
    jax.ad_checkpoint.print_saved_residuals(jax_impl.attn, q, k, v)
    lines = capsys.readouterr().out.strip().splitlines()
    # Older JAX (0.4.x) also lists a custom_vjp's primal outputs (here o, the output of the second dot_general),
    # which is a reporting difference, not a residual: drop that line.
    lines = [line for line in lines if not (line.startswith("f64[6,2]") and "dot_general" in line)]
    assert len(lines) == 4, lines
    assert [line.split()[0] for line in lines] == ["f64[6,3]", "f64[6,3]", "f64[6,2]", "f64[6,6]"]
    assert "from the argument q" in lines[0] and "from the argument v" in lines[2]
    assert "output of tanh" in lines[3]


# --- transforms ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp], ids=["attn", "attn_jvp"])
def test_jit(fn):
    q, k, v = jax_inputs(5, 3, 4)
    assert_trees_close(jax.jit(fn)(q, k, v), jax_impl.attn_reference(q, k, v), **TIGHT)
    assert_trees_close(jax.jit(jax.grad(_both_outputs_loss(fn), argnums=(0, 1, 2)))(q, k, v),
                       jax.grad(_both_outputs_loss(jax_impl.attn_reference), argnums=(0, 1, 2))(q, k, v), **TIGHT)


@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp], ids=["attn", "attn_jvp"])
def test_vmap(fn):
    b, (n, d, e) = 3, (4, 2, 5)
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.standard_normal(s)) for s in ((b, n, d), (b, n, d), (b, n, e)))
    batched = jax.vmap(fn)(q, k, v)
    assert batched.o.shape == (b, n, e) and batched.a.shape == (b, n, n)
    for i in range(b):
        assert_trees_close(jax.tree_util.tree_map(lambda x: x[i], batched), jax_impl.attn_reference(q[i], k[i], v[i]),
                           **TIGHT)
    # vmap of grad (per-example gradients) and grad of vmap, against the reference; k shared (in_axes None).
    loss = lambda f: (lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v).o)) + jnp.sum(f(q, k, v).a ** 3))  # noqa: E731
    per_example = jax.vmap(jax.grad(loss(fn), argnums=(0, 1, 2)), in_axes=(0, None, 0))(q, k[0], v)
    per_example_ref = jax.vmap(jax.grad(loss(jax_impl.attn_reference), argnums=(0, 1, 2)), in_axes=(0, None, 0))(
        q, k[0], v)
    assert_trees_close(per_example, per_example_ref, **TIGHT)
    total = lambda f: (lambda *args: jnp.sum(jax.vmap(loss(f))(*args)))   # noqa: E731
    assert_trees_close(jax.grad(total(fn), argnums=(0, 1, 2))(q, k, v),
                       jax.grad(total(jax_impl.attn_reference), argnums=(0, 1, 2))(q, k, v), **TIGHT)


def _both_outputs_loss(f):
    return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v).o)) + jnp.sum(f(q, k, v).a ** 3)


def _reverse_over_reverse_hvp(f):
    grad = jax.grad(_both_outputs_loss(f), argnums=(0, 1, 2))
    inner = lambda p, t: sum(jnp.vdot(g, s) for g, s in zip(grad(*p), t))   # noqa: E731  <∇L(p), t>
    return jax.jit(jax.grad(inner))


def _forward_over_reverse_hvp(f):
    grad = jax.grad(_both_outputs_loss(f), argnums=(0, 1, 2))
    return jax.jit(lambda p, t: jax.jvp(lambda *x: grad(*x), p, t)[1])


@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp], ids=["attn", "attn_jvp"])
def test_grad_of_grad(fn):
    # The bwd rule (attn) or the transposed JVP rule (attn_jvp) is itself differentiated by JAX: Hessian-vector
    # products of a loss of both outputs, under jit, against the reference's.
    p = jax_inputs(4, 3, 2)
    t = random_like(p, seed=6)
    expected = _reverse_over_reverse_hvp(jax_impl.attn_reference)(p, t)
    assert_trees_close(_reverse_over_reverse_hvp(fn)(p, t), expected, **TIGHT)
    if fn is jax_impl.attn_jvp:                                     # forward-over-reverse needs forward mode
        assert_trees_close(_forward_over_reverse_hvp(fn)(p, t), expected, **TIGHT)


# --- dtypes ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp], ids=["attn", "attn_jvp"])
def test_single_precision(fn, dtype):
    # Pinned to full float32 matmul precision, not to the CPU: on a GPU this still tests the GPU backend, where
    # JAX's default dots run in TF32 (Ampere and later; a TF32 emulation of these inputs errs 1.5e-3 to 4.6e-3,
    # far above the 1e-5 below, and that is TF32's rounding, not a formula error).  The CPU ignores the setting,
    # so the lowering is checked instead: every dot, forward and backward, must carry HIGHEST.
    q, k, v = jax_inputs(6, 4, 3, dtype)
    with jax.default_matmul_precision("float32"):   # full precision; every JAX accepts this spelling
        out, vjp = jax.vjp(fn, q, k, v)
        ct = random_like(out, seed=7)
        grads = vjp(ct)
        lowered = jax.jit(lambda q, k, v, ct: jax.vjp(fn, q, k, v)[1](ct)).lower(q, k, v, ct).as_text()
    precisions = re.findall(r"dot_general.*precision = \[(\w+), (\w+)\]", lowered)
    assert len(precisions) >= 4 and set(precisions) == {("HIGHEST", "HIGHEST")}, precisions
    assert out.o.dtype == dtype and out.a.dtype == dtype
    assert [g.dtype for g in grads] == [dtype] * 3
    # Reference in double precision from the same (rounded) inputs; single-precision rounding of matmuls of
    # length <= 6 and of tanh is well below 1e-5 relative.
    wide = np.complex128 if dtype == np.complex64 else np.float64
    up = lambda t: jax.tree_util.tree_map(lambda x: x.astype(wide), t)   # noqa: E731
    out_ref, vjp_ref = jax.vjp(jax_impl.attn_reference, *up((q, k, v)))
    assert_trees_close(out, out_ref, rtol=1e-5, atol=1e-5)
    assert_trees_close(grads, vjp_ref(up(ct)), rtol=1e-4, atol=1e-5)


def test_complex_convention_is_jax_not_torch():
    # Eq. (17): JAX's VJP has no conjugates.  For f(q) = sum(o), the JAX gradient w.r.t. v is Aᵀ 1 (22), while
    # PyTorch's (13) would be Aᴴ 1 = conj of it; check we return JAX's, and that it differs from torch's here.
    q, k, v = jax_inputs(3, 2, 2, np.complex128)
    g_v = jax.grad(lambda v: jnp.sum(jax_impl.attn(q, k, v).o), holomorphic=True)(v)
    a = jnp.tanh(q @ k.T)
    np.testing.assert_allclose(g_v, a.T @ jnp.ones((3, 2)), **TIGHT)
    assert not np.allclose(g_v, a.conj().T @ jnp.ones((3, 2)))


# --- inputs ----------------------------------------------------------------------------------------------------

def test_numpy_inputs_accepted_and_unchanged():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    copies = [x.copy() for x in (q, k, v)]
    for fn in (jax_impl.attn, jax_impl.attn_jvp, jax_impl.attn_reference):
        out = fn(q, k, v)
        assert isinstance(out.o, jax.Array) and out.o.dtype == np.float64
        jax.grad(lambda *a: jnp.sum(fn(*a).o) + jnp.sum(fn(*a).a), argnums=(0, 1, 2))(q, k, v)
    for x, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(x, c)


@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp, jax_impl.attn_reference],
                         ids=["attn", "attn_jvp", "attn_reference"])
@pytest.mark.parametrize("shape", [(0, 3, 2), (4, 0, 2), (4, 3, 0), (0, 0, 0)])
def test_empty_sizes(fn, shape):
    n, d, e = shape
    q, k, v = jax_inputs(n, d, e)
    out = jax.jit(fn)(q, k, v)
    assert out.o.shape == (n, e) and out.a.shape == (n, n)
    if d == 0:                                                      # tanh of an empty sum is 0
        np.testing.assert_array_equal(out.a, np.zeros((n, n)))
    grads = jax.grad(lambda *a: jnp.sum(fn(*a).o) + jnp.sum(fn(*a).a ** 2), argnums=(0, 1, 2))(q, k, v)
    assert [g.shape for g in grads] == [(n, d), (n, d), (n, e)]
    if fn is jax_impl.attn_jvp:
        tangents = random_like((q, k, v), seed=9)
        _, dout = jax.jvp(fn, (q, k, v), tangents)
        assert dout.o.shape == (n, e) and dout.a.shape == (n, n)


# --- errors: exact messages, eagerly, under jit and under vmap ---------------------------------------------------

F32 = np.zeros((4, 3), np.float32)
V32 = np.zeros((4, 2), np.float32)
ERROR_CASES = [
    ((F32.tolist(), F32, V32), TypeError, "attn(): argument 'q' must be a jax.Array or numpy.ndarray, got list"),
    ((F32, 1.0, V32), TypeError, "attn(): argument 'k' must be a jax.Array or numpy.ndarray, got float"),
    ((F32, F32, None), TypeError, "attn(): argument 'v' must be a jax.Array or numpy.ndarray, got NoneType"),
    ((np.zeros(3, np.float32), F32, V32), ValueError,
     "attn(): argument 'q' must be 2-D (n, d), got 1-D with shape (3,)"),
    ((F32, F32, np.zeros((1, 4, 2), np.float32)), ValueError,
     "attn(): argument 'v' must be 2-D (n, e), got 3-D with shape (1, 4, 2)"),
    ((F32, np.zeros((4, 3), np.int32), V32), TypeError,
     "attn(): argument 'k' must have a floating-point or complex dtype (float16, bfloat16, float32, float64, "
     "complex64 or complex128), got int32"),
    ((F32, F32, np.zeros((4, 2), bool)), TypeError,
     "attn(): argument 'v' must have a floating-point or complex dtype (float16, bfloat16, float32, float64, "
     "complex64 or complex128), got bool"),
    ((F32, np.zeros((4, 2), np.float32), V32), ValueError,
     "attn(): q and k must have the same second dimension d, got q (4, 3) and k (4, 2)"),
    ((F32, F32, np.zeros((5, 2), np.float32)), ValueError,
     "attn(): q, k and v must have the same first dimension n (the lab's contract: q is (n, d), k is (n, d), "
     "v is (n, e)), got q (4, 3), k (4, 3) and v (5, 2)"),
    ((F32, F32.astype(np.float64), V32), TypeError,
     "attn(): q, k and v must have the same dtype, got q float32, k float64 and v float32"),
    ((F32, F32, V32.astype(np.complex64)), TypeError,
     "attn(): q, k and v must have the same dtype, got q float32, k float32 and v complex64"),
]


@pytest.mark.parametrize("fn", [jax_impl.attn, jax_impl.attn_jvp, jax_impl.attn_reference, jax_impl.check_inputs],
                         ids=["attn", "attn_jvp", "attn_reference", "check_inputs"])
@pytest.mark.parametrize("args,exc,message", ERROR_CASES)
def test_errors(fn, args, exc, message):
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        fn(*args)


@pytest.mark.parametrize("args,exc,message", [c for c in ERROR_CASES if isinstance(c[0][0], np.ndarray)
                                              and all(isinstance(a, np.ndarray) for a in c[0])])
def test_errors_under_jit(args, exc, message):
    # Shapes and dtypes are static: the same error is raised while tracing, before any compute.  (JAX appends
    # its traceback-filtering note on a new line to exceptions raised inside a trace; the message is unchanged.)
    with pytest.raises(exc, match="^" + re.escape(message) + "(\n|$)"):
        jax.jit(jax_impl.attn)(*args)


def test_errors_under_vmap():
    # Under vmap the function sees per-example shapes; the message reports those.
    q = np.zeros((2, 4, 3))
    with pytest.raises(ValueError, match=re.escape("got q (4, 3) and k (4, 2)")):
        jax.vmap(jax_impl.attn)(q, np.zeros((2, 4, 2)), np.zeros((2, 4, 5)))
    with pytest.raises(ValueError, match=re.escape("argument 'v' must be 2-D (n, e), got 1-D with shape (4,)")):
        jax.vmap(jax_impl.attn)(q, q, np.zeros((2, 4)))


def test_batched_input_without_vmap_is_an_error():
    with pytest.raises(ValueError, match=re.escape("argument 'q' must be 2-D (n, d), got 3-D with shape (2, 4, 3)")):
        jax_impl.attn(np.zeros((2, 4, 3)), np.zeros((2, 4, 3)), np.zeros((2, 4, 5)))
