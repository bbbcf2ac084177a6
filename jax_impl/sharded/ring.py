"""The sequence-parallel ring inside ``shard_map``: tanh attention with q, k, v all sharded over rows.

* :func:`ring_attn_local` -- local shards q_I, k_I, v_I along a ``shard_map`` axis.  Device I holds q_I and one key
  block; the k/v blocks travel round the ring (``jax.lax.ppermute``) and each device adds its block's term of
  (32).  Forward: P - 1 hops.  Backward, hand-written (``jax.custom_vjp``): the k/v blocks travel again and, with
  them, the accumulators of their gradients (35), one step behind in the same hop; G_Q (34) stays home.  P - 1
  k/v blocks and P accumulator blocks (the last hop brings them home) in P + 1 collective-permutes, the torch
  ring's schedule; no all-gather.  Memory per device: its rows of a (m x n), three k/v blocks (own, in flight,
  accumulator), O(m (d + e)).
* :func:`ring_attn_local_jvp` -- the ring with a hand-written JVP (``jax.custom_jvp``, (36)): the k/v tangents
  travel with their blocks; reverse mode by JAX's transposition of it.

No softmax, so a row block's output is an exact sum over key blocks: no running max, no log-sum-exp merge.
Every block calls ``jax_impl.formulas`` (one block (I, J) is the whole op on (q_I, k_J, v_J)).  Inside
``shard_map`` shapes are local and always whole; the global entries (``jax_impl.sharded.layouts``: ``ring_attn``,
``ring_attn_jvp``) pad an n not divisible by P.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array

from . import rules
from .. import formulas
from ..output import AttnOutput
from ..validation import check_block_inputs

__all__ = ["ring_attn_local", "ring_attn_local_jvp"]


# --- the ring, inside shard_map ----------------------------------------------------------------------------------

def _next(axis_name, size, *arrays):
    """Send ``arrays`` (same rows, same dtype) to the next device of the ring and receive the previous device's:
    one hop, one collective-permute (they travel side by side in one buffer)."""
    perm = [(i, (i + 1) % size) for i in range(size)]
    packed = jax.lax.ppermute(jnp.concatenate(arrays, axis=1), axis_name, perm)
    ends = [sum(x.shape[1] for x in arrays[:i + 1]) for i in range(len(arrays) - 1)]
    return tuple(jnp.split(packed, ends, axis=1))


def _block_cols(x: Array, j, width: int) -> Array:
    """Columns ``[j * width, (j + 1) * width)`` of ``x`` (m, n): the key block J of a row block's a or G_A."""
    return jax.lax.dynamic_slice_in_dim(x, j * width, width, axis=1)


def _ring_forward(q, k, v, axis_name, tangents=None):
    """(32) round the ring and, given ``tangents`` (q_dot, k_dot, v_dot; None for a zero one), (36) with it: at
    step s device I holds key block J = (I - s) mod P, received from device I - 1, and the tangents of that block.
    Returns ``(o, a)``, or ``(o, a, o_dot, a_dot)`` given tangents.  The tangents travel in their own hop, not
    packed with k/v: JAX's linearization (reverse mode by transposition) must compute the primal outputs from
    primal values alone."""
    size, me, width = rules.axis_size(axis_name), jax.lax.axis_index(axis_name), k.shape[0]
    q_dot, k_dot, v_dot = tangents or (None, None, None)
    travelling = [t for t in (k_dot, v_dot) if t is not None]      # the k/v blocks' tangents
    o = o_dot = None
    a = jnp.zeros((q.shape[0], size * width), jnp.result_type(q, k))
    a_dot = None if tangents is None else jnp.zeros_like(a)
    for s in range(size):
        if s < size - 1:                                            # the hops, issued before this block's compute
            k_next, v_next = _next(axis_name, size, k, v)
            travelling_next = _next(axis_name, size, *travelling) if travelling else ()
        j = (me - s) % size
        o_ij, a_ij = formulas.attn_forward(q, k, v)                 # (32): X_IJ, A_IJ, A_IJ V_J
        o = o_ij if o is None else o + o_ij                         # (32): O_I = Σ_J A_IJ V_J
        a = jax.lax.dynamic_update_slice_in_dim(a, a_ij, j * width, axis=1)
        if tangents is not None:
            rest = list(travelling)
            k_dot_j = rest.pop(0) if k_dot is not None else None
            v_dot_j = rest.pop(0) if v_dot is not None else None
            o_dot_ij, a_dot_ij = formulas.attn_jvp(q, k, v, a_ij, q_dot, k_dot_j, v_dot_j)   # (36) for the block
            o_dot = o_dot_ij if o_dot is None else o_dot + o_dot_ij     # (36): Σ over key blocks
            a_dot = jax.lax.dynamic_update_slice_in_dim(a_dot, a_dot_ij, j * width, axis=1)
        if s < size - 1:
            k, v, travelling = k_next, v_next, list(travelling_next)
    return (o, a) if tangents is None else (o, a, o_dot, a_dot)


