"""The torch side of ``--shards``: each layout of ``torch_impl.sharded.layouts.LAYOUTS`` as a candidate on ``world``
gloo ranks (:class:`TorchCandidate`), and the rank worker that runs every layout on every case
(:func:`rank_main`), started by :func:`main` in the child of ``run_layouts``.

This module imports torch.distributed at its top: only the child and its ranks import it (the parent of the run
never does; its side of ``--shards`` is ``crosscheck.shards.rows``).
"""

from __future__ import annotations

import datetime
import pickle
import traceback
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, distribute_tensor

import torch_impl

from ..errors import first_line
from ..parts import EagerExecutor
from ..ranks import run_ranks
from ..specs import Side
from ..torch_oracles import to_native
from . import torch_layouts as D
from ..remote.process import run_job
from .payload import STUCK_S, TIMEOUT_S, Payload, candidate, disagreement, rank_outcome

__all__ = ["TorchCandidate", "rank_main", "main"]

# what the forkserver imports once, so that each rank does not pay torch's import
PRELOAD = ("torch", "torch.distributed.tensor", "torch_impl", "torch_impl.sharded.layouts", "crosscheck.shards.torch_ranks")


class TorchCandidate:
    """The torch candidate of ``layout`` (a ``torch_impl.sharded.layouts.Layout``) on ``mesh``, every request through
    ``distributed.run_layout``.  ``broken``: set when a request raised on this rank (the collectives may be out of
    step); later requests raise at once until the caller has re-synchronised the ranks on a fresh group."""

    def __init__(self, mesh, layout, world: int):
        self.mesh, self.layout, self.world = mesh, layout, world
        self.name = candidate("torch", layout.name, world)
        self.broken: Optional[str] = None

    def side(self) -> Side:
        """Its :class:`~crosscheck.specs.Side`: forward, VJP and second order, each request guarded."""
        name, guarded = self.name, self.guarded
        return Side(forward=guarded(self.forward), vjp=guarded(self.vjp), jvp=None,
                    reference=torch_impl.attn_reference,
                    source=f"torch_impl.sharded layout {self.layout.name!r} on {self.world} gloo ranks",
                    forward_is_hand=True,
                    jvp_missing=f"{name}: the DTensor layouts and the ring have no forward-mode rule (a tangent on a "
                                f"DTensor is refused)", candidate=name, vjp_vjp=guarded(self.vjp_vjp))

    def guarded(self, fn):
        """``fn``, refused while this rank is broken, and breaking it when it raises."""
        def run(*args):
            if self.broken:
                raise RuntimeError(f"not run: an earlier request of this case raised on a rank ({self.broken})")
            try:
                return fn(*args)
            except Exception as exc:
                self.broken = first_line(exc)
                raise
        return run

    def forward(self, q, k, v):
        out = D.run_layout(self.mesh, self.layout, q, k, v, None, None, (False, False, False))
        return out["o"], out["a"]

    def vjp(self, inputs, requests):
        return [D.run_layout(self.mesh, self.layout, *inputs, cots[0], cots[1], tuple(bool(w) for w in wrt))["grads"]
                for wrt, cots in requests]

    def _like(self, full, dt):
        """A cotangent of ``dt``: replicated where ``dt`` is Partial."""
        placement = dt.placements[0]
        return distribute_tensor(full.detach(), self.mesh, [Replicate() if placement.is_partial() else placement])

    def _outputs(self, inputs, g):
        """Fresh DTensor leaves of ``inputs``, the layout's outputs on them, and ``g`` laid out as the outputs."""
        dts = D.distribute_inputs(self.mesh, self.layout, *inputs, requires_grad=True)
        outs = tuple(self.layout.fn(*dts))
        return dts, outs, tuple(self._like(c, o) for c, o in zip(g, outs))

    def vjp_vjp(self, inputs, g, w):
        """Second order through the sharded backward (``create_graph=True``), taken two ways.  The part w.r.t. the
        inputs as a gradient penalty takes it: the cotangents are constants (a loss linear in the outputs, as
        ``o.sum()``), so a backward that leaves the graph unless its incoming gradient requires grad
        (``once_differentiable``) gives no second order and disagrees with the reference instead of raising.  The
        part w.r.t. the cotangents with cotangents requiring grad.  Every layout has a second order: any error
        (DTensor's own ``NotImplementedError`` for an op it has no rule for included) is a failure."""
        dts, outs, consts = self._outputs(inputs, g)
        cots = tuple(c.clone().requires_grad_() for c in consts)

        def second(cotangents, wrt):
            grads = torch.autograd.grad(outs, dts, cotangents, create_graph=True)
            pairs = [(gr, self._like(wi, gr)) for gr, wi in zip(grads, w) if gr is not None and gr.requires_grad]
            if not pairs:                              # no gradient in the graph: its second order is zero
                return (None,) * len(wrt)
            return torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs], allow_unused=True,
                                       retain_graph=True)      # the forward's graph serves both ways

        both = second(consts, dts) + second(cots, cots)
        return tuple(None if s is None else s.full_tensor().detach() for s in both)

    def inplace_probe(self, inputs, g):
        """The outcome of a backward after an in-place write on each output (``{"o": ..., "a": ...}``): the
        gradients (full tensors), or ``("raised", message)``.  Judged against the reference's outcome."""
        found = {}
        for i, out_name in enumerate(("o", "a")):
            dts, outs, cots = self._outputs(inputs, g)
            outs[i].mul_(0.5)                          # the user's in-place write
            try:
                grads = torch.autograd.grad(outs, dts, cots, allow_unused=True)
            except RuntimeError as exc:
                found[out_name] = ("raised", first_line(exc))
                continue
            found[out_name] = tuple(None if s is None else s.full_tensor().detach().numpy() for s in grads)
        return found


