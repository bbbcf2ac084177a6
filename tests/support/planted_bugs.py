"""Deliberately wrong implementations of tanh attention, for tests/crosscheck/test_run.py: each is a plausible
student mistake that crosscheck must catch (exit 1, naming the failing gradient).

Each torch bug is an ``autograd.Function`` (passed to crosscheck as ``tests/support/planted_bugs.py:NAME``) whose
forward is the project's ``attn_forward`` and whose backward / jvp is the correct formula with ONE change;
each JAX bug is a ``jax.custom_vjp`` function built the same way.  JAX is imported only if a JAX bug is used.
"""

from __future__ import annotations

import torch

from torch_impl import formulas as TF


def _torch_function(name, backward_grads, jvp=None):
    """An autograd.Function with the project's forward, ``backward_grads(go, ga, q, k, v, a) -> (gq, gk, gv)``
    and (optionally) a buggy ``jvp``; the correct jvp otherwise."""

    def forward(q, k, v):
        return TF.attn_forward(q, k, v)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, output[1])
        ctx.save_for_forward(*inputs, output[1])
        ctx.set_materialize_grads(False)

    def backward(ctx, go, ga):
        q, k, v, a = ctx.saved_tensors
        return backward_grads(go, ga, q, k, v, a)

    def correct_jvp(ctx, qd, kd, vd):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_jvp(q, k, v, a, qd, kd, vd)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward), "jvp": staticmethod(jvp or correct_jvp)})


def _zeros_if_none(g, like):
    return torch.zeros_like(like) if g is None else g


def _ghat(go, ga, v, a):
    return (_zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device)) @ v.mH
            + _zeros_if_none(ga, a))


# --- torch bugs ----------------------------------------------------------------------------------------------------

def _no_conj(go, ga, q, k, v, a):
    """Missing conjugates: G_Q = G_X K, G_K = G_Xᵀ Q (only right for real dtypes)."""
    gx = _ghat(go, ga, v, a) * (1 - a * a).conj()
    return (gx @ k, gx.mT @ q,
            a.mH @ _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device)))


def _wrong_transpose(go, ga, q, k, v, a):
    """G_K = G_X Q̄ instead of G_Xᵀ Q̄ (same shape, wrong values)."""
    gx = _ghat(go, ga, v, a) * (1 - a * a).conj()
    return (gx @ k.conj(), gx @ q.conj(),
            a.mH @ _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device)))


def _one_minus_a(go, ga, q, k, v, a):
    """tanh' taken as 1 − a instead of 1 − a²."""
    gx = _ghat(go, ga, v, a) * (1 - a).conj()
    return (gx @ k.conj(), gx.mT @ q.conj(),
            a.mH @ _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device)))


def _dropped_ga(go, ga, q, k, v, a):
    """Ĝ_A = G_O Vᴴ: the gradient arriving at the returned a is dropped."""
    go = _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device))
    gx = (go @ v.mH) * (1 - a * a).conj()
    return gx @ k.conj(), gx.mT @ q.conj(), a.mH @ go


def _gk_transposed(go, ga, q, k, v, a):
    """Returns the gradient of k transposed, (d, n) instead of (n, d)."""
    gx = _ghat(go, ga, v, a) * (1 - a * a).conj()
    return (gx @ k.conj(), (gx.mT @ q.conj()).mT,
            a.mH @ _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device)))


def _gv_no_transpose(go, ga, q, k, v, a):
    """G_V = A G_O instead of Aᴴ G_O (13): same shape (n, e), wrong values; q and k are right."""
    gq, gk, _ = TF.attn_backward(go, ga, q, k, v, a, (True, True, False))
    return gq, gk, a @ _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device))


def _jvp_missing_k(ctx, qd, kd, vd):
    """JVP without the Q K̇ᵀ term of (14)."""
    q, k, v, a = ctx.saved_tensors
    return TF.attn_jvp(q, k, v, a, qd, None, vd) if qd is not None or vd is not None else (
        torch.zeros(a.shape[0], v.shape[1], dtype=a.dtype, device=a.device), torch.zeros_like(a))


