"""Sequence-parallel tanh attention: q, k, v all ``Shard(0)`` over P ranks, k/v blocks passed round a ring.

Rank r holds the row block I = r of q, k and v.  Tanh attention has no softmax, so (32)-(35) of derivation.md
(section 15) split exactly, with no running max and no logsumexp merge:

* forward, P steps: at step s rank r holds the key block J = r − s (mod P), computes the block (32)
  ``A_IJ = tanh(Q_I K_Jᵀ)`` into its columns of the local ``a`` (m, n) and adds ``A_IJ V_J`` to ``o_I``, while (k_J, v_J) already travel to rank r + 1 and (k_J−1, v_J−1)
  arrive from rank r − 1 (``torch.distributed.batch_isend_irecv``, waited for after the compute): **P − 1 hops**.
* backward, P steps: the same rotation of (k_J, v_J) (P − 1 hops, overlapped with the compute), each step
  ``attn_backward`` (33)-(35) on the block: G_Q,I gets its term of (34) locally; the terms of (35)
  for key block J are added to the accumulators (G_K,J, G_V,J), which follow the block one hop behind (sent
  after the step's compute, received during the next step's) and take a last hop home to rank J: **P − 1 + P = 2P − 1 hops** at most (fewer when a
  gradient is not needed).  Nothing is all-gathered.

Memory per rank: the forward holds the rank's ``a`` block (m, n) (an output, each key block's scores written
straight into its columns), ``o`` (m, e), its own k/v block and two travelling ones (the one computed on, the
one arriving): **a block + 3 k/v blocks + m·e**, no other scratch.  The backward holds the saved ``a`` and
the incoming G_A (both m × n), one block's G_X scratch (m × n/P, as ``performance.attn_backward`` schedules
it), three k/v blocks and the accumulators (the arriving ones, this step's terms, the ones in flight).

n not divisible by P: DTensor's ``Shard(0)`` gives ranks ``ceil(n/P)`` rows and the last ones fewer (possibly
none); every rank knows all block sizes from the global n, so the ring runs with uneven (and empty) blocks:
exact, no padding.  Complex tensors travel as ``torch.view_as_real`` views (gloo has no complex P2P).
The backward's blocks call ``performance.attn_backward`` (``formulas.attn_backward`` as ``AttnFunction``
schedules it); the forward's block is ``performance.attn_forward``'s (1)-(3) with ``out=`` into a's columns.
Double backward through the ring is not supported (``once_differentiable``: an error, not a wrong number).

    >>> o, a = ring_attn(q, k, v)            # DTensors, Shard(0) on a 1-D mesh; o, a: Shard(0) DTensors
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.distributed.tensor import DTensor, Shard

from . import performance
from .function import AttnOutput
from .validation import check_inputs

__all__ = ["ring_attn", "ring_attn_local", "block_sizes", "HOPS", "reset_hops"]

# Ring steps (rounds of P2P messages to the next rank) and bytes sent by this rank, per direction:
# what tests and benchmarks read (torch's CommDebugMode counts collectives, not P2P).
HOPS = {"forward": 0, "backward": 0, "forward_bytes": 0, "backward_bytes": 0}


def reset_hops() -> None:
    for key in HOPS:
        HOPS[key] = 0


def block_sizes(n: int, world: int) -> List[int]:
    """Rows of each rank under ``Shard(0)`` of n rows over ``world`` ranks (``torch.chunk``'s split, as DTensor)."""
    chunk = -(-n // world) if world else 0
    return [max(0, min(chunk, n - r * chunk)) for r in range(world)]


# --- P2P --------------------------------------------------------------------------------------------------
def _wire(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


class _Hop:
    """One ring step's messages: send ``tensors`` to the next rank, receive same-kind tensors of ``recv_rows``
    rows from the previous one.  Started at construction, ``wait()`` returns the received tensors."""

    def __init__(self, group, direction: str, send: Sequence[Tensor], recv_rows: int, tag: int = 0):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        nxt = dist.get_global_rank(group, (rank + 1) % world)
        prv = dist.get_global_rank(group, (rank - 1) % world)
        self.received = [t.new_empty((recv_rows, *t.shape[1:])) for t in send]
        ops = [dist.P2POp(dist.isend, _wire(t), nxt, group, tag) for t in send if t.numel()]
        ops += [dist.P2POp(dist.irecv, _wire(t), prv, group, tag) for t in self.received if t.numel()]
        self.works = dist.batch_isend_irecv(ops) if ops else []
        HOPS[direction] += 1
        HOPS[direction + "_bytes"] += sum(t.numel() * t.element_size() for t in send)

    def wait(self) -> List[Tensor]:
        for w in self.works:
            w.wait()
        return self.received


# --- the Function -----------------------------------------------------------------------------------------
class RingAttnFunction(torch.autograd.Function):
    """Local shards in, local shards out: ``q (m, d)``, ``k (m_r, d)``, ``v (m_r, e)`` on each rank of ``group``;
    ``sizes`` are all ranks' key rows.  Returns this rank's ``o (m, e)`` and ``a (m, n)``."""

    @staticmethod
    def forward(ctx, q, k, v, group, sizes):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        offsets = [sum(sizes[:j]) for j in range(world)]
        a = q.new_empty((q.shape[0], sum(sizes)))
        o = q.new_zeros((q.shape[0], v.shape[1]))
        block = (k, v)
        for step in range(world):
            j = (rank - step) % world
            hop = _Hop(group, "forward", block, sizes[(j - 1) % world]) if step < world - 1 else None
            _block_forward(q, *block, a[:, offsets[j]:offsets[j] + sizes[j]], o)          # (32), block (I, J)
            if hop is not None:
                block = tuple(hop.wait())
        ctx.save_for_backward(q, k, v, a)
        ctx.group, ctx.sizes = group, list(sizes)
        ctx.set_materialize_grads(False)
        return o, a

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        group, sizes = ctx.group, ctx.sizes
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        need_v = need_v and grad_o is not None
        if grad_o is None and grad_a is None:
            return None, None, None, None, None
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        offsets = [sum(sizes[:j]) for j in range(world)]
        # What travels: k_J for (34), v_J for G_O V_Jᴴ in (33); the accumulators (G_K,J, G_V,J) of (35).
        travel = [x for x, need in (("k", need_q), ("v", grad_o is not None and (need_q or need_k))) if need]
        accumulate = [x for x, need in (("gk", need_k), ("gv", need_v)) if need]
        grad_q = torch.zeros_like(q) if need_q else None
        block = {"k": k, "v": v}
        acc_hop = None         # the accumulators of this step's block, on their way from the previous rank
        for step in range(world):
            j = (rank - step) % world
            hop = (_Hop(group, "backward", [block[x] for x in travel], sizes[(j - 1) % world])
                   if step < world - 1 and travel else None)
            cols = slice(offsets[j], offsets[j] + sizes[j])
            g_q, g_k, g_v = performance.attn_backward(                                   # (33)-(35), block (I, J)
                grad_o, None if grad_a is None else grad_a[:, cols], q, block["k"], block["v"], a[:, cols],
                [need_q, need_k, need_v])
            if g_q is not None:
                grad_q += g_q                                                            # (34): Σ_J
            if accumulate:                                                               # (35): Σ_I
                part = dict(zip(("gk", "gv"), (g_k, g_v)))
                arrived = None if acc_hop is None else acc_hop.wait()
                acc = [part[x] if arrived is None else arrived[i].add_(part[x]) for i, x in enumerate(accumulate)]
                # on to the next rank, overlapped with the next step's compute; the last hop takes them home
                acc_hop = _Hop(group, "backward", acc, sizes[(j - 1) % world], tag=1)
            del g_q, g_k, g_v
            if hop is not None:
                block.update(zip(travel, hop.wait()))
        home = dict(zip(accumulate, acc_hop.wait())) if accumulate else {}
        return grad_q, home.get("gk"), home.get("gv"), None, None


def _block_forward(q: Tensor, k: Tensor, v: Tensor, a_cols: Tensor, o: Tensor) -> None:
    """(32) for one key block, as ``performance.attn_forward`` schedules (1)-(3), written straight into the
    block's columns of ``a`` (a strided view: BLAS writes it with its leading dimension, no temporary) and
    accumulated into ``o``."""
    torch.mm(q, k.mT, out=a_cols)                                                        # (1)
    a_cols.tanh_()                                                                       # (2)
    o.addmm_(a_cols, v)                                                                  # (3), Σ_J


# --- entries ----------------------------------------------------------------------------------------------
def ring_attn_local(q: Tensor, k: Tensor, v: Tensor, group=None, sizes: Optional[Sequence[int]] = None):
    """The ring on local shards: this rank's rows of q, k, v; ``group`` the ring's process group (default:
    the world); ``sizes`` every rank's rows (default: all equal to this rank's, i.e. n divisible by P).
    Returns ``(o, a)`` local: o (m, e), a (m, n)."""
    group = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    sizes = list(sizes) if sizes is not None else [k.shape[0]] * world
    if len(sizes) != world or sizes[dist.get_rank(group)] != k.shape[0] or k.shape[0] != q.shape[0]:
        raise ValueError(f"ring_attn(): every rank must hold its own rows of q, k and v (sizes {sizes} over "
                         f"{world} ranks), got q {tuple(q.shape)}, k {tuple(k.shape)} on rank "
                         f"{dist.get_rank(group)}")
    return RingAttnFunction.apply(q, k, v, group, sizes)


def ring_attn(q: DTensor, k: DTensor, v: DTensor) -> AttnOutput:
    """Tanh attention on DTensors q, k, v all ``Shard(0)`` on one 1-D mesh, by the ring: ``o`` and ``a`` come back
    ``Shard(0)`` (rows of a on their rank).  The lab's contract is checked on the global shapes; any n
    (uneven and empty blocks included)."""
    check_inputs(q, k, v)
    for name, t in zip("qkv", (q, k, v)):
        if not isinstance(t, DTensor) or t.device_mesh.ndim != 1 or tuple(t.placements) != (Shard(0),):
            got = type(t).__name__ if not isinstance(t, DTensor) else f"placements {tuple(t.placements)} on a " \
                                                                     f"{t.device_mesh.ndim}-D mesh"
            raise ValueError(f"ring_attn(): argument '{name}' must be a DTensor sharded Shard(0) on a 1-D mesh, "
                             f"got {got}")
    mesh = q.device_mesh
    if k.device_mesh != mesh or v.device_mesh != mesh:
        raise ValueError("ring_attn(): q, k and v must be on the same device mesh")
    n, e = q.shape[0], v.shape[1]
    sizes = block_sizes(n, mesh.size())
    o, a = ring_attn_local(q.to_local(), k.to_local(), v.to_local(), mesh.get_group(), sizes)
    wrap = lambda t, cols: DTensor.from_local(t, mesh, [Shard(0)], run_check=False,      # noqa: E731
                                              shape=torch.Size((n, cols)), stride=(cols, 1))
    return AttnOutput(wrap(o, e), wrap(a, n))
