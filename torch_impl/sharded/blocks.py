"""The block operators: ``attn_lab::attn_block`` and ``attn_lab::attn_block_backward`` (eqs. (32)-(35)).

A block is the whole op applied to one row block of q and one key block of k, v (derivation.md, section 15):

    X_IJ = Q_I K_Jᵀ,  A_IJ = tanh X_IJ,  O_IJ = A_IJ V_J                          (32), one term of the sum
    Ĝ_A = G_O V_Jᴴ + G_A,  G_X = Ĝ_A ⊙ conj(1 − A²)                               (33)
    G_Q = G_X K̄_J  (a term of (34)),  G_K = G_Xᵀ Q̄_I,  G_V = Aᴴ G_O  (terms of (35))

so the kernels run ``formulas.attn_forward`` / ``formulas.attn_backward`` as ``AttnFunction`` schedules them
(``torch_impl.performance``) on ``q (m, d)``, ``k (n, d)``, ``v (n, e)`` (``validation.check_block_inputs``: m
need not be n): the operators a sharded layout runs on each rank's shards (``torch_impl.sharded.rules``).  The
pair follows ``derivatives.yaml``'s ``_backward`` pattern: ``BlockFunction`` saves ``a`` and calls the backward
op, which returns ``None`` for the gradients ``output_mask`` leaves out; the saved tensors lead its schema (for
DTensor's mesh lookup: docs/distributed.md, "Versions").  ``create_graph=True`` runs the formulas as aten ops;
forward mode is ``BlockFunction.jvp`` (36), and under ``torch.func`` the kernel runs (32) as aten ops.  On
DTensors the twin ``attn_lab::_attn_block_sharded`` reaches DTensor's sharding rule (reverse mode only).

    >>> o, a = torch.ops.attn_lab.attn_block(q, k, v)                     # q (m, d), k (n, d), v (n, e)
    >>> gq, gk, gv = torch.ops.attn_lab.attn_block_backward(q, k, v, a, go, ga, [True, True, True])
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.autograd import forward_ad

from .. import formulas, internals, performance
from ..internals import Answer
from ..support import batch_first, refuse_nested_forward_levels, sharded
from ..validation import check_block_backward_inputs, check_block_inputs, defined_grads

__all__ = ["BLOCK_SCHEMA", "BLOCK_BACKWARD_SCHEMA", "BlockFunction", "attn_block", "attn_block_backward"]

BLOCK_SCHEMA = "(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)"
BLOCK_BACKWARD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor a, Tensor? grad_o, Tensor? grad_a, bool[3] output_mask)"
                         " -> (Tensor grad_q, Tensor grad_k, Tensor grad_v)")


def _refuse_tangents(*tensors: Tensor, on_dtensors: bool = False) -> None:
    """A forward-mode tangent that would be dropped with no error: refuse it.  (On DTensors, asked of the global
    DTensors, before any collective: every rank decides alike.)"""
    for t in tensors:
        try:
            has = forward_ad.unpack_dual(t).tangent is not None
        except RuntimeError:          # under a dispatch mode (fake, DTensor's local call) no dual is visible
            has = False
        if has:
            raise NotImplementedError(
                "attn_block(): forward-mode AD on DTensors is not implemented (the sharding rules are reverse "
                "mode only); use plain tensors (JVP (14)-(16)), or reverse mode" if on_dtensors else
                "attn_lab::_attn_block_sharded: forward-mode AD is not implemented for this internal operator; "
                "use torch.ops.attn_lab.attn_block (JVP (14)-(16))")


# --- kernels -------------------------------------------------------------------------------------------------
def _block_kernel(q: Tensor, k: Tensor, v: Tensor):
    """(32) for one block after validation: ``formulas.attn_forward`` (via ``performance``) on q (m, d), k (n, d),
    v (n, e)."""
    check_block_inputs(q, k, v)
    _refuse_tangents(q, k, v)
    return performance.attn_forward(q, k, v)                                         # (32) = (1)-(3)


def _block_fake(q: Tensor, k: Tensor, v: Tensor):
    check_block_inputs(q, k, v)
    return q.new_empty((q.shape[0], v.shape[1])), q.new_empty((q.shape[0], k.shape[0]))


def _backward_kernel(q, k, v, a, grad_o, grad_a, output_mask: Sequence[bool]):
    """(33)-(35) for one block: ``formulas.attn_backward`` (via ``performance``); masked-out gradients are None."""
    check_block_backward_inputs(q, k, v, a, grad_o, grad_a)
    return performance.attn_backward(grad_o, grad_a, q, k, v, a, list(output_mask))   # (33)-(35) = (9)-(13)


def _backward_fake(q, k, v, a, grad_o, grad_a, output_mask: Sequence[bool]):
    check_block_backward_inputs(q, k, v, a, grad_o, grad_a)
    return tuple(t.new_empty(t.shape) if defined else None
                 for t, defined in zip((q, k, v), defined_grads(grad_o, grad_a, output_mask)))


# --- autograd: the forward op's derivative is the backward op -------------------------------------------------
def _setup_context(ctx, inputs, output):
    q, k, v = inputs
    ctx.save_for_backward(q, k, v, output[1])         # a is an output; q, k, v are references, no copies
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_o, grad_a):
    q, k, v, a = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:3])
    on_dtensors = sharded(q, k, v, a)
    if on_dtensors:
        # Ranks may read different outputs: decide nothing from this rank's absent gradient (rules docstring).
        from . import rules               # imported by then (the forward's rule ran); rules imports no block
        grad_o, grad_a = rules.present_cotangents(q, v, a, grad_o, grad_a)
    if torch.is_grad_enabled():
        # create_graph=True: the same formulas as aten ops, which autograd differentiates (double backward).
        if on_dtensors:                   # on each rank's shards, in the layout the forward's rule chose
            return rules.block_backward_graph(q, k, v, a, grad_o, grad_a, mask)
        return formulas.attn_backward(grad_o, grad_a, q, k, v, a, mask)              # (33)-(35)
    if not on_dtensors:
        return tuple(torch.ops.attn_lab.attn_block_backward(q, k, v, a, grad_o, grad_a, mask))
    # DTensors: DTensor caches a layout per input placements, and register_sharding cannot make output_mask
    # part of that key, so the op is asked for every gradient its output gradients reach (the layout then never
    # depends on the mask) and the unrequested ones are dropped here: at most a GEMM more per frozen input.
    grads = torch.ops.attn_lab.attn_block_backward(q, k, v, a, grad_o, grad_a, [True, True, True])
    return tuple(g if need else None for g, need in zip(grads, mask))


class BlockFunction(torch.autograd.Function):
    """``attn_block`` on plain tensors: (32) forward, the backward op (33)-(35), the JVP (36) = (14)-(16).

    What the operator's ``Autograd`` kernel applies (as ``AttnFunction`` for the whole op): ``setup_context`` and
    ``jvp`` give ``torch.autograd.forward_ad`` the hand-written tangents."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor):
        return performance.attn_forward(q, k, v)                                     # (32) = (1)-(3)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)
        ctx.save_for_forward(*inputs, output[1])                                     # (36) = (14)-(16)

    backward = staticmethod(_backward)

    @staticmethod
    def jvp(ctx, q_dot, k_dot, v_dot):
        refuse_nested_forward_levels()          # where PyTorch would get the second order wrong
        q, k, v, a = ctx.saved_tensors
        return formulas.attn_jvp(q, k, v, a, q_dot, k_dot, v_dot)                   # (36) = (14)-(16)


