"""A deliberately wrong torch sharded layout, for tests/crosscheck/test_shards.py (``--torch-layouts
tests/support/planted_shards_torch.py:LAYOUTS``): the keys layout (q replicated, k and v ``Shard(0)``) whose
output o, a ``Partial`` sum over the key blocks (32), is relabelled ``Replicate`` without being reduced, so every
rank keeps only its own key blocks' terms.  ``a`` (``Shard(1)``) and the backward rule stay right, so the forward's o
and every gradient through o disagree, and nothing raises.

``PAST_FIRST_ORDER``: three more, right at first order: a backward that leaves the graph (``once_differentiable``),
an output ``a`` whose in-place writes no version counter sees, and a layout that raises on every case."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable
from torch.distributed.tensor import DTensor, Replicate

from torch_impl.sharded.layouts import LAYOUTS as RIGHT, Layout
from torch_impl.sharded.rules import attn


def _keys_unreduced(q, k, v):
    o, a = attn(q, k, v)                                          # o: Partial over the key blocks
    o = DTensor.from_local(o.to_local(), o.device_mesh, [Replicate()], run_check=False)   # planted: no reduce
    return o, a


LAYOUTS = {"keys": Layout("keys", RIGHT["keys"].placements, _keys_unreduced)}


# --- planted past first order: exact forward and first-order gradients, wrong only where --shards now looks ---

class _FirstOrderOnly(torch.autograd.Function):
    """The rows layout behind a ``once_differentiable`` backward, as a ring whose backward leaves the graph: its
    guard fires only when the incoming gradient requires grad, so a gradient penalty of a loss linear in the
    outputs (constant cotangents) silently loses its second-order term."""

    @staticmethod
    def forward(ctx, q, k, v):
        with torch.enable_grad():
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
            ctx.graph = (leaves, attn(*leaves))
        ctx.set_materialize_grads(False)
        return tuple(t.detach() for t in ctx.graph[1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_o, grad_a):
        leaves, outs = ctx.graph
        pairs = [(t, g) for t, g in zip(outs, (grad_o, grad_a)) if g is not None]
        with torch.enable_grad():
            grads = torch.autograd.grad([p[0] for p in pairs], leaves, [p[1] for p in pairs], allow_unused=True)
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def _rows_first_order_only(q, k, v):
    return _FirstOrderOnly.apply(q, k, v)


def _keys_unguarded_a(q, k, v):
    """``a`` handed back as a second DTensor around the same local shard (as a ring that wraps its saved local
    ``a`` again): an in-place write on it changes what the backward reads, and no version counter sees it."""
    o, a = attn(q, k, v)
    alias = DTensor.from_local(a.to_local(), a.device_mesh, a.placements, run_check=False, shape=a.shape,
                               stride=a.stride())
    return o, alias


def _raises(q, k, v):
    raise ValueError("planted: this layout raises on every case")


PAST_FIRST_ORDER = {
    "first_order_only": Layout("first_order_only", RIGHT["rows"].placements, _rows_first_order_only),
    "unguarded_a": Layout("unguarded_a", RIGHT["keys"].placements, _keys_unguarded_a),
    "raises": Layout("raises", RIGHT["keys"].placements, _raises),
}
