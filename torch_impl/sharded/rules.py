"""Tanh attention on DTensors: the sharding rules of the ``attn_lab`` operators, the one hook that registers them
(``register_rules``, run when this module is imported), and ``attn``, the one route of the lab's entries
(``torch_impl.attn``, ``torch.ops.attn_lab.attn``, ``inference_mode``) to the block operator on DTensors.  Public
APIs only: ``torch.distributed.tensor.experimental.register_sharding`` and
``torch.library.register_torch_dispatch``.

The layouts, as (output placements, input placements) on one mesh dimension (eqs. (32)-(35) of derivation.md,
section 15; DTensor expands them over every mesh dimension): replicate; rows (q, o, a ``Shard(0)``; g_k, g_v
``Partial`` sums (35)); keys (k, v ``Shard(0)``; o ``Partial`` (32), a ``Shard(1)``, g_q ``Partial`` (34)).  No
collective in the ops: a ``Partial`` is reduced when read.  Other inputs are redistributed by DTensor to the
cheapest of these; for q, k, v all ``Shard(0)`` use ``torch_impl.sharded.ring`` instead, which never gathers.

``attn`` checks the lab's contract on the *global* shapes, then runs ``attn_block`` on the DTensors (its autograd
formula ``attn_block_backward`` runs the backward rule).  Under ``torch.inference_mode()`` a
``register_torch_dispatch`` rule routes ``attn_lab::attn`` the same way; its own ``register_sharding`` rules keep
the lab's same-n contract on the shards (replicate; v ``Shard(1)``).  This module reaches the operators
(``torch_impl.sharded.blocks``, ``torch_impl.ops``) through ``torch.ops`` and imports neither (the block operators
import this one lazily).  The layouts by name: ``torch_impl.sharded.layouts.LAYOUTS``; their costs:
docs/distributed.md.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor import zeros as dtensor_zeros
from torch.distributed.tensor.experimental import register_sharding

from .. import formulas
from ..output import AttnOutput
from ..validation import check_block_backward_inputs, check_block_inputs, check_inputs, defined_grads

__all__ = ["attn", "block_backward_graph", "present_cotangents", "is_dtensor", "register_rules", "HIGHER_ORDERS", "HIGHER_ORDERS_REFUSED"]

R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


def is_dtensor(*tensors) -> bool:
    return any(isinstance(t, DTensor) for t in tensors)


def attn(q: DTensor, k: DTensor, v: DTensor) -> AttnOutput:
    """The lab's op on DTensors: the lab's contract on the global shapes, then ``attn_block`` (32), whose
    sharding rules decide the layout and whose autograd formula is ``attn_block_backward`` (33)-(35).  What
    ``torch_impl.attn`` and ``torch.ops.attn_lab.attn`` run on DTensors."""
    check_inputs(q, k, v)
    return AttnOutput(*torch.ops.attn_lab.attn_block(q, k, v))


# --- sharding rules --------------------------------------------------------------------------------------------
# Each rule first checks the contract on the global metadata DTensor hands it (DTensorSpecs): sharding
# propagation runs before any redistribution, so a bad call raises the same error on every rank before any
# collective, also where no Python entry checked first (a direct call of the block ops, inference_mode).
def _global(spec) -> Optional[Tensor]:
    """A meta tensor with ``spec``'s global shape and dtype (None stays None): what the contract checks."""
    return None if spec is None else torch.empty(spec.shape, dtype=spec.tensor_meta.dtype, device="meta")


# The three layouts on one mesh dimension, as the backward rule's placements; the forward's ``a`` (its output)
# names the layout the forward rule chose: a Replicate, Shard(0) (rows) or Shard(1) (keys).
#            (grad_q, grad_k, grad_v), (q, k, v, a),   grad_o, grad_a
_BACKWARD_LAYOUTS = (
    ("replicate", (R, R, R), (R, R, R, R), R, R),
    ("rows", (S0, P, P), (S0, R, R, S0), S0, S0),        # (35) sums over row blocks I
    ("keys", (P, S0, S0), (R, S0, S0, S1), R, S1),       # (34) sums over key blocks J
)


