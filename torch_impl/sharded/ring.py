"""Sequence-parallel tanh attention: q, k, v all ``Shard(0)`` over P ranks, k/v blocks passed round a ring.

    >>> o, a = ring_attn(q, k, v)            # DTensors, Shard(0) on a 1-D mesh; o, a: Shard(0) DTensors

``ring_attn`` (DTensors) and ``ring_attn_local`` (local shards and a process group) run ``RingAttnFunction``.
Rank r holds row block I = r; tanh has no softmax, so (32)-(35) of derivation.md (section 15) split exactly, with
no running max and no logsumexp merge.  Forward: at step s rank r computes block (r, r − s mod P) by
``performance.attn_forward_into`` (1)-(3) into its columns of ``a`` while (k_J, v_J) travel on
(``batch_isend_irecv``, waited for after the compute): P − 1 hops.  Backward (``performance.attn_backward``,
(33)-(35)): G_Q,I stays home; the accumulators of (35) follow their k/v block one step behind in the same round
and take a last hop home: P + 1 hops.  Double backward: ``RingAttnBackward`` is itself a Function, whose backward
is a third ring ((23)-(27) per block by autograd of ``formulas.attn_backward``); the third derivative raises.

Every rank knows all block sizes from the global n, so uneven and empty blocks run exactly, with no padding;
complex tensors travel as ``torch.view_as_real``.  Each rank may have its own loss: the (double) backward first
agrees on which gradients arrived and are needed (``_agree``), so every rank must run it.  Memory per rank,
in-place and layout rules, hop counts: docs/distributed.md, "torch: the code" (**The ring**).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard

from .. import formulas, performance
from ..output import AttnOutput
from ..validation import check_inputs

__all__ = ["ring_attn", "ring_attn_local", "block_sizes", "count_hops", "TRIPLE_BACKWARD"]

TRIPLE_BACKWARD = (
    "ring_attn(): the third derivative through the ring is not supported (its double backward was asked to build "
    "a graph: create_graph=True). Use the rows layout of torch_impl.sharded.rules (torch_impl.attn on DTensors: "
    "q Shard(0), k and v Replicate), or its keys (q Replicate, k and v Shard(0)) or replicate layout: they "
    "support every order on torch >= 2.13 (on older torch, the second order).")

# The open count_hops() dicts.  Module-level, not thread-local or a ContextVar: on CUDA the backward's hops are
# sent from autograd's per-device thread, which sees neither (on the CPU backward runs on the caller's
# thread).  So count_hops() blocks open at once in two threads count each other's hops.
_counters: List[Dict[str, int]] = []


@contextlib.contextmanager
def count_hops() -> Iterator[Dict[str, int]]:
    """Count the ring's rounds of P2P messages (hops) and the bytes this rank sends, per pass (forward, backward,
    double_backward), while the block runs (torch's ``CommDebugMode`` counts collectives, not P2P)::

        with count_hops() as hops:
            o, a = ring_attn(q, k, v)
            o.sum().backward()
        hops  # {"forward": P - 1, "forward_bytes": ..., "backward": P + 1, ..., "double_backward": 0, ...}

    The dict is filled in place as hops are sent; nested blocks each count what runs inside them."""
    counts = {f"{direction}{what}": 0 for direction in ("forward", "backward", "double_backward")
              for what in ("", "_bytes")}
    _counters.append(counts)
    try:
        yield counts
    finally:
        _counters.remove(counts)


def block_sizes(n: int, world: int) -> List[int]:
    """Rows of each rank under ``Shard(0)`` of n rows over ``world`` ranks (``torch.chunk``'s split, as DTensor)."""
    chunk = -(-n // world) if world else 0
    return [max(0, min(chunk, n - r * chunk)) for r in range(world)]


# --- P2P --------------------------------------------------------------------------------------------------
def _wire(t: Tensor) -> Tensor:
    """What P2P sends for ``t``: its values in plain memory.  A conjugate view (``view_as_real`` refuses it), a
    negative view (resolved here rather than left to the backend) and a strided one (P2P refuses it) become a
    copy, only then: the user's tensor is never written.  Complex tensors go as their ``view_as_real`` view (real
    dtypes are what every P2P backend takes).  A receive buffer is a fresh contiguous tensor (``_like``), so this
    returns a view of it, which the receive writes."""
    t = t.resolve_conj().resolve_neg().contiguous()
    return torch.view_as_real(t) if t.is_complex() else t


class _Hop:
    """One round of the ring: send ``send`` to the next rank and receive into ``recv`` (fresh buffers shaped as
    what the previous rank sends) from the previous one, in one ``batch_isend_irecv``.  Started at
    construction; ``wait()`` returns ``recv``.  Empty tensors are not sent (both sides know the sizes)."""

    def __init__(self, group, direction: str, send: Sequence[Tensor], recv: Sequence[Tensor]):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        nxt = dist.get_global_rank(group, (rank + 1) % world)
        prv = dist.get_global_rank(group, (rank - 1) % world)
        self.received = list(recv)
        self.sent = [_wire(t) for t in send if t.numel()]          # kept alive until the sends complete
        ops = [dist.P2POp(dist.isend, t, nxt, group) for t in self.sent]
        ops += [dist.P2POp(dist.irecv, _wire(t), prv, group) for t in self.received if t.numel()]
        self.works = dist.batch_isend_irecv(ops) if ops else []
        for counts in _counters:
            counts[direction] += 1
            counts[direction + "_bytes"] += sum(t.numel() * t.element_size() for t in send)

    def wait(self) -> List[Tensor]:
        for w in self.works:
            w.wait()
        return self.received


def _like(tensors: Sequence[Tensor], rows: int) -> List[Tensor]:
    """Receive buffers for a block of ``rows`` rows of each of ``tensors``."""
    return [t.new_empty((rows, *t.shape[1:])) for t in tensors]


# --- the Function -----------------------------------------------------------------------------------------
class RingAttnFunction(torch.autograd.Function):
    """Local shards in, local shards out: ``q (m, d)``, ``k (m_r, d)``, ``v (m_r, e)`` on each rank of ``group``;
    ``sizes`` are all ranks' key rows.  Returns this rank's ``o (m, e)`` and ``a (m, n)``.  With ``mesh`` (1-D),
    q, k, v are ``Shard(0)`` DTensors on it, unwrapped and wrapped here rather than by ``to_local`` /
    ``from_local`` around the Function: their autograd nodes would turn a gradient the ring leaves undefined
    (G_V when o is unused) into zeros (docs/distributed.md, "Versions")."""

    @staticmethod
    def forward(ctx, q, k, v, group, sizes, mesh=None):
        ctx.mesh, ctx.shapes = mesh, [t.shape for t in (q, k, v)]
        inputs = (q, k, v)
        if mesh is not None:
            q, k, v = (t.to_local() for t in (q, k, v))
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        offsets = [sum(sizes[:j]) for j in range(world)]
        a = q.new_empty((q.shape[0], sum(sizes)))
        o = q.new_zeros((q.shape[0], v.shape[1]))
        block = (k, v)
        for step in range(world):
            j = (rank - step) % world
            hop = (_Hop(group, "forward", block, _like(block, sizes[(j - 1) % world]))
                   if step < world - 1 else None)
            performance.attn_forward_into(q, *block, a[:, offsets[j]:offsets[j] + sizes[j]], o)   # (32), (I, J)
            if hop is not None:
                block = tuple(hop.wait())
        if mesh is not None:
            o, a = _rows(o, mesh, (ctx.shapes[0][0], o.shape[1])), _rows(a, mesh, (ctx.shapes[0][0], a.shape[1]))
        # The inputs and the returned ``a`` themselves (the DTensors with a mesh), not their local tensors: an
        # in-place write on any of them then bumps the version autograd checks, and the backward raises.
        ctx.save_for_backward(*inputs, a)
        ctx.group, ctx.sizes = group, list(sizes)
        ctx.set_materialize_grads(False)
        return o, a

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        has_o, has_a, need_q, need_k, need_v = _agree(ctx, (grad_o is not None, grad_a is not None,
                                                            *ctx.needs_input_grad[:3]), q)
        if not (has_o or has_a):
            return None, None, None, None, None, None
        if has_o and grad_o is None:            # another rank's o has a gradient: this rank's terms are zero
            grad_o = q.new_zeros((q.shape[0], v.shape[1]))
        mask = (need_q, need_k, need_v and has_o)                            # (13) needs G_O
        # The output gradients as given are saved too (``guards``): a redistribution, even to the placements they
        # have, is a new DTensor whose version counter an in-place write on the given one does not bump.
        guards = tuple(g for g in (grad_o, grad_a) if isinstance(g, DTensor))
        if ctx.mesh is not None:
            grad_o, grad_a = (None if g is None else g.redistribute(ctx.mesh, [Shard(0)]) for g in (grad_o, grad_a))
        # Through a second Function, so that with create_graph=True the gradients are differentiable.
        grads = RingAttnBackward.apply(grad_o, grad_a, q, k, v, a, ctx.group, ctx.sizes, ctx.mesh, mask, *guards)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None, None, None)


class RingAttnBackward(torch.autograd.Function):
    """The ring's backward (33)-(35) as a Function of ``(grad_o, grad_a, q, k, v, a)``: ``RingAttnFunction``'s
    backward applies it, so with ``create_graph=True`` the gradients it returns are differentiable.  Its own
    backward (the double backward) is a third ring: per block (I, J), the VJP of ``formulas.attn_backward``
    (33)-(35), which is (23)-(27) on the block, by autograd of those formulas; the terms for G_O,I, Q_I and the
    columns J of G_A and A stay on rank I, those for K_J and V_J travel with the block as in (35).  A backward
    of that asked to build a graph (third order) raises."""

    @staticmethod
    def forward(ctx, grad_o, grad_a, q, k, v, a, group, sizes, mesh, mask, *guards):
        saved = (grad_o, grad_a, q, k, v, a)
        ctx.save_for_backward(*saved, *guards)          # guards: only for autograd's version check
        ctx.n_guards = len(guards)
        ctx.group, ctx.sizes, ctx.mesh, ctx.mask = group, list(sizes), mesh, tuple(mask)
        ctx.shapes = [None if t is None else t.shape for t in saved]
        ctx.set_materialize_grads(False)
        grads = _ring_backward(*(_local(t) for t in saved), group, sizes, mask)
        return _wrap(grads, mesh, ctx.shapes[2:5])

    @staticmethod
    def backward(ctx, u_q, u_k, u_v):
        # Grad mode is on in a backward exactly when it was asked to build a graph (create_graph=True): the
        # same on every rank (SPMD), so every rank raises here, before any communication.
        if torch.is_grad_enabled():
            raise RuntimeError(TRIPLE_BACKWARD)
        saved = ctx.saved_tensors[:6]     # unpacking all of them is autograd's version check: before any P2P
        nones = (None,) * (4 + ctx.n_guards)
        needs = _agree(ctx, ctx.needs_input_grad[:6], saved[2])
        if not any(needs):
            return (None,) * 6 + nones
        if ctx.mesh is not None:
            u_q, u_k, u_v = (None if u is None else u.redistribute(ctx.mesh, [Shard(0)]) for u in (u_q, u_k, u_v))
        saved = [_local(t) for t in saved]
        grads = _ring_double_backward(*saved, *(_local(u) for u in (u_q, u_k, u_v)), ctx.group, ctx.sizes,
                                      ctx.mask, needs)
        grads = _wrap(grads, ctx.mesh, ctx.shapes)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), *nones)


