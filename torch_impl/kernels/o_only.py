"""``attn_o(q, k, v, *, causal=False) -> o``: tanh attention's output alone, never an n×n tensor.

    >>> o = torch_impl.attn_o(q, k, v)                  # q, k (..., n, d), v (..., n, e): o (..., n, e)
    >>> o = torch_impl.attn_o(q, k, v, causal=True)     # key j > query i masked out (derivation.md (37))

o = tanh(q kᵀ [masked]) v by tiles (32); the backward recomputes each tile of A from q and k (flash style) and
forms G_X = (G_O Vᴴ) ⊙ conj(1 − A²) per tile, (33)-(35) with G_A = 0, masked by (38); the JVP is (36) per block
with (39).  Two back ends, the same math: Triton (``triton_attn``) where ``kernels.triton_applies``, and
everywhere else ATen by blocks (``o_only_forward_blocks``, ``o_only_backward_blocks``, ``o_only_jvp_blocks``):
tiles of A with ``R·C·batch ≤ TILE_ELEMENTS`` and C ≤ ``KEY_BLOCK``, so the scratch is bounded whatever n; a
first-order step runs them in place, and with grad mode on (``create_graph=True``, also on CUDA) or under
torch.func they run as differentiable ops, so double backward is exact.

``AttnOFunction`` has ``setup_context``, ``backward`` (only the gradients ``ctx.needs_input_grad`` asks for),
``jvp`` and ``vmap``.  ``attn_o`` checks its arguments first (``check_o_inputs``: ``attn_contract``'s messages
where they apply, with fn ``attn_o``; a nested tensor is refused), casts them under autocast (as matmul's), and
under ``torch.compile`` calls operators instead of the Function, which Dynamo cannot trace:
``attn_lab::attn_o_triton`` where the kernels apply, else ``attn_lab::attn_o`` (``attn_o_op``), each with its
backward operator.  Routes and memory: docs/kernels.md.
"""

from __future__ import annotations

import inspect
import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

import attn_contract

from .. import formulas, internals
from ..internals import Answer
from ..support import autocast_like, autocast_state, batch_first, refuse_nested_forward_levels
from ..validation import FRAMEWORK, refuse_nested
from . import compiled_applies, differentiated, dot_precision, triton_applies, triton_module

__all__ = ["attn_o", "attn_o_reference", "AttnOFunction", "check_o_inputs", "o_only_forward", "o_only_backward",
           "o_only_forward_blocks", "o_only_backward_blocks", "o_only_jvp_blocks", "attn_o_op", "attn_o_backward_op",
           "attn_o_triton_op", "attn_o_triton_backward_op",
           "KEY_BLOCK", "TILE_ELEMENTS"]

KEY_BLOCK = 1024              # key rows per ATen tile
TILE_ELEMENTS = 1 << 22       # elements of one ATen tile of A, batch included (16 MiB in float32)

# The stacked contract's messages, shared with jax_impl.kernels (attn_contract.STACK_MESSAGES, {fn} = attn_o).
MESSAGES = {key: text.replace("{fn}", "attn_o") for key, text in attn_contract.STACK_MESSAGES.items()}
_DIMS = attn_contract.STACK_DIMS


def check_o_inputs(q, k, v, causal=False) -> None:
    """The contract of ``attn_o``: ``q (..., n, d)``, ``k (..., n, d)``, ``v (..., n, e)`` with the same leading
    dimensions, one dtype of ``attn_contract.DTYPES``, one device; ``causal`` a bool.  Raises ``TypeError`` /
    ``ValueError`` naming the argument; any size may be 0."""
    fw, args = FRAMEWORK, (q, k, v)
    refuse_nested("attn_o", q, k, v)
    for name, t in zip(attn_contract.NAMES, args):
        if not isinstance(t, fw.array_types):
            raise TypeError(attn_contract.message("type", "attn_o", name=name, accepted=fw.accepted,
                                                  type=attn_contract.type_name(t)))
        if t.ndim < 2:
            raise ValueError(MESSAGES["ndim"].format(name=name, dims=_DIMS[name], ndim=t.ndim, shape=tuple(t.shape)))
        if not fw.dtype_ok(t.dtype):
            raise TypeError(attn_contract.message("dtype", "attn_o", name=name, dtype=fw.dtype_name(t.dtype)))
    if not isinstance(causal, bool):
        raise TypeError(MESSAGES["causal"].format(type=attn_contract.type_name(causal)))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(MESSAGES["d"].format(q=tuple(q.shape), k=tuple(k.shape)))
    if not (q.shape[:-1] == k.shape[:-1] == v.shape[:-1]):
        raise ValueError(MESSAGES["n"].format(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape)))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(attn_contract.message("same_dtype", "attn_o",
                                              **{n: fw.dtype_name(t.dtype) for n, t in zip("qkv", args)}))
    if not (q.device == k.device == v.device):
        raise ValueError(attn_contract.message("same_device", "attn_o",
                                               **{n: str(t.device) for n, t in zip("qkv", args)}))