def _attn_block_sharding(q, k, v):
    check_block_inputs(*map(_global, (q, k, v)))
    return [
        ([R, R], [R, R, R]),                    # replicate
        ([S0, S0], [S0, R, R]),                 # rows: (32) row block I is local
        ([P, S1], [R, S0, S0]),                 # keys: (32) is a sum over key blocks J -> Partial o
    ]


def _attn_block_backward_sharding(q, k, v, a, grad_o, grad_a, output_mask):
    # An absent output gradient has no placement, and neither has a gradient no output gradient reaches (torch
    # 2.11's propagation refuses a placement for an output without tensor metadata).  output_mask is not read:
    # DTensor caches this answer per input placements, whatever the mask (torch_impl.sharded.blocks asks for all three
    # gradients on DTensors; a direct call masking one out works on torch >= 2.13, and 2.11 refuses it).
    check_block_backward_inputs(*map(_global, (q, k, v, a, grad_o, grad_a)))
    defined = defined_grads(grad_o, grad_a, (True, True, True))
    return [([p if d else None for p, d in zip(grads, defined)],
             [*saved, None if grad_o is None else go, None if grad_a is None else ga, None])
            for _, grads, saved, go, ga in _BACKWARD_LAYOUTS]


# --- create_graph=True: the backward on each rank's shards -------------------------------------------------------
# DTensor.from_local / to_local are differentiable once: the backward of from_local(t, [Partial()]) takes the
# local part of the (replicated) cotangent with ``to_local()``, whose own backward declares the rank's term
# Replicate where it is one term of a sum, so a third derivative through them silently drops the other ranks'
# terms.  The pair below is each other's adjoint at every order: a local tensor's gradient leaves as a DTensor
# in the placements given (Partial: each rank's term of a sum), and a DTensor built from local terms sends back
# the local part of its cotangent, whose gradient is again a DTensor in the placements it was built with.
def _cotangent_placements(placements):
    """Where the cotangent of a DTensor in ``placements`` is read locally: a Partial's terms each see the whole."""
    return tuple(R if p.is_partial() else p for p in placements)


# Third and higher orders on DTensors (a backward of block_backward_graph's graph asked to build a graph again):
# exact from torch 2.13, wrong before (docs/distributed.md), so refused there, on every rank alike (grad mode in
# that backward is the caller's create_graph, the same on every rank) and before any collective.
HIGHER_ORDERS = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)
HIGHER_ORDERS_REFUSED = (
    f"attn(): a third derivative on DTensors needs torch >= 2.13 (this is {torch.__version__}, whose DTensor gives "
    f"a wrong one there); second order works")


def _refuse_higher_orders() -> None:
    if not HIGHER_ORDERS and torch.is_grad_enabled():
        raise NotImplementedError(HIGHER_ORDERS_REFUSED)


class _ToLocal(torch.autograd.Function):
    """``t.to_local()``; the local gradient leaves as a DTensor in ``grad_placements`` (``_FromLocal``), and a
    lazily conjugated one (autograd of ``x.conj()`` gives ``g.conj()``, a view) is resolved first: DTensor would
    otherwise hand it to a collective that cannot send it."""

    @staticmethod
    def forward(ctx, t: DTensor, grad_placements):
        ctx.set_materialize_grads(False)
        ctx.meta = (t.device_mesh, tuple(grad_placements), t.shape, t.stride())
        local = t.to_local()
        return local.view_as(local)

    @staticmethod
    def backward(ctx, grad):
        _refuse_higher_orders()
        if grad is None:
            return None, None
        mesh, grad_placements, shape, stride = ctx.meta
        return _FromLocal.apply(grad.resolve_conj(), mesh, grad_placements, shape, stride), None


