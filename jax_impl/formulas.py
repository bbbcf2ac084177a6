"""The math of tanh attention, once, as pure ``jax.numpy`` functions (the JAX twin of ``torch_impl.formulas``).

Every JAX entry point (the ``custom_vjp`` and ``custom_jvp`` rules in ``jax_impl.core``) calls these functions;
equation numbers are those of ``derivation.md``.

.. math::

    X = Q K^\\top \\quad (1) \\qquad A = \\tanh X \\quad (2) \\qquad O = A V \\quad (3)

with :math:`Q, K \\in \\mathbb{F}^{n \\times d}`, :math:`V \\in \\mathbb{F}^{n \\times e}`,
:math:`\\mathbb{F} \\in \\{\\mathbb{R}, \\mathbb{C}\\}`.

**Convention.**  Gradients here are in JAX's convention (``jax.vjp``): the VJP of a holomorphic function is the
plain transpose of its Jacobian, with no conjugates, eqs. (18)-(22).  PyTorch's convention (``torch_impl``,
eqs. (9)-(13)) conjugates; the two are related by eq. (17),
``vjp_torch(g) = conj(vjp_jax(conj(g)))``.  For real dtypes the two coincide.  The JVP (14)-(16) is the same in
both.

**Zero cotangents.**  ``torch_impl.formulas.attn_backward`` receives ``None`` for an output that did not reach
the loss (``set_materialize_grads(False)``) and skips its terms.  JAX's ``custom_vjp`` passes the ``bwd`` rule an
array for every output — a dense zero array for an unused one — and ``custom_jvp`` likewise passes dense zero
tangents; that is JAX's default design and these formulas simply take arrays.  The skipping that torch does by
hand is done under ``jax.jit`` by XLA, which removes dead outputs and simplifies arithmetic on broadcast zeros.

Nothing here validates its inputs (see ``jax_impl.validation``); JAX arrays are immutable, so no function can
modify its arguments.  All functions are composed of differentiable ``jnp`` ops, so the VJP can itself be
differentiated (grad-of-grad) and the JVP is linear in its tangents (so JAX can transpose it).
"""

from __future__ import annotations

from typing import Tuple

import jax.numpy as jnp
from jax import Array

__all__ = ["attn_forward", "attn_backward", "attn_jvp", "scores_grad", "tanh_grad", "tanh_tangent"]


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


def scores_grad(grad_o: Array, grad_a: Array, v: Array) -> Array:
    r"""Eq. (18): total cotangent reaching ``a``.

    .. math::
        \hat G_A = G_O V^\top + G_A

    ``a`` is used twice (returned, and multiplied by ``v``), so the two contributions add."""
    return grad_o @ v.T + grad_a                                    # (18)


def tanh_grad(grad_a_total: Array, a: Array) -> Array:
    r"""Eq. (19): cotangent of the scores from the saved output ``a`` (tanh is not recomputed).

    .. math::
        G_X = \hat G_A \odot (1 - A^2)

    No conjugate: JAX's convention (torch's (10) has ``conj(1 − A²)``)."""
    return grad_a_total * (1 - a * a)                               # (19)


def tanh_tangent(x_dot: Array, a: Array) -> Array:
    r"""Eq. (15): tangent of ``a``.

    .. math::
        \dot A = (1 - A^2) \odot \dot X

    The same elementwise factor as (19); a JVP is convention-free."""
    return (1 - a * a) * x_dot                                      # (15)


def attn_backward(
    grad_o: Array, grad_a: Array, q: Array, k: Array, v: Array, a: Array
) -> Tuple[Array, Array, Array]:
    r"""Eqs. (18)-(22), the VJP of ``(o, a) = attn(q, k, v)`` in JAX's convention (what ``jax.vjp`` computes).

    .. math::
        \hat G_A &= G_O V^\top + G_A      && (18) \\
        G_X &= \hat G_A \odot (1 - A^2)   && (19) \\
        G_Q &= G_X K                      && (20) \\
        G_K &= G_X^\top Q                 && (21) \\
        G_V &= A^\top G_O                 && (22)

    Args:
      grad_o: cotangent of ``o``, ``(n, e)``.  grad_a: cotangent of ``a``, ``(n, n)``.  Both are arrays; an
        output that did not reach the loss arrives as zeros (see the module docstring for how torch differs).
      q, k, v: the primal inputs.  a: the saved output ``tanh(q kᵀ)``.
    Returns:
      ``(grad_q, grad_k, grad_v)`` of the shapes of ``q, k, v``.
    """
    g_x = tanh_grad(scores_grad(grad_o, grad_a, v), a)              # (18), (19)
    grad_q = g_x @ k                                                # (20)
    grad_k = g_x.T @ q                                              # (21)
    grad_v = a.T @ grad_o                                           # (22)
    return grad_q, grad_k, grad_v


def attn_jvp(
    q: Array, k: Array, v: Array, a: Array, q_dot: Array, k_dot: Array, v_dot: Array
) -> Tuple[Array, Array]:
    r"""Eqs. (14)-(16), the JVP (pushforward) of ``(o, a)``; identical in every complex convention because the
    op is holomorphic.

    .. math::
        \dot X &= \dot Q K^\top + Q \dot K^\top   && (14) \\
        \dot A &= (1 - A^2) \odot \dot X         && (15) \\
        \dot O &= \dot A V + A \dot V            && (16)

    Linear in ``(q_dot, k_dot, v_dot)`` with ``q, k, v, a`` as constants, so JAX can transpose it into the VJP.
    Returns ``(o_dot, a_dot)``.
    """
    x_dot = q_dot @ k.T + q @ k_dot.T                               # (14)
    a_dot = tanh_tangent(x_dot, a)                                  # (15)
    o_dot = a_dot @ v + a @ v_dot                                   # (16)
    return o_dot, a_dot