def _correct(go, ga, q, k, v, a):
    return TF.attn_backward(go, ga, q, k, v, a, (True, True, True))


NoConj = _torch_function("NoConj", _no_conj)
WrongTranspose = _torch_function("WrongTranspose", _wrong_transpose)
OneMinusA = _torch_function("OneMinusA", _one_minus_a)
DroppedGA = _torch_function("DroppedGA", _dropped_ga)
GradKTransposed = _torch_function("GradKTransposed", _gk_transposed)
JvpMissingK = _torch_function("JvpMissingK", _correct, jvp=_jvp_missing_k)
GradVNoTranspose = _torch_function("GradVNoTranspose", _gv_no_transpose)
Correct = _torch_function("Correct", _correct)                      # control: must pass


def _forward_off(q, k, v):
    o, a = TF.attn_forward(q, k, v)
    return o * 1.01, a                                                # o 1% off, gradients right


ForwardOff = type("ForwardOff", (Correct,), {"forward": staticmethod(_forward_off)})


class NoJvp(torch.autograd.Function):
    """Correct, but old-style (ctx in forward) and without jvp: crosscheck must skip, not fail, its JVP."""

    @staticmethod
    def forward(ctx, q, k, v):
        o, a = TF.attn_forward(q, k, v)
        ctx.save_for_backward(q, k, v, a)
        return o, a

    @staticmethod
    def backward(ctx, go, ga):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_backward(go, ga, q, k, v, a, (True, True, True))


# --- bugs on one path only (right on the default path: every input requiring grad, both outputs used) ---------------

