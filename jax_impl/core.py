"""Tanh attention as JAX functions with hand-written derivative rules.

* :func:`attn` — ``jax.custom_vjp``: the ``fwd`` rule saves ``(q, k, v, a)`` (the output ``a``, never
  ``x = q kᵀ``; ``tanh`` is not recomputed) and the ``bwd`` rule is the VJP (18)-(22).  Reverse mode only:
  ``jax.jvp`` / ``jax.jacfwd`` of a ``custom_vjp`` function raise (JAX's design).
* :func:`attn_jvp` — ``jax.custom_jvp``: the JVP rule (14)-(16).  Forward mode directly; reverse mode by JAX
  transposing the (linear-in-tangents) rule — an independent second check of the JVP formula.
* :func:`attn_reference` — the plain composite, differentiated by JAX's own autodiff: the oracle.
* :func:`attn_block` / :func:`attn_block_jvp` — the same two rules under the block contract (q (m, d) against
  k (n, d), v (n, e); eq. (32)), for local shards inside ``shard_map``.

All rules are thin: they call ``jax_impl.formulas`` through ``jax_impl.sharding`` (which is the formulas
themselves, except on mesh axes of ``AxisType.Explicit``, where it states the results' shardings).  Both are
registered with ``symbolic_zeros=True``, so an output that does not reach the loss (or an input without a
tangent) reaches the formulas as ``None`` and its terms are skipped, as torch_impl does; with dense zeros XLA
would keep ``dot(zeros, ·)`` (a loss of ``a`` alone measured 1.8x slower at n=4096).  Each public function
validates its arguments first (``jax_impl.validation``, eagerly at trace time) and then converts numpy inputs with
``jnp.asarray`` — so, as everywhere in JAX, float64 / complex128 numpy inputs become float32 / complex64 unless x64
is enabled.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.custom_derivatives import SymbolicZero

from . import sharding
from .validation import check_block_inputs, check_inputs

__all__ = ["AttnOutput", "attn", "attn_jvp", "attn_reference", "attn_block", "attn_block_jvp"]


class AttnOutput(NamedTuple):
    """Result of the ``attn`` functions: ``o = tanh(q kᵀ) v`` of shape (n, e) and ``a = tanh(q kᵀ)`` of shape
    (n, n).  A NamedTuple is a pytree, so it passes through ``jit`` / ``vmap`` / ``grad`` and is the structure of
    the cotangent the ``custom_vjp`` bwd rule receives."""

    o: Array
    a: Array


def _none_if_zero(t):
    """``SymbolicZero`` (JAX's marker for a structurally zero (co)tangent) -> ``None``, the formulas' zero."""
    return None if isinstance(t, SymbolicZero) else t


def _forward(q: Array, k: Array, v: Array) -> AttnOutput:
    """The primal function of both custom-derivative wrappers below."""
    return AttnOutput(*sharding.attn_forward(q, k, v))             # (1)-(3)


# --- custom_vjp: hand-written reverse mode ------------------------------------------------------------------

_attn_custom_vjp = jax.custom_vjp(_forward)


def _attn_fwd(q, k, v):
    # symbolic_zeros=True: each argument is a CustomVJPPrimal(value, perturbed).  Every residual is needed by
    # some gradient and, under jit, XLA drops gradients nobody asked for, so all four are saved.
    q, k, v = q.value, k.value, v.value
    out = _forward(q, k, v)                                         # (1)-(3)
    return out, (q, k, v, out.a)                                    # residuals: inputs and the output a only


def _attn_bwd(residuals, cotangent: AttnOutput):
    # `cotangent` has the output's structure.  With symbolic_zeros=True an output that did not reach the loss
    # arrives as a SymbolicZero (like torch's None), not as a dense zero array, and its terms are skipped.
    q, k, v, a = residuals
    return sharding.attn_backward(                                  # (18)-(22)
        _none_if_zero(cotangent.o), _none_if_zero(cotangent.a), q, k, v, a)


_attn_custom_vjp.defvjp(_attn_fwd, _attn_bwd, symbolic_zeros=True)


# --- custom_jvp: hand-written forward mode; reverse mode by transposition -----------------------------------

_attn_custom_jvp = jax.custom_jvp(_forward)


def _attn_jvp_rule(primals, tangents):
    q, k, v = primals
    q_dot, k_dot, v_dot = map(_none_if_zero, tangents)              # SymbolicZero for inputs without a tangent
    out = _forward(q, k, v)                                         # (1)-(3)
    return out, AttnOutput(*sharding.attn_jvp(q, k, v, out.a, q_dot, k_dot, v_dot))   # (14)-(16)


_attn_custom_jvp.defjvp(_attn_jvp_rule, symbolic_zeros=True)


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
    return _attn_custom_vjp(*_prepare(q, k, v))


def attn_jvp(q: Array, k: Array, v: Array) -> AttnOutput:
    r"""Tanh attention with the hand-written JVP (``jax.custom_jvp``), eqs. (14)-(16).

    Same arguments, result and errors as :func:`attn`.  Supports forward mode (``jax.jvp``, ``jax.jacfwd``) and,
    by JAX's transposition of the JVP rule, reverse mode too."""
    return _attn_custom_jvp(*_prepare(q, k, v))


def attn_reference(q: Array, k: Array, v: Array) -> AttnOutput:
    """The plain composite of three ``jnp`` ops, differentiated by JAX's autodiff: the oracle for comparisons.

    Same input checks as :func:`attn`, so both raise the same errors."""
    q, k, v = _prepare(q, k, v)
    a = jnp.tanh(q @ k.T)
    return AttnOutput(a @ v, a)


# --- the block: local shards (q's rows independent of k's), eq. (32)-(36) ---------------------------------------

def _prepare_block(q, k, v):
    check_block_inputs(q, k, v)                                     # raises before any compute
    return sharding.match_vma(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))


def attn_block(q: Array, k: Array, v: Array) -> AttnOutput:
    r"""One block (I, J) of tanh attention, eq. (32): ``q (m, d)`` against ``k (n, d)``, ``v (n, e)``.

    The same ``jax.custom_vjp`` as :func:`attn` (its formulas are shape-generic: the block's VJP (33)-(35) *is*
    (18)-(22) on the block), under the block contract (``check_block_inputs``: m may differ from n; messages
    start with ``attn_block():``).  Meant for local shards inside ``jax.shard_map``, e.g. the rows layout: q
    sharded over rows, k, v replicated (``in_specs=(P("x"), P(), P())``).  Inside ``shard_map`` with
    ``check_vma=True`` the inputs are first cast to one varying type (``sharding.match_vma``), so the gradient
    of a replicated k or v comes back summed over the row blocks, (35), as one all-reduce.

    Returns ``AttnOutput(o, a)`` with ``o: (m, e)``, ``a: (m, n)``.  For forward mode use
    :func:`attn_block_jvp`."""
    return _attn_custom_vjp(*_prepare_block(q, k, v))


def attn_block_jvp(q: Array, k: Array, v: Array) -> AttnOutput:
    """:func:`attn_block` with the hand-written JVP (``jax.custom_jvp``, the block's (36) = (14)-(16)); reverse
    mode by transposition, as :func:`attn_jvp`."""
    return _attn_custom_jvp(*_prepare_block(q, k, v))