class _FromLocal(torch.autograd.Function):
    """``DTensor.from_local(t, mesh, placements, shape=..., stride=...)``; its backward reads the cotangent in
    ``_cotangent_placements(placements)`` and takes the local part with ``_ToLocal``, whose gradient leaves in
    ``placements`` again (a Partial's terms: summed across ranks).

    ``guards``: the DTensors whose values the backward of ``t``'s graph reads (inputs, ``a``, the output
    gradient), saved here and unpacked first in the backward, so that autograd's version check sees an in-place
    write on any of them since: the graph of (33)-(35) holds their local shards, which DTensor's in-place ops
    write without bumping the local tensors' version counters (only the DTensor's own), so without this the
    double backward would silently differentiate the written values, where autograd of DTensor's own ops raises
    "modified by an inplace operation"."""

    @staticmethod
    def forward(ctx, t: Tensor, mesh, placements, shape, stride, *guards):
        ctx.set_materialize_grads(False)
        ctx.meta = (mesh, tuple(placements), len(guards))
        ctx.save_for_backward(*guards)
        return DTensor.from_local(t.view_as(t), mesh, placements, run_check=False, shape=shape, stride=stride)

    @staticmethod
    def backward(ctx, grad):
        _refuse_higher_orders()
        mesh, placements, n_guards = ctx.meta
        ctx.saved_tensors                 # the version check (raises on every rank alike, before any collective)
        if grad is None:
            return (None,) * (5 + n_guards)
        grad = grad.resolve_conj().redistribute(mesh, _cotangent_placements(placements))
        return (_ToLocal.apply(grad, placements), None, None, None, None, *(None,) * n_guards)


def _layouts_of(a: DTensor, what: str) -> list:
    """The backward layout on each mesh dimension, read from the forward's ``a`` (its placement names the
    layout the forward rule chose)."""
    layouts = []
    for placement in a.placements:
        match = [lay for lay in _BACKWARD_LAYOUTS if lay[2][3] == placement]
        if not match:
            raise NotImplementedError(f"attn_block(): {what} on DTensors: a has placement {placement}, "
                                      f"which no rule of attn_block gives")
        layouts.append(match[0])
    return layouts


def present_cotangents(q: DTensor, v: DTensor, a: DTensor, grad_o: Optional[DTensor], grad_a: Optional[DTensor]):
    """The output gradients the backward on DTensors runs with: an absent ``grad_o`` (o unused *on this rank*)
    becomes zeros where ``grad_a`` arrived.

    Whether an output gradient arrived is local state: each rank may read its own outputs (``o.to_local()`` on
    one rank, ``a.to_local()`` on another).  What the backward does must not depend on it, since it decides the
    gradients returned (G_V needs G_O (13)) and, under ``create_graph=True``, which inputs the graph of (33)-(35)
    reaches (G_O V_Jᴴ reaches v): a rank whose graph reaches an input another rank's does not would enter the
    collectives behind that input (its redistribution's backward) alone, and wait there for ever.  So a rank
    computes with zeros for G_O, as the ring does for local shards, in the placements ``to_local``'s backward
    gives a cotangent of ``o`` (a Partial o's: Replicate): every rank then returns the same gradients in the same
    placements and builds the same graph.  An absent ``grad_a`` stays absent: G_A enters (33) as a sum term only,
    so it changes neither.  (Both absent: autograd does not call the backward.)  Costs two GEMMs of zeros on
    ranks that do not read o."""
    if grad_o is None and grad_a is not None:
        placements = [lay[3] for lay in _layouts_of(a, "the backward")]
        grad_o = dtensor_zeros((q.shape[0], v.shape[1]), dtype=a.dtype, device_mesh=a.device_mesh,
                               placements=placements)
    return grad_o, grad_a