class _Meshes:
    """Fresh groups with a short timeout, each a mesh of its own name (DTensor caches plans per mesh: a new name, no
    stale plan)."""

    def __init__(self, world: int):
        self.world, self.made = world, 0

    def fresh(self) -> DeviceMesh:
        self.made += 1
        group = dist.new_group(list(range(self.world)), timeout=datetime.timedelta(seconds=STUCK_S))
        return DeviceMesh.from_group(group, "cpu", mesh_dim_names=(f"shards{self.made}",))


def rank_main(rank: int, world: int, port: int, payload_path: str, out_path: str) -> None:
    """One gloo rank: every layout on every case; rank 0 writes the results."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        with open(payload_path, "rb") as f:
            payload: Payload = pickle.load(f)
        executor, meshes = EagerExecutor("torch", "cpu"), _Meshes(world)
        layouts = payload.named_layouts("--torch-layouts") or D.sharded_layouts()
        results = {name: _layout_results(payload, layout, executor, meshes) for name, layout in layouts.items()}
        if rank == 0:
            with open(out_path, "wb") as f:
                pickle.dump(results, f)
    except BaseException:
        raise RuntimeError(f"rank {rank}: {traceback.format_exc()}")
    finally:
        dist.destroy_process_group()


def _layout_results(payload: Payload, layout, executor, meshes: _Meshes) -> List[dict]:
    """One layout on every case, on a fresh group after a case where a rank raised (the old one may be out of
    step)."""
    results, cand = [], None
    for cs in payload.cases:
        if cand is None:
            mesh = meshes.fresh()
            cand = TorchCandidate(mesh, layout, payload.world)
            side, probe = cand.side(), cand.guarded(cand.inplace_probe)
        job = payload.job(side, cs)
        res = run_job(executor, job)
        if job.case.all_paths and res.error is None and not cand.broken:
            res.inplace = _run_probe(probe, job.case)
        every = _every_rank(payload.world, rank_outcome(cand.broken, res.inplace))
        res.ranks = disagreement(every)
        results.append(res)
        if any(o[0] for o in every):
            cand = None
    return results


def _every_rank(world: int, mine: tuple) -> list:
    """Every rank's outcome of a case, on the default group: a request that raised on one rank only leaves the
    others in a collective until STUCK_S, and rank 0 alone writes the results, so a rank whose outcome differs from
    rank 0's makes the case a failure that names it."""
    every = [None] * world
    dist.all_gather_object(every, mine)
    return every


def _run_probe(probe, case):
    """The in-place probe on the case's inputs and both-output cotangent, or ``{"error": text}``."""
    conv = lambda xs: tuple(None if a is None else to_native(a, "cpu") for a in xs)     # noqa: E731
    try:
        return probe(conv(case.inputs), conv(case.second[0]))
    except Exception as exc:                           # noqa: BLE001
        return {"error": first_line(exc)}


def main(payload_path: str, out_path: str) -> None:
    """The child of ``run_layouts`` for torch: every layout on ``world`` gloo ranks, one spawn, with a deadline;
    rank 0 writes the results (started with ``-c``: the forkserver has no main module to import)."""
    with open(payload_path, "rb") as f:
        payload: Payload = pickle.load(f)
    try:
        run_ranks(rank_main, payload.world, (payload_path, out_path), timeout_s=payload.timeout, preload=PRELOAD)
    except TimeoutError as exc:
        raise SystemExit(str(exc)) from None
