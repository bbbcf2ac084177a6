"""The block of tanh attention (eqs. (32)-(36) of derivation.md, section 15) as JAX functions with hand-written
derivative rules: the ``jax.custom_vjp`` and ``jax.custom_jvp`` every JAX entry runs, and ``attn_block`` /
``attn_block_jvp``, those rules under the block contract, for local shards inside ``shard_map``.

A block is the whole op applied to one row block of q and one key block of k, v: q (m, d) against k (n, d),
v (n, e), m independent of n.  The formulas are shape-generic, so the block's VJP (33)-(35) *is* (18)-(22) on the
block and its JVP (36) is (14)-(16): one pair of rules serves the block and the whole op (``jax_impl.attn`` /
``attn_jvp`` are these rules under the lab's contract, m = n).  (torch_impl has two autograd Functions, because
its dispatcher operators have two schemas: ``torch_impl.sharded.blocks``.)

* :data:`attn_custom_vjp` -- ``jax.custom_vjp``: the ``fwd`` rule saves ``(q, k, v, a)`` (the output ``a``, never
  ``x = q kᵀ``; ``tanh`` is not recomputed) and the ``bwd`` rule is the VJP (18)-(22).  Reverse mode only:
  ``jax.jvp`` / ``jax.jacfwd`` of a ``custom_vjp`` function raise (JAX's design).
* :data:`attn_custom_jvp` -- ``jax.custom_jvp``: the JVP rule (14)-(16).  Forward mode directly; reverse mode by
  JAX transposing the (linear-in-tangents) rule -- an independent second check of the JVP formula.

Both take validated ``jax.Array`` inputs and call ``jax_impl.formulas`` through ``jax_impl.sharded.rules`` (the
formulas themselves but on ``Explicit`` mesh axes); with ``symbolic_zeros=True`` an unused output (or an input
without a tangent) reaches the formulas as ``None`` and its terms are skipped (docs/distributed-jax.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.custom_derivatives import SymbolicZero

from . import rules
from ..output import AttnOutput
from ..validation import check_block_inputs

__all__ = ["attn_custom_vjp", "attn_custom_jvp", "attn_block", "attn_block_jvp"]


def _none_if_zero(t):
    """``SymbolicZero`` (JAX's marker for a structurally zero (co)tangent) -> ``None``, the formulas' zero."""
    return None if isinstance(t, SymbolicZero) else t


def _forward(q: Array, k: Array, v: Array) -> AttnOutput:
    """The primal function of both custom-derivative wrappers below."""
    return AttnOutput(*rules.attn_forward(q, k, v))                # (1)-(3)


# --- custom_vjp: hand-written reverse mode ------------------------------------------------------------------

attn_custom_vjp = jax.custom_vjp(_forward)


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
    return rules.attn_backward(                                     # (18)-(22)
        _none_if_zero(cotangent.o), _none_if_zero(cotangent.a), q, k, v, a)


attn_custom_vjp.defvjp(_attn_fwd, _attn_bwd, symbolic_zeros=True)


# --- custom_jvp: hand-written forward mode; reverse mode by transposition -----------------------------------

attn_custom_jvp = jax.custom_jvp(_forward)


def _attn_jvp_rule(primals, tangents):
    q, k, v = primals
    q_dot, k_dot, v_dot = map(_none_if_zero, tangents)              # SymbolicZero for inputs without a tangent
    out = _forward(q, k, v)                                         # (1)-(3)
    return out, AttnOutput(*rules.attn_jvp(q, k, v, out.a, q_dot, k_dot, v_dot))   # (14)-(16)


attn_custom_jvp.defjvp(_attn_jvp_rule, symbolic_zeros=True)


# --- the block: local shards (q's rows independent of k's), eq. (32)-(36) ---------------------------------------

def _prepare_block(q, k, v):
    check_block_inputs(q, k, v)                                     # raises before any compute
    return rules.match_vma(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))


def attn_block(q: Array, k: Array, v: Array) -> AttnOutput:
    r"""One block (I, J) of tanh attention, eq. (32): ``q (m, d)`` against ``k (n, d)``, ``v (n, e)``.

    The same ``jax.custom_vjp`` as :func:`jax_impl.attn` (its formulas are shape-generic: the block's VJP (33)-(35) *is*
    (18)-(22) on the block), under the block contract (``check_block_inputs``: m may differ from n; messages
    start with ``attn_block():``).  Meant for local shards inside ``jax.shard_map``, e.g. the rows layout: q
    sharded over rows, k, v replicated (``in_specs=(P("x"), P(), P())``).  Inside ``shard_map`` with
    ``check_vma=True`` the inputs are first cast to one varying type (``rules.match_vma``), so the gradient
    of a replicated k or v comes back summed over the row blocks, (35), as one all-reduce.

    Returns ``AttnOutput(o, a)`` with ``o: (m, e)``, ``a: (m, n)``.  For forward mode use
    :func:`attn_block_jvp`."""
    return attn_custom_vjp(*_prepare_block(q, k, v))


def attn_block_jvp(q: Array, k: Array, v: Array) -> AttnOutput:
    """:func:`attn_block` with the hand-written JVP (``jax.custom_jvp``, the block's (36) = (14)-(16)); reverse
    mode by transposition, as :func:`jax_impl.attn_jvp`."""
    return attn_custom_jvp(*_prepare_block(q, k, v))