class MaskDependent(torch.autograd.Function):
    """Saves v only when v itself needs a gradient (a plausible "optimisation"), and without v drops the G_O Vᴴ
    term of (9): right whenever v requires grad, wrong for q and k when it does not."""

    @staticmethod
    def forward(q, k, v):
        return TF.attn_forward(q, k, v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        ctx.save_for_backward(q, k, v if ctx.needs_input_grad[2] else None, output[1])
        ctx.save_for_forward(q, k, v, output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, go, ga):
        q, k, v, a = ctx.saved_tensors
        if v is None:                                               # the bug: G_O Vᴴ needs v all the same
            go_term = None
        else:
            go_term = None if go is None else go @ v.mH
        ghat = go_term if ga is None else (ga if go_term is None else go_term + ga)
        gq = gk = gv = None
        if ghat is not None:
            gx = ghat * (1 - a * a).conj()
            gq, gk = gx @ k.conj(), gx.mT @ q.conj()
        if go is not None and ctx.needs_input_grad[2]:
            gv = a.mH @ go
        return gq, gk, gv

    @staticmethod
    def jvp(ctx, qd, kd, vd):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_jvp(q, k, v, a, qd, kd, vd)


def _first_order_only(go, ga, q, k, v, a):
    """The tanh factor from a.detach(): the right numbers, but a create_graph=True backward (or forward AD
    through it) does not see that 1 − a² depends on q and k — wrong in second order only."""
    ad = a.detach()
    gx = _ghat(go, ga, v, a) * (1 - ad * ad).conj()
    return gx @ k.conj(), gx.mT @ q.conj(), a.mH @ _zeros_if_none(go, torch.empty(a.shape[0], v.shape[1],
                                                                                dtype=a.dtype, device=a.device))


FirstOrderOnly = _torch_function("FirstOrderOnly", _first_order_only)


# --- backwards that raise on one path only (real solutions to the lab did both) --------------------------------------

def _crash_when_o_unused(go, ga, q, k, v, a):
    """set_materialize_grads(False) without None checks: ``go @ v.mH`` raises TypeError when o is unused."""
    ghat = go @ v.mH if ga is None else go @ v.mH + ga
    gx = ghat * (1 - a * a).conj()
    return gx @ k.conj(), gx.mT @ q.conj(), a.mH @ go


def _unbound_when_not_all_require_grad(ctx, go, ga):
    """Each gradient computed under its needs_input_grad flag but all three returned: UnboundLocalError as soon
    as one input does not require grad."""
    q, k, v, a = ctx.saved_tensors
    full = TF.attn_backward(go, ga, q, k, v, a, (True, True, True))
    if ctx.needs_input_grad[0]:
        gq = full[0]
    if ctx.needs_input_grad[1]:
        gk = full[1]
    if ctx.needs_input_grad[2]:
        gv = full[2]
    return gq, gk, gv  # noqa: F821 - the bug


def _crash_when_either_unused(go, ga, q, k, v, a):
    """The README's session: no None check at all, so it raises whenever one output is unused."""
    gx = (go @ v.mH + ga) * (1 - a * a).conj()
    return gx @ k.conj(), gx.mT @ q.conj(), a.mH @ go


def _jax_convention(go, ga, q, k, v, a):
    """JAX's VJP (18)-(22) in torch: no conjugate anywhere (right for real dtypes only)."""
    gx = (go @ v.mT + ga) * (1 - a * a)
    return gx @ k, gx.mT @ q, a.mT @ go


def _real_only_forward(q, k, v):
    """A correct real-only solution: complex inputs are refused."""
    if q.is_complex():
        raise TypeError("attn(): complex inputs are not supported")
    return TF.attn_forward(q, k, v)


def _float32_only_forward(q, k, v):
    if q.dtype != torch.float32:
        raise TypeError("attn(): only float32 is supported")
    return TF.attn_forward(q, k, v)


def torch_one_output(q, k, v):
    return TF.attn_forward(q, k, v)[0]                                # o only: a forgotten


JaxConventionInTorch = _torch_function("JaxConventionInTorch", _jax_convention)
RealOnly = type("RealOnly", (Correct,), {"forward": staticmethod(_real_only_forward)})
Float32Only = type("Float32Only", (Correct,), {"forward": staticmethod(_float32_only_forward)})
CrashWhenOUnused = _torch_function("CrashWhenOUnused", _crash_when_o_unused)
CrashWhenEitherUnused = _torch_function("CrashWhenEitherUnused", _crash_when_either_unused)
UnboundWhenNotAllRequireGrad = type("UnboundWhenNotAllRequireGrad", (Correct,),
                                    {"backward": staticmethod(_unbound_when_not_all_require_grad)})

# name -> (the path crosscheck must name in its failures and hint, the dtype to use)
TORCH_PATH_BUGS = {
    "MaskDependent": ("not require grad", "fails only when v does not require grad"),
    "FirstOrderOnly": ("second order", "fails only in second order"),
}


def torch_plain(q, k, v):
    """No hand-written gradient at all: autograd differentiates the forward (crosscheck must say so)."""
    a = torch.tanh(q @ k.mT)
    return a @ v, a


def torch_op(q, k, v):
    """The project's torch.library operator (its Autograd kernel applies an autograd.Function): hand-written."""
    return torch.ops.attn_lab.attn(q, k, v)


def torch_op_composite(q, k, v):
    """The CompositeImplicitAutograd operator: autograd differentiates its aten ops (not hand-written)."""
    return torch.ops.attn_lab.attn_composite(q, k, v)


class Mix(torch.autograd.Function):
    """o, a = tanh(x) v, tanh(x) with a hand-written backward for x and v only: given x = q @ k.mT computed
    outside, autograd differentiates the matmul (not a hand-written gradient of the whole op)."""

    @staticmethod
    def forward(x, v):
        a = torch.tanh(x)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1], output[1])

    @staticmethod
    def backward(ctx, go, ga):
        v, a = ctx.saved_tensors
        return (go @ v.mH + ga) * (1 - a * a).conj(), a.mH @ go


class TanhOnly(torch.autograd.Function):
    """A hand-written Function for tanh alone (real dtypes): the products around it are autograd's."""

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return g * (1 - a * a)


def tanh_only(q, k, v):
    """The lab's op with only tanh hand-written (``TanhOnly``): o still reaches q, k, v through autograd's
    matmuls, so it is not a hand-written gradient of the whole op."""
    a = TanhOnly.apply(q @ k.mT)
    return a @ v, a