# --- ATen by blocks -------------------------------------------------------------------------------------------
def _blocks(q: Tensor):
    """``(rows, keys)`` slices: the row blocks R, and for each the key blocks C of one ATen tile."""
    n = q.shape[-2]
    batch = max(1, math.prod(q.shape[:-2]))
    cols = max(1, min(n, KEY_BLOCK))
    rows = max(1, min(n, TILE_ELEMENTS // (batch * cols)))
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)], [slice(j, min(j + cols, n))
                                                                     for j in range(0, n, cols)]


def _keep(r: slice, c: slice, causal: bool, device) -> Optional[Tensor]:
    """(37): the (R, C) mask of entries with key index ≤ query index; ``None`` when the tile is entirely kept."""
    if not causal or c.stop - 1 <= r.start:
        return None
    rows = torch.arange(r.start, r.stop, device=device)
    cols = torch.arange(c.start, c.stop, device=device)
    return rows[:, None] >= cols[None, :]


def _visible(r: slice, c: slice, causal: bool) -> bool:
    """Whether tile (R, C) has any unmasked entry: under (37) tiles entirely after the diagonal are skipped."""
    return not causal or c.start <= r.stop - 1


def _a_tile(q_r: Tensor, k_c: Tensor, keep: Optional[Tensor]) -> Tensor:
    a = torch.tanh(q_r @ k_c.mT)                                            # (32): X_RC, A_RC
    return a if keep is None else a.masked_fill(~keep, 0)                   # (37)


def _add(acc: Optional[Tensor], term: Optional[Tensor]) -> Optional[Tensor]:
    return term if acc is None else acc if term is None else acc + term