def _ring_backward(axis_name, residuals, cotangent):
    """(33)-(35) round the ring: the k/v blocks travel again, with the accumulators of their gradients (35), as the
    torch ring's schedule: the sums of the block a device has just done go on to the next device in the same hop as
    the next k/v block (one ``ppermute`` per step, issued before the step's compute: the sums are added when they
    arrive, after it), and a last hop takes them home.  P - 1 k/v blocks and P accumulator blocks in P + 1
    collective-permutes."""
    q, k, v, a = residuals
    grad_o, grad_a = (None if isinstance(t, jax.custom_derivatives.SymbolicZero) else t for t in cotangent)
    size, me, width = rules.axis_size(axis_name), jax.lax.axis_index(axis_name), k.shape[0]
    grad_q = None
    sums = ()                                                       # (G_K,J+1, G_V,J+1): the previous block's (35)
    for s in range(size):
        j = (me - s) % size
        send = ((k, v) if s < size - 1 else ()) + sums
        received = _next(axis_name, size, *send) if send and size > 1 else ()   # overlaps this block's compute
        g_a = None if grad_a is None else _block_cols(grad_a, j, width)
        gq, gk, gv = formulas.attn_backward(                        # (33)-(35) for the block (I, J)
            grad_o, g_a, q, k, v, _block_cols(a, j, width))
        if gq is not None:
            grad_q = gq if grad_q is None else grad_q + gq          # (34): Σ over key blocks, stays home
        terms = (jnp.zeros_like(k) if gk is None else gk, jnp.zeros_like(v) if gv is None else gv)
        arrived = received[2:] if s < size - 1 else received
        sums = tuple(x + t for x, t in zip(arrived, terms)) if arrived else terms   # (35): Σ over query blocks
        if s < size - 1:
            k, v = received[:2]
    grad_k, grad_v = _next(axis_name, size, *sums) if size > 1 else sums   # home to the block's owner
    return grad_q if grad_q is not None else jnp.zeros_like(q), grad_k, grad_v


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ring(q, k, v, axis_name):
    return AttnOutput(*_ring_forward(q, k, v, axis_name))


def _ring_fwd(q, k, v, axis_name):
    q, k, v = q.value, k.value, v.value                             # symbolic_zeros=True: CustomVJPPrimal
    out = AttnOutput(*_ring_forward(q, k, v, axis_name))
    return out, (q, k, v, out.a)                                    # own blocks and a's rows: no gathered k/v


_ring.defvjp(_ring_fwd, _ring_backward, symbolic_zeros=True)


def _ring_jvp_rule(axis_name, primals, tangents):
    """(32) and (36) round the ring (``_ring_forward`` with tangents): the tangents of the k/v blocks go round
    with them, in hops of their own."""
    tangents = tuple(None if isinstance(t, jax.custom_derivatives.SymbolicZero) else t for t in tangents)
    o, a, o_dot, a_dot = _ring_forward(*primals, axis_name, tangents)
    return AttnOutput(o, a), AttnOutput(o_dot, a_dot)


@partial(jax.custom_jvp, nondiff_argnums=(3,))
def _ring_fwd_mode(q, k, v, axis_name):
    return AttnOutput(*_ring_forward(q, k, v, axis_name))


_ring_fwd_mode.defjvp(_ring_jvp_rule, symbolic_zeros=True)


def ring_attn_local_jvp(q: Array, k: Array, v: Array, axis_name) -> AttnOutput:
    """:func:`ring_attn_local` with the hand-written JVP (``jax.custom_jvp``): forward mode round the ring, the
    k/v tangents travelling with their blocks (P - 1 hops of k/v, P - 1 of their tangents); reverse mode by JAX
    transposing it."""
    check_block_inputs(q, k, v)
    q, k, v = rules.match_vma(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    return _ring_fwd_mode(q, k, v, axis_name)


def ring_attn_local(q: Array, k: Array, v: Array, axis_name) -> AttnOutput:
    """The ring inside ``shard_map``: local shards q_I ``(m, d)``, k_I ``(b, d)``, v_I ``(b, e)`` of arrays
    sharded over rows along ``axis_name`` (device i holds key block i).

    Returns ``AttnOutput(o_I, a_I)``: ``o_I (m, e)`` and ``a_I (m, P*b)``, the device's rows of o and a.
    Reverse mode by the hand-written ring backward; grad-of-grad by JAX differentiating it."""
    check_block_inputs(q, k, v)
    q, k, v = rules.match_vma(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    return _ring(q, k, v, axis_name)