def _agree(ctx, flags, like: Tensor):
    """Which gradients arrived and which are needed decide what travels, so every rank must decide alike.  Each
    rank may have its own loss, on local shards and on DTensors alike (``o.to_local()`` read on one rank,
    ``a.to_local()`` on another), so the ranks agree first: each flag is set where it is set on some rank (one
    all-reduce of a few integers), and a rank lacking a gradient another has computes zeros for its terms."""
    like = _local(like)
    t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=like.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return [bool(f) for f in t.tolist()]


def _local(t):
    """This rank's tensor of ``t`` (a DTensor's local shard), ``None`` for ``None``."""
    return t.to_local() if isinstance(t, DTensor) else t


def _wrap(tensors, mesh, shapes):
    """``tensors`` as the ``Shard(0)`` DTensors of global ``shapes`` on ``mesh`` (as they are without a mesh)."""
    if mesh is None:
        return tuple(tensors)
    return tuple(None if t is None else _rows(t, mesh, shape) for t, shape in zip(tensors, shapes))


class KeyBlock(NamedTuple):
    """The tensors of key block J that travel round the ring with it, each ``None`` where a pass does not send it
    (nor reads it): ``k`` (for (34)) and ``v`` (for G_O V_Jᴴ in (33)), and in the double backward ``u_k``, ``u_v``,
    the cotangents of the block's G_K,J and G_V,J."""

    k: Optional[Tensor]
    v: Optional[Tensor]
    u_k: Optional[Tensor] = None
    u_v: Optional[Tensor] = None