def torch_forward_raises(q, k, v):
    raise RuntimeError("student forgot to implement forward")


def torch_wrong_shapes(q, k, v):
    o, a = TF.attn_forward(q, k, v)
    return o.mT, a                                                    # o is (e, n)


TORCH_BUGS = {  # name -> (the gradient crosscheck must name, dtype needed to see it)
    "NoConj": ("grad of q", "complex128"),
    "WrongTranspose": ("grad of k", "float64"),
    "OneMinusA": ("grad of q", "float64"),
    "DroppedGA": ("grad of q", "float64"),
    "GradKTransposed": ("grad of k", "float64"),
    "JvpMissingK": ("tangent of a", "float64"),
    "GradVNoTranspose": ("grad of v", "float64"),
}

# the derivation.md equations each bug's "hint" line must point at (torch convention)
TORCH_HINTS = {
    "NoConj": "only complex dtypes fail → a missing conjugate, (9)–(13)",
    "WrongTranspose": "only the gradient of k fails → G_K, (12)",
    "OneMinusA": "q and k fail, v agrees → (10)–(12), the tanh factor (1 − a²)",
    "DroppedGA": "fails only when a's cotangent is present (never with o's alone) → the G_A term of Ĝ_A, (9)",
    "GradKTransposed": "only the gradient of k fails → G_K, (12)",
    "JvpMissingK": "only the JVP fails → (14)–(16)",
    "GradVNoTranspose": "only the gradient of v fails → G_V, (13)",
}


# --- JAX bugs (JAX convention: eqs. (18)-(22), no conjugates) ---------------------------------------------------------

def _jax_function(bwd_grads):
    import jax
    from jax_impl import formulas as JF

    @jax.custom_vjp
    def attn(q, k, v):
        return JF.attn_forward(q, k, v)

    def fwd(q, k, v):
        o, a = JF.attn_forward(q, k, v)
        return (o, a), (q, k, v, a)

    def bwd(res, g):
        q, k, v, a = res
        return bwd_grads(g[0], g[1], q, k, v, a)

    attn.defvjp(fwd, bwd)
    return attn


def _jax_custom_jvp(jvp_rule, forward_scale=1.0):
    import jax
    from jax_impl import formulas as JF

    @jax.custom_jvp
    def attn(q, k, v):
        o, a = JF.attn_forward(q, k, v)
        return o * forward_scale, a

    @attn.defjvp
    def _rule(primals, tangents):
        q, k, v = primals
        o, a = JF.attn_forward(q, k, v)
        return (o * forward_scale, a), jvp_rule(q, k, v, a, *tangents)

    return attn


def _jax_extra():
    import jax
    import jax.numpy as jnp
    from jax_impl import formulas as JF

    def jvp_missing_k(q, k, v, a, qd, kd, vd):
        return JF.attn_jvp(q, k, v, a, qd, kd * 0, vd)

    def plain(q, k, v):                            # no custom rule: JAX differentiates the forward itself
        a = jnp.tanh(q @ k.T)
        return a @ v, a

    def zero_grads(go, ga, q, k, v, a):            # a "gradient" of exact zeros
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)

    return {"plain": plain, "jit_correct": jax.jit(_jax_function(lambda go, ga, q, k, v, a: JF.attn_backward(
                go, ga, q, k, v, a))),
            "zero_grads": _jax_function(zero_grads),
            "jvp_missing_k": _jax_custom_jvp(jvp_missing_k),
            "forward_off": _jax_custom_jvp(JF.attn_jvp, forward_scale=1.01),
            "correct_jvp": _jax_custom_jvp(JF.attn_jvp),
            "correct": _jax_function(lambda go, ga, q, k, v, a: JF.attn_backward(go, ga, q, k, v, a))}


def jax_symbolic_function(bwd):
    """A ``jax.custom_vjp`` attn with the project's forward, registered with ``symbolic_zeros=True``:
    ``bwd((q, k, v, a), (go, ga))`` gets an unused output's cotangent as a ``SymbolicZero``."""
    import jax
    from jax_impl import formulas as JF

    @jax.custom_vjp
    def attn(q, k, v):
        return JF.attn_forward(q, k, v)

    def fwd(q, k, v):
        q, k, v = q.value, k.value, v.value
        o, a = JF.attn_forward(q, k, v)
        return (o, a), (q, k, v, a)

    attn.defvjp(fwd, bwd, symbolic_zeros=True)
    return attn


