"""Tanh attention as JAX functions with hand-written derivative rules: the lab's entries.

* :func:`attn` — ``jax.custom_vjp``: the VJP (18)-(22), reverse mode (``jax.grad``, ``jax.vjp``, to any order).
* :func:`attn_jvp` — ``jax.custom_jvp``: the JVP rule (14)-(16).  Forward mode directly; reverse mode by JAX
  transposing the rule — an independent second check of the JVP formula.
* :func:`attn_reference` — the plain composite, differentiated by JAX's own autodiff: the oracle.

The rules themselves are the block's (``jax_impl.sharded.blocks``: ``attn_custom_vjp`` / ``attn_custom_jvp``, eq.
(32)-(36); the formulas are shape-generic, so the whole op is the block with m = n), which call
``jax_impl.formulas`` through ``jax_impl.sharded.rules`` (the formulas themselves, except on mesh axes of
``AxisType.Explicit``).  Each public function validates its arguments first (``jax_impl.validation``, eagerly at
trace time) and then converts numpy inputs with ``jnp.asarray`` — so, as everywhere in JAX, float64 / complex128
numpy inputs become float32 / complex64 unless x64 is enabled.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from .output import AttnOutput
from .sharded.blocks import attn_custom_jvp, attn_custom_vjp
from .validation import check_inputs

__all__ = ["AttnOutput", "attn", "attn_jvp", "attn_reference"]


# --- public entry points --------------------------------------------------------------------------------------

def _prepare(q, k, v):
    check_inputs(q, k, v)                                           # raises before any compute
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


def attn(q: Array, k: Array, v: Array) -> AttnOutput:
    r"""Tanh attention with the hand-written VJP (``jax.custom_vjp``).

    .. math::
        A = \tanh(Q K^\top), \qquad O = A V

    Args:
      q: ``(n, d)`` queries.  k: ``(n, d)`` keys.  v: ``(n, e)`` values.  ``jax.Array`` or ``numpy.ndarray``, one
        floating-point or complex dtype; n, d, e may be 0.  Batch with ``jax.vmap``.
    Returns:
      ``AttnOutput(o, a)`` with ``o: (n, e)`` and ``a: (n, n)``; both differentiable in reverse mode
      (``jax.grad``, ``jax.vjp``, ``jax.jacrev``, to any order).  For forward mode use :func:`attn_jvp`.
    Raises:
      TypeError / ValueError naming the offending argument (see ``jax_impl.validation``), at trace time.

    Example:
      >>> import jax.numpy as jnp, jax_impl
      >>> o, a = jax_impl.attn(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 4)))
      >>> o.shape, a.shape
      ((2, 4), (2, 2))
    """
    return attn_custom_vjp(*_prepare(q, k, v))


def attn_jvp(q: Array, k: Array, v: Array) -> AttnOutput:
    r"""Tanh attention with the hand-written JVP (``jax.custom_jvp``), eqs. (14)-(16).

    Same arguments, result and errors as :func:`attn`.  Supports forward mode (``jax.jvp``, ``jax.jacfwd``) and,
    by JAX's transposition of the JVP rule, reverse mode too."""
    return attn_custom_jvp(*_prepare(q, k, v))


def attn_reference(q: Array, k: Array, v: Array) -> AttnOutput:
    """The plain composite of three ``jnp`` ops, differentiated by JAX's autodiff: the oracle for comparisons.

    Same input checks as :func:`attn`, so both raise the same errors."""
    q, k, v = _prepare(q, k, v)
    a = jnp.tanh(q @ k.T)
    return AttnOutput(a @ v, a)