class KeySums(NamedTuple):
    """Block J's sums over the query blocks I (35), ``None`` where not needed: for K_J and for V_J.  They follow the
    block round the ring one step behind it, and a last hop takes them home to rank J."""

    k: Optional[Tensor] = None
    v: Optional[Tensor] = None


class _BlockArgs(NamedTuple):
    """The arguments of ``formulas.attn_backward`` (33)-(35) on block (I, J), in its order (the double backward's
    inputs, and its results: their gradients)."""

    grad_o: Optional[Tensor]
    grad_a: Optional[Tensor]
    q: Optional[Tensor]
    k: Optional[Tensor]
    v: Optional[Tensor]
    a: Optional[Tensor]


def _ring_pass(group, sizes, direction: str, block: KeyBlock, wanted: Sequence[bool],
               compute: Callable[[int, KeyBlock], KeySums]) -> KeySums:
    """One pass of the ring over the key blocks.  ``block`` is this rank's; at step s this rank holds block
    J = r − s and calls ``compute(j, block)``, which returns this rank's terms of block J's sums over query blocks I
    (those ``wanted``, as ``KeySums`` (k, v)).  The tensors of the block go on to the next rank (it needs them next
    step), with the sums of the previous block (it is on that block now); from the previous rank come the next
    block and this block's sums: one round per step, started before the compute and waited for after.  After the
    last step the sums of block r + 1 are complete and a last round takes them home.  Returns this rank's
    complete sums."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    travel = [i for i, t in enumerate(block) if t is not None]
    acc: List[Tensor] = []      # sums of the previous step's block J + 1, sent at this step's start
    for step in range(world):
        j = (rank - step) % world
        kv = [block[i] for i in travel] if step < world - 1 else []
        recv = _like(kv, sizes[(j - 1) % world]) + (_like(acc, sizes[j]) if acc else [])
        hop = _Hop(group, direction, kv + acc, recv) if world > 1 and (kv or acc) else None
        terms = [t for t, want in zip(compute(j, block), wanted) if want]
        received = hop.wait() if hop is not None else []
        if kv:
            block = block._replace(**{block._fields[i]: t for i, t in zip(travel, received)})
        arrived = received[len(kv):]
        acc = [s.add_(t) for s, t in zip(arrived, terms)] if arrived else terms                # Σ_I
        del terms
    home = iter(_Hop(group, direction, acc, _like(acc, sizes[rank])).wait() if world > 1 and acc else acc)
    return KeySums(*(next(home) if want else None for want in wanted))


def _ring_backward(grad_o, grad_a, q, k, v, a, group, sizes, mask):
    """(33)-(35) on local shards, ``mask`` = which of G_Q, G_K, G_V (as ``formulas.attn_backward``)."""
    need_q, need_k, need_v = mask
    world = dist.get_world_size(group)
    offsets = [sum(sizes[:j]) for j in range(world)]
    # What travels: k_J for (34), v_J for G_O V_Jᴴ in (33); the sums (G_K,J, G_V,J) of (35) follow.
    block = KeyBlock(k if need_q else None, v if grad_o is not None and (need_q or need_k) else None)
    grad_q = torch.zeros_like(q) if need_q else None

    def compute(j, block):
        cols = slice(offsets[j], offsets[j] + sizes[j])
        g_q, g_k, g_v = performance.attn_backward(                                       # (33)-(35), block (I, J)
            grad_o, None if grad_a is None else grad_a[:, cols], q, block.k, block.v, a[:, cols], mask)
        if g_q is not None:
            grad_q.add_(g_q)                                                             # (34): Σ_J
        return KeySums(g_k, g_v)                                                         # (35): Σ_I

    home = _ring_pass(group, sizes, "backward", block, (need_k, need_v), compute)
    return grad_q, home.k, home.v


def _ring_double_backward(grad_o, grad_a, q, k, v, a, u_q, u_k, u_v, group, sizes, mask, needs):
    """The VJP of ``_ring_backward`` with cotangents ``u_q, u_k, u_v`` of its G_Q, G_K, G_V (``None``: zero), for
    the inputs ``needs`` = (grad_o, grad_a, q, k, v, a) asks: per block (I, J), autograd of
    ``formulas.attn_backward`` (33)-(35), i.e. (23)-(27) on the block.  Every rank sends the same tensors
    whatever cotangents it got (a missing one travels as zeros)."""
    world = dist.get_world_size(group)
    offsets = [sum(sizes[:j]) for j in range(world)]
    wanted = _BlockArgs(*needs)
    # rank I's own terms (for k and v they are the block's sums, below); a and G_A by the columns of block J
    local = _BlockArgs(*(None if t is None or not want else torch.zeros_like(t)
                         for t, want in zip((grad_o, grad_a, q, None, None, a), wanted)))
    u_k = torch.zeros_like(k) if u_k is None and mask[1] else u_k
    u_v = torch.zeros_like(v) if u_v is None and mask[2] else u_v

    def compute(j, block):
        cols = slice(offsets[j], offsets[j] + sizes[j])
        args = _BlockArgs(grad_o, None if grad_a is None else grad_a[:, cols], q, block.k, block.v, a[:, cols])
        with torch.enable_grad():
            leaves = _BlockArgs(*(None if t is None else t.detach().requires_grad_(want)
                                  for t, want in zip(args, wanted)))
            outs = formulas.attn_backward(*leaves, mask)                                 # (33)-(35), block (I, J)
            pairs = [(g, u) for g, u in zip(outs, (u_q, block.u_k, block.u_v))
                     if g is not None and u is not None and g.requires_grad]
            asked = [i for i, (t, want) in enumerate(zip(leaves, wanted)) if t is not None and want]
            grads = (torch.autograd.grad([g for g, _ in pairs], [leaves[i] for i in asked], [u for _, u in pairs],
                                         allow_unused=True) if pairs and asked else [None] * len(asked))
        got = [None] * len(_BlockArgs._fields)
        for i, g in zip(asked, grads):
            got[i] = g
        got = _BlockArgs(*got)
        for total, g, by_cols in zip(local, got, (False, True, False, False, False, True)):   # rank I's own terms
            if total is not None and g is not None:
                (total[:, cols] if by_cols else total).add_(g)
        return KeySums(*(None if not want else torch.zeros_like(t) if g is None else g
                         for t, g, want in ((args.k, got.k, wanted.k), (args.v, got.v, wanted.v))))

    home = _ring_pass(group, sizes, "double_backward", KeyBlock(k, v, u_k, u_v), (wanted.k, wanted.v), compute)
    return local.grad_o, local.grad_a, local.q, home.k, home.v, local.a


def _rows(local: Tensor, mesh, shape) -> DTensor:
    """This rank's rows of a ``Shard(0)`` DTensor of global ``shape`` (contiguous)."""
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                              stride=(shape[1], 1))


