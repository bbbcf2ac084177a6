"""The math of tanh attention, once, as pure ``jax.numpy`` functions (the JAX twin of ``torch_impl.formulas``).

Every JAX entry point (the ``custom_vjp`` and ``custom_jvp`` rules in ``jax_impl.sharded.blocks``) calls these
functions; equation numbers are those of ``derivation.md``: :math:`X = Q K^\\top` (1), :math:`A = \\tanh X` (2),
:math:`O = A V` (3), with :math:`Q, K \\in \\mathbb{F}^{n \\times d}`,
:math:`V \\in \\mathbb{F}^{n \\times e}`, :math:`\\mathbb{F} \\in \\{\\mathbb{R}, \\mathbb{C}\\}`.

**Convention.**  JAX's (``jax.vjp``): the VJP of a holomorphic function is the plain transpose of its Jacobian, no
conjugates, eqs. (18)-(22); torch_impl's (9)-(13) conjugate, related by (17),
``vjp_torch(g) = conj(vjp_jax(conj(g)))``; for real dtypes they coincide.  The JVP (14)-(16) is the same in both.

**Zero cotangents.**  A cotangent or tangent may be ``None``, a *symbolic* zero (the rules are registered with
``symbolic_zeros=True`` and map ``SymbolicZero`` to ``None``): its terms are skipped, since under ``jax.jit`` XLA
does *not* remove ``dot(zeros, v)`` (a loss of ``a`` alone would pay (18)'s ``G_O Vᵀ`` and (22)).  Gradients
nobody asked for need no mask: under ``jit`` they are dead code.

Nothing here validates its inputs (``jax_impl.validation``) or can modify them (JAX arrays are immutable).  All
functions are differentiable ``jnp`` ops, so the VJP can be differentiated again and the JVP is linear in its
tangents (so JAX can transpose it).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import jax.numpy as jnp
from jax import Array

__all__ = [
    "attn_forward", "attn_backward", "attn_jvp", "total_grad_a",
    "scores_vjp", "tanh_vjp", "mix_vjp", "scores_jvp", "tanh_jvp", "mix_jvp",
]


def attn_forward(q: Array, k: Array, v: Array) -> Tuple[Array, Array]:
    r"""Eqs. (1)-(3): tanh attention; returns ``(o, a)``.

    .. math::
        A = \tanh(Q K^\top), \qquad O = A V

    Args:
      q: ``(n, d)``.  k: ``(n, d)``.  v: ``(n, e)``.
    Returns:
      ``(o, a)`` of shapes ``(n, e)`` and ``(n, n)``.  ``x = q kᵀ`` is not returned (never saved).
    """
    x = q @ k.T                                                     # (1)
    a = jnp.tanh(x)                                                 # (2)
    o = a @ v                                                       # (3)
    return o, a


# --- the three building blocks (1), (2), (3): VJP and JVP of each ------------------------------------------

def scores_vjp(grad_x: Array, q: Optional[Array], k: Optional[Array],
               output_mask: Sequence[bool] = (True, True)) -> Tuple[Optional[Array], Optional[Array]]:
    r"""VJP of the scores block ``x = q kᵀ`` (1), JAX's convention: eqs. (20)-(21) (torch's (4)-(5) unconjugated).

    .. math::
        G_Q = G_X K, \qquad G_K = G_X^\top Q

    ``output_mask = (grad q wanted, grad k wanted)``, as in torch_impl (under ``jit`` XLA would drop an unused
    product anyway; eagerly the mask saves it).  ``G_K`` is computed as ``(Qᵀ G_X)ᵀ``, as ``G_V`` in
    :func:`mix_vjp`: the (m, n) ``G_X`` is then read by rows, and when q's rows are sharded the sum over devices
    runs on the small (d, n) product before the transpose.  As ``G_Xᵀ Q`` XLA's CPU dot reads ``G_X`` transposed:
    sharded fwd+bwd steps with q's rows split (``jit`` rows, all-gather) ran 0.98-1.00 of autodiff that way and
    0.68-0.86 this way (n=1024, d=e=64, P=4; benchmarks/distributed_jax.py); one device ties either way."""
    grad_q = grad_x @ k if output_mask[0] else None                 # (20)
    grad_k = (q.T @ grad_x).T if output_mask[1] else None           # (21), as (Qᵀ G_X)ᵀ
    return grad_q, grad_k


def tanh_vjp(grad_a: Array, a: Array) -> Array:
    r"""VJP of ``a = tanh x`` (2) from the saved output ``a`` (tanh is not recomputed): eq. (19).

    .. math::
        G_X = G_A \odot (1 - A^2)

    No conjugate: JAX's convention (torch's (6)/(10) has ``conj(1 − A²)``)."""
    return grad_a * (1 - a * a)                                     # (19)


def mix_vjp(grad_o: Array, a: Optional[Array], v: Optional[Array],
            output_mask: Sequence[bool] = (True, True)) -> Tuple[Optional[Array], Optional[Array]]:
    r"""VJP of the mixing block ``o = a v`` (3), JAX's convention: the ``G_O Vᵀ`` term of (18), and (22).

    .. math::
        G_A = G_O V^\top, \qquad G_V = A^\top G_O

    ``output_mask = (grad a wanted, grad v wanted)``.  ``G_V`` is computed as ``(G_Oᵀ A)ᵀ``, the form JAX's own
    transpose rule of ``a @ v`` emits: the n×n ``a`` is the dot's right operand, contracted over its rows.  As
    ``Aᵀ G_O`` XLA's CPU dot reads ``a`` transposed, and a sharded fwd+bwd step ran ~8 % slower than autodiff's
    (benchmarks/distributed_jax.py, rows layout)."""
    grad_a = grad_o @ v.T if output_mask[0] else None               # (18) first term
    grad_v = (grad_o.T @ a).T if output_mask[1] else None           # (22), as (G_Oᵀ A)ᵀ
    return grad_a, grad_v


def scores_jvp(q: Array, k: Array, q_dot: Optional[Array], k_dot: Optional[Array]) -> Optional[Array]:
    r"""JVP of ``x = q kᵀ``: eq. (14); ``None`` tangents are zeros, and ``None`` is returned when both are.

    .. math::
        \dot X = \dot Q K^\top + Q \dot K^\top
    """
    return _sum(None if q_dot is None else q_dot @ k.T,            # (14), first term
                None if k_dot is None else q @ k_dot.T)            # (14), second term


def tanh_jvp(x_dot: Array, a: Array) -> Array:
    r"""JVP of ``a = tanh x``: eq. (15), the same elementwise factor as (19) (a JVP is convention-free).

    .. math::
        \dot A = (1 - A^2) \odot \dot X
    """
    return (1 - a * a) * x_dot                                      # (15)


def mix_jvp(a: Array, v: Array, a_dot: Optional[Array], v_dot: Optional[Array]) -> Optional[Array]:
    r"""JVP of ``o = a v``: eq. (16); ``None`` tangents are zeros, and ``None`` is returned when both are.

    .. math::
        \dot O = \dot A V + A \dot V
    """
    return _sum(None if a_dot is None else a_dot @ v,              # (16), first term
                None if v_dot is None else a @ v_dot)              # (16), second term


# --- the whole op: the blocks chained, with the two incoming cotangents combined by (18) ------------------

def total_grad_a(grad_o: Optional[Array], grad_a: Optional[Array], v: Optional[Array]) -> Optional[Array]:
    r"""Eq. (18): total cotangent reaching ``a``.

    .. math::
        \hat G_A = G_O V^\top + G_A

    ``a`` is used twice (returned, and multiplied by ``v``), so the two contributions add.  Either cotangent may
    be ``None`` (a symbolic zero); its term is skipped, and ``None`` is returned when both are."""
    return _sum(None if grad_o is None else mix_vjp(grad_o, None, v, (True, False))[0],   # (18) first term
                grad_a)


def attn_backward(
    grad_o: Optional[Array], grad_a: Optional[Array], q: Optional[Array], k: Optional[Array], v: Optional[Array],
    a: Array, output_mask: Sequence[bool] = (True, True, True),
) -> Tuple[Optional[Array], Optional[Array], Optional[Array]]:
    r"""Eqs. (18)-(22), the VJP of ``(o, a) = attn(q, k, v)`` in JAX's convention (what ``jax.vjp`` computes).

    .. math::
        \hat G_A &= G_O V^\top + G_A      && (18) \\
        G_X &= \hat G_A \odot (1 - A^2)   && (19) \\
        G_Q &= G_X K                      && (20) \\
        G_K &= G_X^\top Q                 && (21) \\
        G_V &= A^\top G_O                 && (22)

    Args:
      grad_o: cotangent of ``o``, ``(n, e)``, or ``None``.  grad_a: cotangent of ``a``, ``(n, n)``, or ``None``.
        ``None`` is a symbolic zero (that output did not reach the loss); its terms are skipped.
      q, k, v: the primal inputs (``q`` is read only for G_K, ``k`` only for G_Q).  a: the saved output.
      output_mask: ``(q, k, v)``, which cotangents to compute, as in torch_impl (under ``jit`` XLA would drop an
        unused one anyway; eagerly the mask saves it).
    Returns:
      ``(grad_q, grad_k, grad_v)``; an entry is ``None`` (a zero cotangent, which ``custom_vjp`` accepts) when
      it is masked out or the given cotangents cannot reach it.
    """
    want_q, want_k, want_v = output_mask
    grad_v = mix_vjp(grad_o, a, None, (False, True))[1] if want_v and grad_o is not None else None   # (22)
    g_a = total_grad_a(grad_o, grad_a, v) if want_q or want_k else None                              # (18)
    if g_a is None:
        return None, None, grad_v
    g_x = tanh_vjp(g_a, a)                                                                           # (19)
    return (*scores_vjp(g_x, q, k, (want_q, want_k)), grad_v)                                        # (20), (21)


def attn_jvp(
    q: Array,
    k: Array,
    v: Array,
    a: Array,
    q_dot: Optional[Array],
    k_dot: Optional[Array],
    v_dot: Optional[Array],
) -> Tuple[Array, Array]:
    r"""Eqs. (14)-(16), the JVP (pushforward) of ``(o, a)``; identical in every complex convention because the
    op is holomorphic.

    .. math::
        \dot X &= \dot Q K^\top + Q \dot K^\top   && (14) \\
        \dot A &= (1 - A^2) \odot \dot X         && (15) \\
        \dot O &= \dot A V + A \dot V            && (16)

    A ``None`` tangent is a (symbolic) zero tangent and its term is skipped.  Linear in ``(q_dot, k_dot,
    v_dot)`` with ``q, k, v, a`` as constants, so JAX can transpose it into the VJP.  Returns
    ``(o_dot, a_dot)``, both arrays (a JVP rule must give one per output): with no tangent on q and k, Ȧ = 0 is
    the one zero array built.  Some tangent is given (JAX never calls a rule whose tangents are all zero).
    """
    x_dot = scores_jvp(q, k, q_dot, k_dot)                                                           # (14)
    a_dot = None if x_dot is None else tanh_jvp(x_dot, a)                                            # (15)
    o_dot = mix_jvp(a, v, a_dot, v_dot)                                                              # (16)
    return o_dot, jnp.zeros_like(a) if a_dot is None else a_dot


def _sum(first: Optional[Array], second: Optional[Array]) -> Optional[Array]:
    """``first + second`` where ``None`` is a zero that is never built; ``None`` when both are."""
    return second if first is None else first if second is None else first + second