def _block_autograd_kernel(q: Tensor, k: Tensor, v: Tensor):
    """``Autograd`` kernel of ``attn_lab::attn_block``: the block contract (on DTensors: their global shapes, so
    every rank raises alike before any collective), then

    * DTensors: ``attn_lab::_attn_block_sharded``, the same op with ``register_autograd``'s formula (``_backward``),
      whose autograd kernel reaches DTensor's dispatch, so the sharding rules decide the layout; forward mode
      refused;
    * under a ``torch.func`` transform, where PyTorch cannot apply a Function from a kernel: (32) as aten ops,
      which the transform differentiates (as ``attn_lab::attn``);
    * else ``BlockFunction``: the backward op, and the JVP (36) for ``forward_ad``."""
    check_block_inputs(q, k, v)
    if sharded(q, k, v):
        from . import rules
        rules.register_rules()    # the sharding rules, if nothing registered them yet (once: a no-op after)
        _refuse_tangents(q, k, v, on_dtensors=True)     # (some torch releases refuse it earlier: docs, Versions)
        return tuple(torch.ops.attn_lab._attn_block_sharded(q, k, v))
    if internals.transforms_active() is not Answer.NO:
        return performance.attn_forward(q, k, v)                                     # (32), aten ops
    return BlockFunction.apply(q, k, v)


def _block_vmap(info, in_dims, q: Tensor, k: Tensor, v: Tensor):
    """Batching rule: one example checked with the block contract, then (32) on the stacks as aten ops."""
    def example(t, dim):
        if dim is None:
            return t
        return t.select(dim, 0) if t.shape[dim] > 0 else t.new_empty(t.movedim(dim, 0).shape[1:])
    check_block_inputs(*(example(t, d) for t, d in zip((q, k, v), in_dims)))
    return performance.attn_forward(*batch_first(info.batch_size, in_dims, (q, k, v))), (0, 0)   # (32)


# --- registration ---------------------------------------------------------------------------------------------
_LIB = torch.library.Library("attn_lab", "FRAGMENT")
_LIB.define("attn_block" + BLOCK_SCHEMA)
_LIB.impl("attn_block", _block_kernel, "CompositeExplicitAutograd")
_LIB.impl("attn_block", _block_autograd_kernel, "Autograd")
_LIB.define("_attn_block_sharded" + BLOCK_SCHEMA)
_LIB.impl("_attn_block_sharded", _block_kernel, "CompositeExplicitAutograd")
_LIB.define("attn_block_backward" + BLOCK_BACKWARD_SCHEMA)
_LIB.impl("attn_block_backward", _backward_kernel, "CompositeExplicitAutograd")
for _name in ("attn_block", "_attn_block_sharded"):
    torch.library.register_fake(f"attn_lab::{_name}", _block_fake, lib=_LIB)
torch.library.register_fake("attn_lab::attn_block_backward", _backward_fake, lib=_LIB)
torch.library.register_autograd("attn_lab::_attn_block_sharded", _backward, setup_context=_setup_context, lib=_LIB)
torch.library.register_vmap("attn_lab::attn_block", _block_vmap, lib=_LIB)

attn_block = torch.ops.attn_lab.attn_block.default
attn_block_backward = torch.ops.attn_lab.attn_block_backward.default