# --- entries ----------------------------------------------------------------------------------------------
def ring_attn_local(q: Tensor, k: Tensor, v: Tensor, group=None, sizes: Optional[Sequence[int]] = None):
    """The ring on local shards: this rank's rows of q, k, v; ``group`` the ring's process group (default:
    the world); ``sizes`` every rank's rows (default: what the ranks hold, any n).
    Returns ``(o, a)`` local: o (m, e), a (m, n).  Each rank may have its own loss, but every rank must
    backpropagate through the ring (its backward communicates); a rank's gradients are its rows of the gradients
    of the sum of all ranks' losses.  Local tensors of any layout (strided, conjugate or negative views).

    Before any P2P the ranks exchange what they hold (one small ``all_gather_object``: shapes, dtype, ``sizes``),
    so a bad call raises the same ``ValueError`` on every rank, and ``sizes`` left out is every rank's real rows
    (a rank assuming its own row count for the others reads blocks of the wrong size)."""
    group = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    mine = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype), str(k.dtype), str(v.dtype),
            None if sizes is None else [int(s) for s in sizes])
    every = [None] * world
    dist.all_gather_object(every, mine, group=group)
    problem = _shard_problem(every)
    if problem:
        raise ValueError(f"ring_attn(): {problem}")
    return RingAttnFunction.apply(q, k, v, group, [shapes[1][0] for shapes in every])


