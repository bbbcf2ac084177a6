"""Planted solutions that pin crosscheck's strictness (tests/crosscheck/test_strictness.py): each is wrong in a
way that exactly ONE piece of crosscheck catches — a dtype's tolerance, a path family, the imaginary parts, the
distinct draws of ``--trials``, the norm floor — so weakening that piece turns its verdict from FAIL to OK.

Torch solutions are ``autograd.Function`` subclasses (pass ``NAME.apply``); JAX ones are built on first use
(``jax_NAME``), so importing this module does not import JAX.  Every one is right on every other path: its
forward is the project's, its backward / JVP the project's formulas with one change.
"""

from __future__ import annotations

import warnings

import torch

from torch_impl import formulas as TF

# the next lower precision of each dtype: "a saved in half the bits to save memory"
LOWER = {torch.float64: torch.float32, torch.float32: torch.float16,
         torch.complex128: torch.complex64, torch.complex64: torch.complex32}


class _Base(torch.autograd.Function):
    """The project's formulas; subclasses change one piece."""

    @staticmethod
    def forward(q, k, v):
        return TF.attn_forward(q, k, v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, output[1])
        ctx.save_for_forward(*inputs, output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, go, ga):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)

    @staticmethod
    def jvp(ctx, qd, kd, vd):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_jvp(q, k, v, a, qd, kd, vd)


def _variant(name: str, doc: str, **methods):
    return type(name, (_Base,), {"__doc__": doc, **{key: staticmethod(fn) for key, fn in methods.items()}})


# --- tolerances: an error just above one dtype's tolerance, far below every formula bug -------------------------------

def _save_a_lower(ctx, inputs, output):
    q, k, v = inputs
    a = output[1]
    with warnings.catch_warnings():                             # complex32: "ComplexHalf support is experimental"
        warnings.simplefilter("ignore", UserWarning)
        a_low = a.to(LOWER[a.dtype])                            # the "memory saving": a rounded to lower precision
    ctx.save_for_backward(q, k, v, a_low)
    ctx.save_for_forward(q, k, v, a)
    ctx.set_materialize_grads(False)


def _backward_lower_a(ctx, go, ga):
    q, k, v, a_low = ctx.saved_tensors
    return TF.attn_backward(go, ga, q, k, v, a_low.to(q.dtype), ctx.needs_input_grad)


SavesALower = _variant(
    "SavesALower", "Saves a in the next lower precision (float64 → float32, float32 → float16, complex128 → "
    "complex64, complex64 → complex32): relative errors of that precision's roundoff (~1e-7, ~3e-4), above the "
    "dtype's tolerance (1e-10, 1e-4) and far below a formula bug's.",
    setup_context=_save_a_lower, backward=_backward_lower_a)


# --- complex: only the imaginary parts wrong --------------------------------------------------------------------------

def _conj_backward(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    return tuple(None if g is None else g.conj() for g in TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad))


ConjugatedGradients = _variant(
    "ConjugatedGradients", "Returns grad.conj(): real parts right, imaginary parts negated (right for real dtypes).",
    backward=_conj_backward)


def _real_part_backward(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    return tuple(None if g is None else g.real for g in TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad))


RealPartGradients = _variant(
    "RealPartGradients", "Returns grad.real: the imaginary parts dropped (torch casts it back to complex; JAX "
    "passes the real array on, so the comparison sees a real result against a complex reference).",
    backward=_real_part_backward)


# --- path families: wrong on one family of paths only -----------------------------------------------------------------

def _save_v_if_needed(ctx, inputs, output):
    q, k, v = inputs
    ctx.save_for_backward(q, k, v if ctx.needs_input_grad[2] else None, output[1])
    ctx.save_for_forward(q, k, v, output[1])
    ctx.set_materialize_grads(False)


def _drops_go_term_without_v(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    if v is None:                                               # the bug: G_O Vᴴ of (9) needs v all the same
        go = None
        if ga is None:
            return None, None, None
    return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)


WrongWhenVNotRequired = _variant(
    "WrongWhenVNotRequired", "Saves v only when v requires grad and then drops (9)'s G_O Vᴴ: wrong for q and k "
    "only on the input subsets without v (VJP input subsets).",
    setup_context=_save_v_if_needed, backward=_drops_go_term_without_v)


def _wrong_when_o_unused(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    if go is None and ga is not None:                           # a second copy of (10), with 1 − a for 1 − a²
        gx = ga * (1 - a).conj()
        need_q, need_k, _ = ctx.needs_input_grad
        return (gx @ k.conj() if need_q else None, gx.mT @ q.conj() if need_k else None, None)
    return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)


WrongWhenOUnused = _variant(
    "WrongWhenOUnused", "A separate branch for an unused o, with 1 − a for 1 − a² in it: wrong only with the "
    "cotangent on a alone (cotangent modes).", backward=_wrong_when_o_unused)


