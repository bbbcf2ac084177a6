"""The torch layouts as a checker runs them: ``sharded_layouts()`` names them, ``distribute_inputs`` builds the
DTensor inputs of one, and ``run_layout`` runs one forward and backward and gathers everything, for comparing
with ``attn_reference`` on the full tensors.  (The library's part is ``torch_impl.sharded.layouts.LAYOUTS``: each
layout's placements and entry.)  Imported by the ranks of ``--shards`` (``torch_ranks``), the tests and
``benchmarks.distributed``; it imports ``torch.distributed.tensor``.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import Replicate, distribute_tensor

from torch_impl.sharded.layouts import LAYOUTS, Layout

__all__ = ["sharded_layouts", "distribute_inputs", "run_layout"]


def sharded_layouts() -> Dict[str, Layout]:
    """Each layout's placements and entry.  A checker on ``P`` gloo ranks builds ``mesh =
    init_device_mesh("cpu", (P,))``, ``distribute_inputs(mesh, layout, q, k, v)``, calls ``layout.fn`` and
    compares ``o.full_tensor()``, ``a.full_tensor()`` and the gradients' ``full_tensor()`` with
    ``attn_reference(q, k, v)``."""
    return dict(LAYOUTS)


def distribute_inputs(mesh, layout: Layout, q: Tensor, k: Tensor, v: Tensor, requires_grad: bool = False):
    """``q, k, v`` (the same full tensors on every rank) as DTensor leaves in ``layout``'s placements."""
    out = []
    for t, p in zip((q, k, v), layout.placements):
        d = distribute_tensor(t.detach(), mesh, [p])
        out.append(d.requires_grad_(requires_grad))
    return tuple(out)


def run_layout(mesh, layout: Layout, q: Tensor, k: Tensor, v: Tensor, grad_o: Optional[Tensor],
               grad_a: Optional[Tensor], requires_grad: Sequence[bool] = (True, True, True)) -> dict:
    """On every rank of ``mesh`` (1-D) with the same full tensors: ``layout.fn`` forward, then the backward of the
    cotangents ``grad_o`` / ``grad_a`` (None: that output unused; both None: no backward) for the inputs with
    ``requires_grad``.  Returns full tensors: ``{"o", "a", "grads": (g_q, g_k, g_v)}``, a gradient None where
    not asked or not reached, comparable with ``attn_reference`` on ``q, k, v``."""
    dts = [t.requires_grad_(r) for t, r in zip(distribute_inputs(mesh, layout, q, k, v), requires_grad)]
    o, a = layout.fn(*dts)
    outs, cots = [], []
    for out, cot in ((o, grad_o), (a, grad_a)):
        if cot is not None:             # a Partial output's cotangent is replicated
            placement = out.placements[0]
            outs.append(out)
            cots.append(distribute_tensor(cot, mesh, [Replicate() if placement.is_partial() else placement]))
    wanted = [t for t in dts if t.requires_grad]
    grads = iter(torch.autograd.grad(outs, wanted, cots, allow_unused=True) if outs and wanted else ())
    full = lambda t: None if t is None else t.full_tensor().detach()              # noqa: E731
    return {"o": full(o), "a": full(a), "grads": tuple(full(next(grads)) if t.requires_grad else None for t in dts)}