def _shard_problem(every: Sequence[tuple]) -> str:
    """What is wrong with the ranks' shards (``ring_attn_local``'s gathered metadata, the same on every rank), or
    ``""``: each rank's q, k, v share its rows; d, e and the dtype agree across ranks; a ``sizes`` given is every
    rank's rows."""
    rows = [k_shape[0] for _, k_shape, _, _, _, _, _ in every]
    first = every[0]
    for r, (q_shape, k_shape, v_shape, qd, kd, vd, sizes) in enumerate(every):
        if len(q_shape) != 2 or len(k_shape) != 2 or len(v_shape) != 2:
            return (f"every rank must hold 2-D rows of q, k and v, got q {q_shape}, k {k_shape}, v {v_shape} on "
                    f"rank {r}")
        if not q_shape[0] == k_shape[0] == v_shape[0] or q_shape[1] != k_shape[1]:
            return (f"every rank must hold its own rows of q, k and v, q and k of one width d, got q {q_shape}, "
                    f"k {k_shape}, v {v_shape} on rank {r}")
        if (q_shape[1], k_shape[1], v_shape[1], qd, kd, vd) != (first[0][1], first[1][1], first[2][1], *first[3:6]):
            return (f"d, e and the dtype must agree across ranks: rank 0 holds q {first[0]} {first[3]}, k "
                    f"{first[1]}, v {first[2]}; rank {r} holds q {q_shape} {qd}, k {k_shape}, v {v_shape}")
        if sizes is not None and sizes != rows:
            return f"sizes {sizes} given on rank {r}, but the ranks hold {rows} rows"
    return ""


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
    return AttnOutput(*RingAttnFunction.apply(q, k, v, mesh.get_group(), block_sizes(q.shape[0], mesh.size()), mesh))