def block_backward_graph(q: DTensor, k: DTensor, v: DTensor, a: DTensor, grad_o: Optional[DTensor],
                         grad_a: Optional[DTensor], output_mask: Sequence[bool]):
    """``attn_block``'s backward (33)-(35) under ``create_graph=True`` on DTensors, differentiable to any order.

    The layout is the one the forward's rule chose (read from ``a``'s placement on each mesh dimension), with the
    backward rule's placements: q, k, v, a and the output gradients are redistributed to it (a no-op where they
    are there already), and ``formulas.attn_backward`` runs as aten ops on each rank's local shards, which
    autograd records; the gradients leave as DTensors in the rule's placements (a sum (34)/(35) as ``Partial``).
    The shards are taken and the gradients wrapped by ``_ToLocal`` / ``_FromLocal``, adjoint to each other at
    every order (a replicated input's local gradient is a Partial term, except in the replicate layout, where
    every rank computes the same).  So the only collectives are DTensor's redistributions of whole inputs and of
    the higher-order gradients, decided from placements and global shapes alike on every rank, and none of them
    receives a lazily conjugated view (complex dtypes): the formulas' conjugates stay local, and the pair
    resolves those autograd returns."""
    mesh = a.device_mesh
    layouts = _layouts_of(a, "create_graph=True")

    def local(t, j):
        if t is None:
            return None
        placements = [(lay[2] + lay[3:])[j] for lay in layouts]
        # The gradient of a replicated input is each rank's term of a sum, unless every rank computes the same.
        grad_placements = [P if p.is_replicate() and lay[0] != "replicate" else p
                           for p, lay in zip(placements, layouts)]
        return _ToLocal.apply(t.resolve_conj().redistribute(mesh, placements), grad_placements)

    locals_ = [local(t, j) for j, t in enumerate((q, k, v, a, grad_o, grad_a))]
    grads = formulas.attn_backward(*locals_[4:], *locals_[:4], output_mask)                   # (33)-(35)
    # What each gradient's graph reads in its double backward (23)-(27): G_X = (G_O Vᴴ + G_A) ⊙ conj(1 − A²)
    # reads v, a and G_O (G_A is a sum term only, never saved), G_Q = G_X K̄ also k, G_K = G_Xᵀ Q̄ also q,
    # G_V = Aᴴ G_O reads a and G_O.
    reads = ((k, v, a, grad_o), (q, v, a, grad_o), (a, grad_o))
    return tuple(None if g is None else
                 _FromLocal.apply(g, mesh, tuple(lay[1][i] for lay in layouts), t.shape, t.stride(),
                                  *(r for r in read if r is not None))
                 for i, (g, t, read) in enumerate(zip(grads, (q, k, v), reads)))


def _attn_sharding(q, k, v):
    # The local kernel checks the lab's contract (same n) on the shards: only layouts keeping n whole.
    check_inputs(*map(_global, (q, k, v)))
    return [
        ([R, R], [R, R, R]),
        ([S1, R], [R, R, S1]),                  # v's columns: o's columns, a whole on every rank
    ]


def _attn_on_dtensors(cls, func, types, args, kwargs):
    """``attn_lab::attn`` reached DTensor's dispatch (inference mode: no autograd kernel ran): route to ``attn``."""
    return tuple(attn(*args, **(kwargs or {})))


@functools.cache
def register_rules() -> None:
    """Register the sharding rules above with DTensor, and route ``attn_lab::attn`` on DTensors to ``attn`` (the
    one hook; once per process: later calls do nothing).  Run when this module is imported, which
    ``import torch_impl`` does when ``torch.distributed.tensor`` is already imported, and the lab's entries and
    the block operators' ``Autograd`` kernel do on their first DTensor call (``import
    torch_impl.sharded.rules`` registers them explicitly: needed before calling ``torch.ops.attn_lab.attn`` or
    ``attn_block`` on DTensors under ``inference_mode`` if nothing else did)."""
    # attn_block's autograd kernel runs the twin _attn_block_sharded on DTensors (its register_autograd kernel
    # reaches DTensor's dispatch): the same rule.
    for op in (torch.ops.attn_lab.attn_block.default, torch.ops.attn_lab._attn_block_sharded.default):
        register_sharding(op)(_attn_block_sharding)
    register_sharding(torch.ops.attn_lab.attn_block_backward.default)(_attn_block_backward_sharding)
    register_sharding(torch.ops.attn_lab.attn.default)(_attn_sharding)
    torch.library.register_torch_dispatch("attn_lab::attn", DTensor, _attn_on_dtensors, lib=_LIB)


_LIB = torch.library.Library("attn_lab", "FRAGMENT")      # holds the torch_dispatch rule (alive with the module)
register_rules()