def _jax_symbolic_zero_only():
    """Registered with symbolic_zeros=True; when o's cotangent is a symbolic zero (o unused, e.g. a loss of a
    alone) it returns no gradient at all, forgetting the G_A term of (18): right whenever o is used."""
    from jax.custom_derivatives import SymbolicZero
    from jax_impl import formulas as JF

    def bwd(res, g):
        q, k, v, a = res
        go, ga = g
        if isinstance(go, SymbolicZero):                       # the bug: "o unused, so nothing flows back"
            return None, None, None
        return JF.attn_backward(go, None if isinstance(ga, SymbolicZero) else ga, q, k, v, a)

    return jax_symbolic_function(bwd)


def _jax_first_order_only():
    """bwd with the tanh factor under jax.lax.stop_gradient: right first-order numbers, wrong grad-of-grad."""
    import jax

    def bwd_grads(go, ga, q, k, v, a):
        s = jax.lax.stop_gradient(a)
        gx = (go @ v.T + ga) * (1 - s * s)
        return gx @ k, gx.T @ q, a.T @ go

    return _jax_function(bwd_grads)


def _jax_crash_when_o_unused():
    """symbolic_zeros=True, but bwd multiplies o's cotangent without looking: a SymbolicZero @ v.T raises
    TypeError while tracing, only when o is unused."""

    def bwd(res, g):
        q, k, v, a = res
        go, ga = g
        gx = (go @ v.T + ga) * (1 - a * a)                            # the bug: go may be a SymbolicZero
        return gx @ k, gx.T @ q, a.T @ go

    return jax_symbolic_function(bwd)


JAX_PATH_BUGS = {  # name -> (the path the failures and hint must name, the hint's start)
    "symbolic_zero_only": ("o unused", "fails only when o is unused"),
    "first_order_only": ("second order", "fails only in second order"),
}


def _jax_bugs():
    import jax.numpy as jnp

    def extra_conj(go, ga, q, k, v, a):          # torch's conjugates carried over into JAX's convention
        gx = (go @ v.T + ga) * jnp.conj(1 - a * a)
        return gx @ jnp.conj(k), gx.T @ jnp.conj(q), jnp.conj(a).T @ go

    def wrong_transpose(go, ga, q, k, v, a):
        gx = (go @ v.T + ga) * (1 - a * a)
        return gx @ k, gx @ q, a.T @ go

    def one_minus_a(go, ga, q, k, v, a):
        gx = (go @ v.T + ga) * (1 - a)
        return gx @ k, gx.T @ q, a.T @ go

    def dropped_ga(go, ga, q, k, v, a):
        gx = (go @ v.T) * (1 - a * a)
        return gx @ k, gx.T @ q, a.T @ go

    def gk_transposed(go, ga, q, k, v, a):
        gx = (go @ v.T + ga) * (1 - a * a)
        return gx @ k, (gx.T @ q).T, a.T @ go

    return {"extra_conj": extra_conj, "wrong_transpose": wrong_transpose, "one_minus_a": one_minus_a,
            "dropped_ga": dropped_ga, "gk_transposed": gk_transposed}


JAX_HINTS = {  # JAX convention: equations (18)-(22)
    "extra_conj": "only complex dtypes fail → an extra conjugate (JAX's VJP has none), (18)–(22) and relation (17)",
    "wrong_transpose": "only the gradient of k fails → G_K, (21)",
    "one_minus_a": "q and k fail, v agrees → (19)–(21), the tanh factor (1 − a²)",
    "dropped_ga": "fails only when a's cotangent is present (never with o's alone) → the G_A term of Ĝ_A, (18)",
    "gk_transposed": "only the gradient of k fails → G_K, (21)",
}