def o_only_forward_blocks(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """(32) with (37): O_R = Σ_C A_RC V_C, one (..., R, C) tile of A at a time.  In place into o (one tile
    buffer reused) where nothing can observe the writes (``internals.may_write_in_place``), else by
    differentiable ops (for torch.func and a backward of a backward)."""
    if internals.may_write_in_place(q, k, v):
        return _forward_in_place(q, k, v, causal)
    return _forward_differentiable(q, k, v, causal)


def o_only_backward_blocks(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool = False,
                           output_mask: Sequence[bool] = (True, True, True)):
    """(33)-(35) with G_A = 0 and (38), tile by tile, A recomputed: G_Q,R = Σ_C G_X,RC K̄_C,
    G_K,C = Σ_R G_X,RCᵀ Q̄_R, G_V,C = Σ_R A_RCᴴ G_O,R.  In place (gradients allocated once, accumulated into
    their rows; two tile buffers reused) where unobservable: a plain first-order backward; else by
    differentiable ops, so that ``create_graph=True`` records them and double backward is exact."""
    if internals.may_write_in_place(grad_o, q, k, v):
        return _backward_in_place(grad_o, q, k, v, causal, output_mask)
    return _backward_differentiable(grad_o, q, k, v, causal, output_mask)


def _rows(t: Tensor, s: slice) -> Tensor:
    """Rows ``s`` of ``t`` (..., n, ·) by ``narrow``; ``t`` itself when they are all of them (a full slice is an
    ``alias``, which the legacy vmap of gradcheck's batched-gradient check has no rule for)."""
    n = t.shape[-2]
    return t if s.start == 0 and s.stop == n else t.narrow(-2, s.start, s.stop - s.start)


def _forward_differentiable(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """(32) with (37) by differentiable ops: each tile's term a new tensor, the row blocks concatenated."""
    rows, cols = _blocks(q)
    out = []
    for r in rows:
        acc = None
        for c in cols:
            if _visible(r, c, causal):
                a = _a_tile(_rows(q, r), _rows(k, c), _keep(r, c, causal, q.device))
                acc = _add(acc, a @ _rows(v, c))                          # (32)
        out.append(acc)
    return torch.cat(out, -2) if out else q.new_zeros((*q.shape[:-1], v.shape[-1]))


def _backward_differentiable(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool = False,
                             output_mask: Sequence[bool] = (True, True, True)):
    """(33)-(35), (38) by differentiable ops only (double backward)."""
    want_q, want_k, want_v = output_mask
    rows, cols = _blocks(q)
    g_q = []
    g_k, g_v = [None] * len(cols), [None] * len(cols)
    for r in rows:
        g_q_r = None
        for j, c in enumerate(cols):
            if not _visible(r, c, causal):
                continue
            keep = _keep(r, c, causal, q.device)
            a = _a_tile(_rows(q, r), _rows(k, c), keep)
            if want_v:
                g_v[j] = _add(g_v[j], formulas.mix_vjp(_rows(grad_o, r), a, None, (False, True))[1])     # (35)
            if want_q or want_k:
                g_a = formulas.total_grad_a(_rows(grad_o, r), None, _rows(v, c))                       # (33)
                g_x = formulas.tanh_vjp(g_a, a)                                                           # (33)
                if keep is not None:
                    g_x = g_x.masked_fill(~keep, 0)                                                       # (38)
                gq, gk = formulas.scores_vjp(g_x, _rows(q, r), _rows(k, c), (want_q, want_k))
                g_q_r = _add(g_q_r, gq)                                                                   # (34)
                g_k[j] = _add(g_k[j], gk)                                                                 # (35)
        g_q.append(g_q_r)

    def whole(parts, like):
        return torch.cat(parts, -2) if parts else torch.zeros_like(like)
    return (whole(g_q, q) if want_q else None, whole(g_k, k) if want_k else None,
            whole(g_v, grad_o) if want_v else None)


# --- ATen by blocks, in place ---------------------------------------------------------------------------------
# A first-order step allocates its outputs once and accumulates each tile's term into their rows (BLAS writes
# strided rows with its leading dimension: no temporary); the tiles of A and G_X live in scratch buffers of one
# fixed size, allocated once per call and viewed at each tile's shape.  Measured (docs/kernels.md): the
# differentiable schedule's tensors of varied sizes per tile and torch.cat of the parts fragment glibc's heap,
# and the process's peak RSS grew 18× the tensors' size at n = 32768; this schedule's stays O(n·(d + e)) plus
# the tile budget.  The math is the same equations, term for term; only where results are written differs.
def _stacks(t: Optional[Tensor]) -> Optional[Tensor]:
    """``(B, n, ·)`` with rows BLAS can read (a stride-0 expanded gradient, from ``.sum()``, made dense once)."""
    if t is None:
        return None
    t = t.reshape(math.prod(t.shape[:-2]), *t.shape[-2:])
    return t if t.stride(-1) == 1 and t.stride(-2) >= max(1, t.shape[-1]) else t.contiguous()


def _plan(batch: int, n: int):
    """``(batches, rows, cols, tile)``: slices of the stacks, the row blocks R, the key blocks C, and the
    elements of the largest (B', R, C) tile, at most ``TILE_ELEMENTS`` (a stack too large for one tile at
    one row is split: the budget holds whatever the batch)."""
    cols = max(1, min(n, KEY_BLOCK))
    per = max(1, min(batch, TILE_ELEMENTS // cols))
    rows = max(1, min(n, TILE_ELEMENTS // (per * cols)))
    return ([slice(b, min(b + per, batch)) for b in range(0, batch, per)],
            [slice(i, min(i + rows, n)) for i in range(0, n, rows)],
            [slice(j, min(j + cols, n)) for j in range(0, n, cols)], per * rows * cols)


def _tile_into(buf: Tensor, shape) -> Tensor:
    """A contiguous view of the first elements of ``buf`` at ``shape`` (no allocation)."""
    return buf[:math.prod(shape)].view(shape)


class _Causal:
    """(37)/(38) for the in-place tiles: the (R, C) mask of entries after the diagonal (key j > query i), written
    into one reused bool buffer from one ``arange``.  (Not ``tril_``: its kernel opens a parallel region per
    call, milliseconds on a loaded machine for a tile of a few elements.)"""

    def __init__(self, like: Tensor, rows: int, cols: int):
        self.index = torch.arange(max(rows, cols), device=like.device)
        self.buf = torch.empty(rows * cols, dtype=torch.bool, device=like.device)

    def after_diagonal(self, r: slice, c: slice) -> Optional[Tensor]:
        if c.stop - 1 <= r.start:
            return None                                                     # the tile is entirely kept
        rows, cols = self.index[:r.stop - r.start], self.index[:c.stop - c.start]
        mask = _tile_into(self.buf, (rows.numel(), cols.numel()))
        torch.lt(rows[:, None] + (r.start - c.start), cols[None, :], out=mask)    # c0 + j > r0 + i
        return mask


def _a_tile_into(buf: Tensor, q_r: Tensor, k_c: Tensor, after: Optional[Tensor]) -> Tensor:
    a = _tile_into(buf, (q_r.shape[0], q_r.shape[1], k_c.shape[1]))
    torch.bmm(q_r, k_c.mT, out=a)                                           # (32): X_RC
    a.tanh_()                                                               # (32): A_RC
    if after is not None:
        a.masked_fill_(after, 0)                                            # (37): keep key j ≤ query i
    return a


def _forward_in_place(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    shape = (*q.shape[:-1], v.shape[-1])
    q, k, v = _stacks(q), _stacks(k), _stacks(v)
    o = q.new_zeros((*q.shape[:-1], v.shape[-1]))
    if o.numel():
        batches, rows, cols, tile = _plan(q.shape[0], q.shape[1])
        buf = q.new_empty(tile)
        mask = _Causal(q, rows[0].stop, cols[0].stop) if causal else None
        for b in batches:
            for r in rows:
                for c in cols:
                    if _visible(r, c, causal):
                        after = mask.after_diagonal(r, c) if causal else None
                        a = _a_tile_into(buf, q[b, r], k[b, c], after)
                        o[b, r].baddbmm_(a, v[b, c])                        # (32): O_R += A_RC V_C
    return o.reshape(shape)


def _backward_in_place(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool,
                       output_mask: Sequence[bool]):
    want_q, want_k, want_v = output_mask
    shapes = (q.shape, k.shape, grad_o.shape)
    grad_o, q, k, v = _stacks(grad_o), _stacks(q), _stacks(k), _stacks(v)
    g_q = q.new_zeros(q.shape) if want_q else None
    g_k = k.new_zeros(k.shape) if want_k else None
    g_v = grad_o.new_zeros(grad_o.shape) if want_v else None
    if q.shape[0] and q.shape[1] and (want_q or want_k or want_v):
        batches, rows, cols, tile = _plan(q.shape[0], q.shape[1])
        a_buf = q.new_empty(tile)
        g_buf = q.new_empty(tile) if want_q or want_k else None
        mask = _Causal(q, rows[0].stop, cols[0].stop) if causal else None
        for b in batches:
            for r in rows:
                for c in cols:
                    if not _visible(r, c, causal):
                        continue
                    after = mask.after_diagonal(r, c) if causal else None
                    a = _a_tile_into(a_buf, q[b, r], k[b, c], after)
                    if want_v:
                        g_v[b, c].baddbmm_(a.mH, grad_o[b, r])              # (35): G_V,C += A_RCᴴ G_O,R
                    if want_q or want_k:
                        g_x = _tile_into(g_buf, a.shape)
                        torch.bmm(grad_o[b, r], v[b, c].mH, out=g_x)        # (33): G_O,R V_Cᴴ
                        formulas.tanh_vjp(g_x, a, out=g_x)                  # (33): ⊙ conj(1 − A_RC²)
                        if after is not None:
                            g_x.masked_fill_(after, 0)                      # (38)
                        if want_q:
                            g_q[b, r].baddbmm_(g_x, k[b, c].conj())         # (34): G_Q,R += G_X,RC K̄_C
                        if want_k:
                            g_k[b, c].baddbmm_(g_x.mT, q[b, r].conj())      # (35): G_K,C += G_X,RCᵀ Q̄_R
    return tuple(None if g is None else g.reshape(like) for g, like in zip((g_q, g_k, g_v), shapes))


def o_only_jvp_blocks(q: Tensor, k: Tensor, v: Tensor, q_dot: Optional[Tensor], k_dot: Optional[Tensor],
                      v_dot: Optional[Tensor], causal: bool = False) -> Tensor:
    """(36) with (39): Ȯ_R = Σ_C (Ȧ_RC V_C + A_RC V̇_C), Ȧ_RC = (1 − A_RC²) ⊙ (Q̇_R K_Cᵀ + Q_R K̇_Cᵀ), masked."""
    rows, cols = _blocks(q)
    sl = lambda t, s: None if t is None else _rows(t, s)                    # noqa: E731
    out = []
    for r in rows:
        acc = None
        for c in cols:
            if not _visible(r, c, causal):
                continue
            keep = _keep(r, c, causal, q.device)
            a = _a_tile(_rows(q, r), _rows(k, c), keep)
            x_dot = formulas.scores_jvp(_rows(q, r), _rows(k, c), sl(q_dot, r), sl(k_dot, c))          # (36)
            a_dot = None if x_dot is None else formulas.tanh_jvp(x_dot, a)                              # (36)
            if a_dot is not None and keep is not None:
                a_dot = a_dot.masked_fill(~keep, 0)                                                       # (39)
            acc = _add(acc, formulas.mix_jvp(a, _rows(v, c), a_dot, sl(v_dot, c)))                      # (36)
        out.append(acc)
    return torch.cat(out, -2) if out else q.new_zeros((*q.shape[:-1], v.shape[-1]))


# --- dispatch: Triton or ATen ---------------------------------------------------------------------------------
def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, *t.shape[-2:])


def o_only_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """o of ``attn_o``: the Triton forward kernel where ``triton_applies``, else ``o_only_forward_blocks``."""
    if triton_applies(q, k, v):
        return _triton_forward(q, k, v, causal, dot_precision(q.dtype))
    return o_only_forward_blocks(q, k, v, causal)


def o_only_backward(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool = False,
                    output_mask: Sequence[bool] = (True, True, True)):
    """``(G_Q, G_K, G_V)`` of ``attn_o`` (``None`` where ``output_mask`` is False): the Triton backward kernels
    where ``triton_applies`` and autograd need not see through it (``kernels.differentiated``: grad mode off,
    no forward-mode tangent), else ``o_only_backward_blocks`` (with grad mode on, i.e.
    ``create_graph=True``, autograd records it: the kernels are not differentiable, the blocks are)."""
    if not differentiated(grad_o, q, k, v) and triton_applies(q, k, v, grad_o):
        return _triton_backward(grad_o, q, k, v, causal, output_mask, dot_precision(q.dtype))
    return o_only_backward_blocks(grad_o, q, k, v, causal, output_mask)


def _triton_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, precision: str) -> Tensor:
    """(32) with (37) by the Triton forward kernel on stacks of any rank (``precision``: ``dot_precision``)."""
    o = triton_module().o_only_forward(_flat(q), _flat(k), _flat(v), causal, precision=precision)
    return o.reshape(*q.shape[:-1], v.shape[-1])


def _triton_backward(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool,
                     output_mask: Sequence[bool], precision: str):
    """(33)-(35), (38) by the Triton backward kernels on stacks of any rank; ``None`` where not asked for."""
    grads = triton_module().o_only_backward(_flat(grad_o), _flat(q), _flat(k), None if v is None else _flat(v),
                                            causal, output_mask, precision=precision)
    return tuple(None if g is None else g.reshape(like.shape) for g, like in zip(grads, (q, k, grad_o)))


class AttnOFunction(torch.autograd.Function):
    """``o = tanh(q kᵀ [masked]) v`` with the tiled backward (33)-(35), (38) and JVP (36), (39).

    Takes validated inputs (``attn_o`` checks them).  Saved: q and k whenever a gradient is needed (tiles of A
    are recomputed from them), v only for G_Q or G_K; never A or X."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool):
        # In the inputs' dtype whatever autocast is in effect, forward and backward (``attn_o`` casts the
        # inputs for autocast before applying the Function): the in-place tiles (out= and in-place ops) and
        # the Triton kernels are not autocast's anyway, so neither may be any other path.
        with autocast_like(None, q):
            return o_only_forward(q, k, v, causal)                                    # (32), (37)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, causal = inputs
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        wanted = need_q or need_k or need_v
        ctx.save_for_backward(q if wanted else None, k if wanted else None, v if need_q or need_k else None)
        ctx.save_for_forward(q, k, v)
        ctx.causal = causal
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_o):
        if grad_o is None:
            return None, None, None, None
        q, k, v = ctx.saved_tensors
        # Tiles of A recomputed as the forward computed them (in the inputs' dtype), not in the dtype of an
        # autocast the caller opened around backward() (torch.amp's custom_bwd contract; support.autocast_like).
        with autocast_like(None, grad_o):
            return (*o_only_backward(grad_o, q, k, v, ctx.causal, ctx.needs_input_grad[:3]), None)   # (33)-(35)

    @staticmethod
    def jvp(ctx, q_dot, k_dot, v_dot, _causal_dot):
        refuse_nested_forward_levels()          # where PyTorch would get the second order wrong
        q, k, v = ctx.saved_tensors
        return o_only_jvp_blocks(q, k, v, q_dot, k_dot, v_dot, ctx.causal)           # (36), (39)

    @staticmethod
    def vmap(info, in_dims, q, k, v, causal):
        # One call on the stacks, the vmapped dimension first (an unbatched input expanded: a view).
        return AttnOFunction.apply(*batch_first(info.batch_size, in_dims[:3], (q, k, v)), causal), 0


# --- torch.compile: the same forward and backward as dispatcher operators -----------------------------------
# Dynamo cannot trace AttnOFunction (a Function with jvp and vmap, internals' queries of functorch's levels), so
# under torch.compile ``attn_o`` calls an operator instead, with a fake kernel for tracing and its backward an
# operator too.  Two pairs, the same math:
# * where the kernels take the inputs (``kernels.compiled_applies``), ``attn_lab::attn_o_triton`` /
#   ``attn_lab::attn_o_triton_backward``: ``torch.library.triton_op``s whose bodies launch the Triton kernels
#   through ``wrap_triton``; AOTAutograd decomposes them, so the compiled graph holds the kernels themselves;
# * elsewhere ``attn_lab::attn_o`` / ``attn_lab::attn_o_backward`` (``custom_op``, opaque to the compiler), their
#   bodies ``o_only_forward`` / ``o_only_backward``: the in-place ATen tiles (a traced tile loop would be a graph
#   of n²/tile nodes).
# Reverse mode (torch.compile has no forward mode through a custom Function either); a ``create_graph=True``
# backward through either forward operator records the differentiable blocks (double backward exact).
@torch.library.custom_op("attn_lab::attn_o", mutates_args=())
def attn_o_op(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """``attn_o`` as an operator, on validated inputs: (32) with (37)."""
    with torch.no_grad():                         # nothing below an operator records a graph: the tiles in place
        return o_only_forward(q, k, v, causal)


@torch.library.custom_op("attn_lab::attn_o_backward", mutates_args=())
def attn_o_backward_op(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool, need_q: bool,
                       need_k: bool, need_v: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(33)-(35), (38) as an operator: ``(G_Q, G_K, G_V)``, an empty tensor for each gradient not asked for."""
    with torch.no_grad():
        grads = o_only_backward(grad_o, q, k, v, causal, (need_q, need_k, need_v))
    return _as_tensors(grads, grad_o)


def _as_tensors(grads, like: Tensor):
    """An operator returns tensors: a gradient not asked for is an empty one."""
    return tuple(like.new_empty(0) if g is None else g for g in grads)


@attn_o_op.register_fake
def _attn_o_fake(q, k, v, causal):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@attn_o_backward_op.register_fake
def _attn_o_backward_fake(grad_o, q, k, v, causal, need_q, need_k, need_v):
    return tuple(like.new_empty(like.shape) if need else grad_o.new_empty(0)
                 for like, need in ((q, need_q), (k, need_k), (grad_o, need_v)))


def _attn_o_triton(q: Tensor, k: Tensor, v: Tensor, causal: bool, precision: str) -> Tensor:
    """(32) with (37) by the Triton forward kernel (``precision``: ``kernels.dot_precision``)."""
    return _triton_forward(q, k, v, causal, precision)


def _attn_o_triton_backward(grad_o: Tensor, q: Tensor, k: Tensor, v: Optional[Tensor], causal: bool, need_q: bool,
                            need_k: bool, need_v: bool, precision: str) -> Tuple[Tensor, Tensor, Tensor]:
    """(33)-(35), (38) by the Triton backward kernels; an empty tensor for each gradient not asked for."""
    return _as_tensors(_triton_backward(grad_o, q, k, v, causal, (need_q, need_k, need_v), precision), grad_o)


def _op_setup_context(ctx, inputs, output):
    q, k, v, causal, *rest = inputs              # rest: the Triton pair's precision
    ctx.save_for_backward(q, k, v)
    ctx.causal, ctx.rest = causal, tuple(rest)


def _op_backward_rule(backward_op):
    def backward(ctx, grad_o):
        q, k, v = ctx.saved_tensors
        mask = tuple(bool(m) for m in ctx.needs_input_grad[:3])
        unused = (None,) * (1 + len(ctx.rest))
        if torch.is_grad_enabled():   # create_graph=True: the differentiable blocks, recorded (double backward)
            return (*o_only_backward_blocks(grad_o, q, k, v, ctx.causal, mask), *unused)
        grads = backward_op(grad_o, q, k, v, ctx.causal, *mask, *ctx.rest)
        return (*(g if want else None for g, want in zip(grads, mask)), *unused)
    return backward


attn_o_op.register_autograd(_op_backward_rule(attn_o_backward_op), setup_context=_op_setup_context)
if hasattr(torch.library, "triton_op"):          # torch >= 2.6
    attn_o_triton_op = torch.library.triton_op("attn_lab::attn_o_triton", _attn_o_triton, mutates_args=())
    attn_o_triton_backward_op = torch.library.triton_op("attn_lab::attn_o_triton_backward", _attn_o_triton_backward,
                                                        mutates_args=())
    attn_o_triton_op.register_autograd(_op_backward_rule(attn_o_triton_backward_op), setup_context=_op_setup_context)
else:                                            # never called: kernels.compiled_applies is False there
    attn_o_triton_op = attn_o_triton_backward_op = None


def attn_o(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False) -> Tensor:
    """Tanh attention's output ``o = tanh(q kᵀ) v`` without ever forming the n×n matrix A.

    Args: ``q: (..., n, d)``, ``k: (..., n, d)``, ``v: (..., n, e)`` (leading dimensions, e.g. batch × heads,
    the same for all three); one floating-point or complex dtype, one device; any size may be 0.  ``causal``:
    mask out the entries whose key index is after the query index (derivation.md (37)).  Returns o
    ``(..., n, e)``, differentiable in reverse mode (to any order) and forward mode, under ``torch.func``.
    Raises TypeError / ValueError naming the argument."""
    check_o_inputs(q, k, v, causal)
    dtype = autocast_state(q)
    if dtype is not None and q.is_floating_point() and q.dtype != torch.float64:
        # Under autocast: what autocast does for matmul, the op's first and last step (as the lab's operator's
        # Autocast kernel, torch_impl/ops.py): inputs cast to the autocast dtype, the op run with autocast off
        # (the Triton kernels then run in that dtype too); the casts carry the gradients back to q's dtype.
        with torch.autocast(q.device.type, enabled=False):
            return attn_o(q.to(dtype), k.to(dtype), v.to(dtype), causal=causal)
    if torch.compiler.is_compiling():                          # the operators: see "torch.compile" above
        if compiled_applies(q, k, v):
            return attn_o_triton_op(q, k, v, causal, dot_precision(q.dtype))
        return attn_o_op(q, k, v, causal)
    if internals.nested_forward_levels() is Answer.YES:
        return o_only_forward_blocks(q, k, v, causal)          # (32), differentiated by torch.func
    return AttnOFunction.apply(q, k, v, causal)


def attn_o_reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False) -> Tensor:
    """The composite ``tanh(q kᵀ [masked]) v`` of torch ops (n×n), differentiated by autograd: the oracle."""
    check_o_inputs(q, k, v, causal)
    a = torch.tanh(q @ k.mT)
    if causal:
        n = q.shape[-2]
        a = a.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), 0)
    return a @ v


AttnOFunction.forward.__signature__ = inspect.signature(AttnOFunction.forward)