def _jvp_wrong_without_k(ctx, qd, kd, vd):
    q, k, v, a = ctx.saved_tensors
    if kd is None and qd is not None and vd is not None:        # the bug: Q̇ Kᵀ of (14) transposed on this branch
        a_dot = (1 - a * a) * (k @ qd.mT)
        return a_dot @ v + a @ vd, a_dot
    return TF.attn_jvp(q, k, v, a, qd, kd, vd)


JvpWrongWithoutK = _variant(
    "JvpWrongWithoutK", "JVP with Q̇ Kᵀ transposed on the branch where k has no tangent and q and v have: wrong "
    "only for the tangent subset (q, v) (JVP tangent subsets; tangents on all inputs or on one are right).",
    jvp=_jvp_wrong_without_k)


def _first_order_only(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    return TF.attn_backward(go, ga, q, k, v, a.detach(), ctx.needs_input_grad)


FirstOrderOnly = _variant(
    "FirstOrderOnly", "Uses a.detach() in the backward: right first-order numbers, but differentiating the "
    "backward misses that 1 − a² depends on q and k (second order only).", backward=_first_order_only)


# --- --trials: wrong only on some draws -------------------------------------------------------------------------------

def _wrong_when_q00_large(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    grads = TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)
    if q[0, 0].real > 0.5:                                      # the bug: a "fast path" taken on some inputs only
        grads = (None if grads[0] is None else 2 * grads[0],) + grads[1:]
    return grads


WrongWhenQ00Large = _variant(
    "WrongWhenQ00Large", "Doubles G_Q when q[0, 0] > 0.5: caught only on a draw where that holds.",
    backward=_wrong_when_q00_large)


# --- the norm floor: errors of ~1e-15 on a gradient that is exactly zero ----------------------------------------------

def _noise_on_zero_grad_v(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    grads = TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)
    if go is None and ctx.needs_input_grad[2]:                  # G_V is exactly 0 without G_O: returned as noise
        grads = grads[:2] + (torch.full_like(v, 1e-15),)
    return grads


NoiseOnZeroGradient = _variant(
    "NoiseOnZeroGradient", "With o unused, G_V (exactly zero) comes back as 1e-15 everywhere: relative to the "
    "norm floor 1e-6 an error of ~1e-9, far above float64's 1e-10; with a floor of 1e-3 it would pass.",
    backward=_noise_on_zero_grad_v)


# --- the metric: what a relative error is measured against ----------------------------------------------------------

def _doubled_grad_q(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    gq, gk, gv = TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)
    return (None if gq is None else 2 * gq), gk, gv


DoubledGradQ = _variant(
    "DoubledGradQ", "G_Q twice the right one: relative error exactly 1 against the reference (0.5 if divided by the "
    "larger norm, as between two user implementations).", backward=_doubled_grad_q)


def _grad_k_transposed(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    gq, gk, gv = TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)
    return gq, (None if gk is None else gk.mT), gv


GradKTransposed = _variant(
    "GradKTransposed", "Returns G_K transposed, (d, n) for (n, d): a shape mismatch, at any size.",
    backward=_grad_k_transposed)


def _no_grad_v(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)[:2] + (None,)


NoneForGradV = _variant(
    "NoneForGradV", "Returns None (torch's zero) for G_V even when it is not zero: a missing gradient is compared "
    "as zeros, not skipped.", backward=_no_grad_v)


# --- review: a finding only one detection route sees ------------------------------------------------------------------

def _save_x(ctx, inputs, output):
    q, k, v = inputs
    ctx.save_for_backward(q, k, v, q @ k.mT)                   # x saved instead of a
    ctx.set_materialize_grads(False)


def _recompute_tanh_of_x(ctx, go, ga):
    q, k, v, x = ctx.saved_tensors
    return TF.attn_backward(go, ga, q, k, v, torch.tanh(x), ctx.needs_input_grad)


SavesXRecomputesTanh = _variant(
    "SavesXRecomputesTanh", "Saves x = q kᵀ and recomputes a = tanh(x) in the backward: no product of class x in "
    "the backward, only the tanh.", setup_context=_save_x, backward=_recompute_tanh_of_x)


# --- JAX --------------------------------------------------------------------------------------------------------------

def _jax_solutions():
    import jax
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero

    from jax_impl import formulas as JF

    def value(c):
        return None if isinstance(c, SymbolicZero) else c

    def vjp_function(fwd, bwd):
        @jax.custom_vjp
        def attn(q, k, v):
            return JF.attn_forward(q, k, v)

        attn.defvjp(fwd, bwd, symbolic_zeros=True)
        return attn

    def fwd_all(q, k, v):
        q, k, v = q.value, k.value, v.value
        o, a = JF.attn_forward(q, k, v)
        return (o, a), (q, k, v, a)

    def bwd(change=lambda go, ga, q, k, v, a: JF.attn_backward(go, ga, q, k, v, a)):
        def rule(res, g):
            q, k, v, a = res
            return change(value(g[0]), value(g[1]), q, k, v, a)
        return rule

    def lower(a):
        # rounded with lax.reduce_precision, not a round trip through astype: XLA may drop a convert pair as
        # "excess precision" (jaxlib 0.4.30's CPU pipeline does), which would make this solution exact
        bits = (8, 23) if a.dtype in (jnp.float64, jnp.complex128) else (5, 10)    # float32 / float16
        if jnp.iscomplexobj(a):        # no complex32 in JAX: real and imaginary parts each rounded
            return jax.lax.complex(*(jax.lax.reduce_precision(part, *bits) for part in (a.real, a.imag)))
        return jax.lax.reduce_precision(a, *bits)

    def fwd_lower(q, k, v):
        (o, a), (q, k, v, _) = fwd_all(q, k, v)
        return (o, a), (q, k, v, lower(a))

    def conj_grads(go, ga, q, k, v, a):
        return tuple(None if g is None else jnp.conj(g) for g in JF.attn_backward(go, ga, q, k, v, a))

    def real_grads(go, ga, q, k, v, a):
        return tuple(None if g is None else jnp.real(g) for g in JF.attn_backward(go, ga, q, k, v, a))

    def grad_v_when_o_unused(go, ga, q, k, v, a):
        gq, gk, gv = JF.attn_backward(go, ga, q, k, v, a)
        return gq, gk, (jnp.ones_like(v) if go is None else gv)

    def fwd_v_if_perturbed(q, k, v):
        (o, a), (qv, kv, vv, _) = fwd_all(q, k, v)
        return (o, a), (qv, kv, vv if v.perturbed else None, a)

    def drops_go_term_without_v(go, ga, q, k, v, a):
        if v is None:
            go = None
            if ga is None:
                return None, None, None
        return JF.attn_backward(go, ga, q, k, v, a)

    def wrong_when_o_unused(go, ga, q, k, v, a):
        if go is None and ga is not None:
            gx = ga * (1 - a)
            return gx @ k, gx.T @ q, None
        return JF.attn_backward(go, ga, q, k, v, a)

    def first_order_only(go, ga, q, k, v, a):
        return JF.attn_backward(go, ga, q, k, v, jax.lax.stop_gradient(a))

    def wrong_when_q00_large(go, ga, q, k, v, a):
        gq, gk, gv = JF.attn_backward(go, ga, q, k, v, a)
        return (None if gq is None else jnp.where(q[0, 0].real > 0.5, 2 * gq, gq)), gk, gv

    def fwd_x(q, k, v):
        (o, a), (q, k, v, _) = fwd_all(q, k, v)
        return (o, a), (q, k, v, q @ k.T)

    def recompute_tanh_of_x(go, ga, q, k, v, x):
        return JF.attn_backward(go, ga, q, k, v, jnp.tanh(x))

    @jax.custom_jvp
    def jvp_wrong_without_k(q, k, v):
        return JF.attn_forward(q, k, v)

    def jvp_rule(primals, tangents):
        q, k, v = primals
        qd, kd, vd = (value(t) for t in tangents)
        o, a = JF.attn_forward(q, k, v)
        if kd is None and qd is not None and vd is not None:   # the bug: Q̇ Kᵀ transposed on this branch
            a_dot = (1 - a * a) * (k @ qd.T)
            return (o, a), (a_dot @ v + a @ vd, a_dot)
        return (o, a), JF.attn_jvp(q, k, v, a, qd, kd, vd)

    jvp_wrong_without_k.defjvp(jvp_rule, symbolic_zeros=True)

    return {
        "saves_a_lower": vjp_function(fwd_lower, bwd()),
        "conjugated_gradients": vjp_function(fwd_all, bwd(conj_grads)),
        "real_part_gradients": vjp_function(fwd_all, bwd(real_grads)),
        "grad_v_when_o_unused": vjp_function(fwd_all, bwd(grad_v_when_o_unused)),
        "wrong_when_v_not_differentiated": vjp_function(fwd_v_if_perturbed, bwd(drops_go_term_without_v)),
        "wrong_when_o_unused": vjp_function(fwd_all, bwd(wrong_when_o_unused)),
        "jvp_wrong_without_k": jvp_wrong_without_k,
        "first_order_only": vjp_function(fwd_all, bwd(first_order_only)),
        "wrong_when_q00_large": vjp_function(fwd_all, bwd(wrong_when_q00_large)),
        "saves_x_recomputes_tanh": vjp_function(fwd_x, bwd(recompute_tanh_of_x)),
    }


def __getattr__(name):                            # jax_saves_a_lower, ... built on first use
    if name.startswith("jax_"):
        solutions = _jax_solutions()
        if name[4:] in solutions:
            globals().update({f"jax_{key}": fn for key, fn in solutions.items()})
            return globals()[name]
    raise AttributeError(name)