JAX_BUGS = {  # name -> (the gradient crosscheck must name, dtype needed to see it)
    "extra_conj": ("grad of q", "complex128"),
    "wrong_transpose": ("grad of k", "float64"),
    "one_minus_a": ("grad of q", "float64"),
    "dropped_ga": ("grad of q", "float64"),
    "gk_transposed": ("grad of k", "float64"),
}


def __getattr__(name):                            # tests/support/planted_bugs.py:jax_extra_conj etc., built on demand
    if name.startswith("jax_") and name[4:] in JAX_BUGS:
        fn = _jax_function(_jax_bugs()[name[4:]])
        globals()[name] = fn
        return fn
    if name == "jax_symbolic_zero_only":
        globals()[name] = _jax_symbolic_zero_only()
        return globals()[name]
    if name == "jax_crash_when_o_unused":
        globals()[name] = _jax_crash_when_o_unused()
        return globals()[name]
    if name == "jax_first_order_only":
        globals()[name] = _jax_first_order_only()
        return globals()[name]
    if name.startswith("jax_") and name[4:] in ("jvp_missing_k", "forward_off", "correct_jvp", "correct", "plain",
                                                "jit_correct", "zero_grads"):
        fn = _jax_extra()[name[4:]]
        globals()[name] = fn
        return fn
    raise AttributeError(name)


# --- solutions written the way a student writes them (not built from the project's formulas) -----------------------
# For the hint and UX tests (tests/crosscheck/test_hints.py): each is what a lab student hands in, with its bug.

class StudentDroppedGA(torch.autograd.Function):
    """The classic bug of derivation.md (9): once G_O arrives, G_A is dropped (right with o or a alone)."""

    @staticmethod
    def forward(q, k, v):
        a = torch.tanh(q @ k.T)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        ctx.save_for_backward(q, k, v, output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        grad_ahat = grad_o @ v.T if grad_o is not None else grad_a
        grad_x = grad_ahat * (1 - a * a)
        grad_v = None if grad_o is None else a.T @ grad_o
        return grad_x @ k, grad_x.T @ q, grad_v


class _StudentSavesX(torch.autograd.Function):
    """Saves x = q kᵀ (returned as a third, non-differentiable output so it can be saved) and recomputes tanh(x)
    in backward: right in first order; in second order the saved x is a constant, so a loses q and k."""

    @staticmethod
    def forward(q, k, v):
        x = q @ k.T
        a = torch.tanh(x)
        return a @ v, a, x

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        ctx.save_for_backward(q, k, v, output[2])
        ctx.mark_non_differentiable(output[2])

    @staticmethod
    def backward(ctx, grad_o, grad_a, _grad_x):
        q, k, v, x = ctx.saved_tensors
        a = torch.tanh(x)
        grad_x = (grad_o @ v.T + grad_a) * (1 - a * a)
        return grad_x @ k, grad_x.T @ q, a.T @ grad_o


def student_saves_x(q, k, v):
    o, a, _ = _StudentSavesX.apply(q, k, v)
    return o, a


class StudentMaterialised(torch.autograd.Function):
    """Right numbers, but no ctx.set_materialize_grads(False): autograd hands backward a zero G_O when o is unused
    (and G_V = aᵀ G_O, of o's shape, comes out zero)."""

    @staticmethod
    def forward(q, k, v):
        a = torch.tanh(q @ k.T)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        ctx.save_for_backward(q, k, v, output[1])

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        grad_x = (grad_o @ v.T + grad_a) * (1 - a * a)
        return grad_x @ k, grad_x.T @ q, a.T @ grad_o


class StudentNotAFunction:
    """Forgot to derive from torch.autograd.Function."""

    @staticmethod
    def forward(ctx, q, k, v):
        a = torch.tanh(q @ k.T)
        ctx.save_for_backward(q, k, v, a)
        return a @ v, a

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        grad_x = (grad_o @ v.T + grad_a) * (1 - a * a)
        return grad_x @ k, grad_x.T @ q, a.T @ grad_o


STUDENT_N_HEADS = 1                                # not an implementation at all: `--torch-impl ...:STUDENT_N_HEADS`
