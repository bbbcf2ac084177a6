"""Triton kernels of tanh attention, and their launchers (imported only when triton is; see ``kernels/__init__``).

Every launcher takes stacks ``(B, n, ·)`` (batch × heads flattened into B) of one dtype (float16, bfloat16 or
float32) on one device, and tiles the math of derivation.md section 15 exactly as written there:

* ``o_only_forward``: one program per (query tile I, batch); loops over key tiles J, (32)
  ``O_I = Σ_J tanh(Q_I K_Jᵀ) V_J``, with the causal mask (37) when asked.  No n×n tensor.
* ``o_only_backward``: a dK/dV kernel, one program per (key tile J, batch) looping over query tiles I ((35),
  tiles of A recomputed from Q, K), and a dQ kernel, one program per (query tile I, batch) looping over key
  tiles J ((34)); per tile (33) with G_A = 0: ``G_X,IJ = (G_O,I V_Jᵀ) ⊙ (1 − A_IJ²)``, masked by (38).  Each
  program owns the rows it writes: no atomics.  Unlike softmax flash attention there is no running maximum, no
  log-sum-exp and no Delta preprocess: tanh needs no normalisation.
* ``fused_forward``: the lab's op ``(o, a)``: the same loop as ``o_only_forward``, writing each tile of A once
  ((1), (2)) and accumulating (3) from it; X is never stored.
* ``fused_backward``: the same two kernels, reading tiles of the saved A (and of G_A when given) instead of
  recomputing them ((33)-(35)); Ĝ_A and G_X live in registers only.

Constexpr flags leave out what is not needed: a gradient not asked for (``NEED_*``), an absent G_O or G_A
(``HAS_GO`` / ``HAS_GA``: no load of an n×n zero).  ``PRECISION`` is ``"ieee"`` for float32 unless the user
enabled TF32 (``kernels.dot_precision``).  tanh is computed as ``2σ(2x) − 1`` (the interpreter has neither
libdevice nor inline asm); where the backward recomputes a tile, 1 − A² comes from the same exponential
(``_tanh_and_slope``), not from A, so it keeps its precision where tanh saturates.  Under
``TRITON_INTERPRET=1`` bfloat16 operands are raised to float32 before each ``tl.dot`` (``UPCAST``), because the
interpreter's bfloat16 dot is wrong.  Accumulation is in float32; outputs are written in the inputs' dtype.
Offsets into A and G_A are int64 (from n = 46341 on, n² exceeds int32), the batch offset too.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["o_only_forward", "o_only_backward", "fused_forward", "fused_backward", "effective_mask",
           "fused_forward_op", "fused_backward_op", "INTERPRET",
           "BLOCK_M", "BLOCK_N", "MAX_HEAD_DIM"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"     # triton reads it at import too
BLOCK_M = 64            # query rows per tile (GPU default; tests pass 16 / 32)
BLOCK_N = 64            # key rows per tile
MAX_HEAD_DIM = 256      # d and e are held whole in one tile: larger ones stay on ATen (kernels.triton_applies)


# ------------------------------------------------------------------------------------------------ helpers
@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0                                       # (2)


@triton.jit
def _tanh_and_slope(x):
    """``(tanh x, 1 − tanh² x)`` from one exp: with t = e^(−2|x|), tanh|x| = (1 − t)/(1 + t) and
    1 − tanh² x = 4t/(1 + t)² (41), which keeps its relative precision where tanh saturates (1 − a² from a
    rounded a does not: in float32 it is 6 % off at |x| = 8 and 0 from |x| ≈ 9 on)."""
    t = tl.exp(-2.0 * tl.abs(x))
    r = 1.0 / (1.0 + t)
    a = (1.0 - t) * r
    return tl.where(x < 0, -a, a), 4.0 * t * r * r


@triton.jit
def _load(ptr, mask, UPCAST: tl.constexpr):
    t = tl.load(ptr, mask=mask, other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _causal(t, offs_m, offs_n, CAUSAL: tl.constexpr):
    """(37)/(38): zero the entries whose key index is after the query index (t is (M, N))."""
    if CAUSAL:
        t = tl.where(offs_m[:, None] >= offs_n[None, :], t, 0.0)
    return t


@triton.jit
def _causal_t(t, offs_n, offs_m, CAUSAL: tl.constexpr):
    """The same for a transposed tile (N, M)."""
    if CAUSAL:
        t = tl.where(offs_m[None, :] >= offs_n[:, None], t, 0.0)
    return t


# ------------------------------------------------------------------------------------------------ forward
@triton.jit
def _forward_kernel(Q, K, V, O, A,
                    sqb, sqm, sqd, skb, skn, skd, svb, svn, sve, sob, som, soe, sab, sam, san,
                    N, D, E,
                    CAUSAL: tl.constexpr, STORE_A: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per (query tile I, batch b): O_I = Σ_J tanh(Q_I K_Jᵀ) V_J (32), A_IJ stored if STORE_A."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < N
    q = _load(Q + b * sqb + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
              row_ok[:, None] & (offs_d[None, :] < D), UPCAST)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N)                                 # (37): later key tiles are 0
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < N
        kt = _load(K + b * skb + offs_n[None, :] * skn + offs_d[:, None] * skd,
                   key_ok[None, :] & (offs_d[:, None] < D), UPCAST)               # K_Jᵀ: (D, N)
        x = tl.dot(q, kt, input_precision=PRECISION)                              # (1) X_IJ = Q_I K_Jᵀ
        a = _causal(_tanh(x), offs_m, offs_n, CAUSAL)                             # (2), (37)
        v = _load(V + b * svb + offs_n[:, None] * svn + offs_e[None, :] * sve,
                  key_ok[:, None] & (offs_e[None, :] < E), UPCAST)
        if STORE_A:
            tl.store(A + b * sab + offs_m[:, None].to(tl.int64) * sam + offs_n[None, :] * san, a.to(A.dtype.element_ty),
                     mask=row_ok[:, None] & key_ok[None, :])
        acc = tl.dot(a.to(v.dtype), v, acc, input_precision=PRECISION)           # (3)/(32) O_I += A_IJ V_J
    tl.store(O + b * sob + offs_m[:, None] * som + offs_e[None, :] * soe, acc.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_e[None, :] < E))


# ----------------------------------------------------------------------------------------------- backward
@triton.jit
def _dkdv_kernel(Q, K, V, GO, A, GA, GK, GV,
                 sqb, sqm, sqd, skb, skn, skd, svb, svn, sve, sgb, sgm, sge, sab, sam, san, sgab, sgam, sgan,
                 sdkb, sdkn, sdkd, sdvb, sdvn, sdve,
                 N, D, E,
                 CAUSAL: tl.constexpr, SAVED_A: tl.constexpr, HAS_GO: tl.constexpr, HAS_GA: tl.constexpr,
                 NEED_K: tl.constexpr, NEED_V: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per (key tile J, batch b), looping over query tiles I, in transposed tiles (N, M):
    G_V,J = Σ_I A_IJᵀ G_O,I and G_K,J = Σ_I G_X,IJᵀ Q_I (35), G_X,IJ by (33).  A_IJ is read from A when
    SAVED_A (the lab's op), else recomputed from Q_I, K_J (o-only)."""
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    key_ok = offs_n < N
    if not SAVED_A:
        k = _load(K + b * skb + offs_n[:, None] * skn + offs_d[None, :] * skd,
                  key_ok[:, None] & (offs_d[None, :] < D), UPCAST)                # (N, D)
    if NEED_K and HAS_GO:
        v = _load(V + b * svb + offs_n[:, None] * svn + offs_e[None, :] * sve,
                  key_ok[:, None] & (offs_e[None, :] < E), UPCAST)                # (N, E)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M                               # (38): earlier query tiles are 0
    for start_m in range(lo, N, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N
        if NEED_K or not SAVED_A:
            q = _load(Q + b * sqb + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                      row_ok[:, None] & (offs_d[None, :] < D), UPCAST)            # (M, D)
        if SAVED_A:
            at = _load(A + b * sab + offs_m[None, :].to(tl.int64) * sam + offs_n[:, None] * san,
                       row_ok[None, :] & key_ok[:, None], UPCAST).to(tl.float32)  # A_IJᵀ: (N, M)
            slope_t = 1.0 - at * at
        else:
            at, slope_t = _tanh_and_slope(tl.dot(k, tl.trans(q), input_precision=PRECISION))
            at = _causal_t(at, offs_n, offs_m, CAUSAL)
        if HAS_GO:
            go = _load(GO + b * sgb + offs_m[:, None] * sgm + offs_e[None, :] * sge,
                       row_ok[:, None] & (offs_e[None, :] < E), UPCAST)           # (M, E)
            if NEED_V:
                dv = tl.dot(at.to(go.dtype), go, dv, input_precision=PRECISION)  # (35) G_V,J += A_IJᵀ G_O,I
        if NEED_K:
            gt = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            if HAS_GO:
                gt = tl.dot(v, tl.trans(go), input_precision=PRECISION)          # (33) (G_O,I V_Jᵀ)ᵀ
            if HAS_GA:
                gt += _load(GA + b * sgab + offs_m[None, :].to(tl.int64) * sgam + offs_n[:, None] * sgan,
                            row_ok[None, :] & key_ok[:, None], UPCAST).to(tl.float32)   # (33) + G_A,IJᵀ
            gxt = _causal_t(gt * slope_t, offs_n, offs_m, CAUSAL)                  # (33) G_X,IJᵀ, (38)
            dk = tl.dot(gxt.to(q.dtype), q, dk, input_precision=PRECISION)      # (35) G_K,J += G_X,IJᵀ Q_I
    if NEED_K:
        tl.store(GK + b * sdkb + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd, dk.to(GK.dtype.element_ty),
                 mask=key_ok[:, None] & (offs_d[None, :] < D))
    if NEED_V:
        tl.store(GV + b * sdvb + offs_n[:, None] * sdvn + offs_e[None, :] * sdve, dv.to(GV.dtype.element_ty),
                 mask=key_ok[:, None] & (offs_e[None, :] < E))


@triton.jit
def _dq_kernel(Q, K, V, GO, A, GA, GQ,
               sqb, sqm, sqd, skb, skn, skd, svb, svn, sve, sgb, sgm, sge, sab, sam, san, sgab, sgam, sgan,
               sdqb, sdqm, sdqd,
               N, D, E,
               CAUSAL: tl.constexpr, SAVED_A: tl.constexpr, HAS_GO: tl.constexpr, HAS_GA: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per (query tile I, batch b), looping over key tiles J: G_Q,I = Σ_J G_X,IJ K_J (34)."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < N
    if not SAVED_A:
        q = _load(Q + b * sqb + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                  row_ok[:, None] & (offs_d[None, :] < D), UPCAST)                # (M, D)
    if HAS_GO:
        go = _load(GO + b * sgb + offs_m[:, None] * sgm + offs_e[None, :] * sge,
                   row_ok[:, None] & (offs_e[None, :] < E), UPCAST)               # (M, E)
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N)                                 # (38): later key tiles are 0
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < N
        k = _load(K + b * skb + offs_n[:, None] * skn + offs_d[None, :] * skd,
                  key_ok[:, None] & (offs_d[None, :] < D), UPCAST)                # (N, D)
        if SAVED_A:
            a = _load(A + b * sab + offs_m[:, None].to(tl.int64) * sam + offs_n[None, :] * san,
                      row_ok[:, None] & key_ok[None, :], UPCAST).to(tl.float32)
            slope = 1.0 - a * a
        else:
            _, slope = _tanh_and_slope(tl.dot(q, tl.trans(k), input_precision=PRECISION))
        g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if HAS_GO:
            vt = _load(V + b * svb + offs_n[None, :] * svn + offs_e[:, None] * sve,
                       key_ok[None, :] & (offs_e[:, None] < E), UPCAST)           # V_Jᵀ: (E, N)
            g = tl.dot(go, vt, input_precision=PRECISION)                         # (33) G_O,I V_Jᵀ
        if HAS_GA:
            g += _load(GA + b * sgab + offs_m[:, None].to(tl.int64) * sgam + offs_n[None, :] * sgan,
                       row_ok[:, None] & key_ok[None, :], UPCAST).to(tl.float32)  # (33) + G_A,IJ
        gx = _causal(g * slope, offs_m, offs_n, CAUSAL)                           # (33) G_X,IJ, (38)
        dq = tl.dot(gx.to(k.dtype), k, dq, input_precision=PRECISION)            # (34) G_Q,I += G_X,IJ K_J
    tl.store(GQ + b * sdqb + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd, dq.to(GQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < D))


# ---------------------------------------------------------------------------------------------- launchers
def effective_mask(grad_o: Optional[Tensor], grad_a: Optional[Tensor], output_mask: Sequence[bool]):
    """The gradients that are computed, of those asked for: G_V reads G_O only (13)/(35); with neither G_O nor
    G_A every gradient is zero.  The others are returned as ``None``."""
    want_q, want_k, want_v = map(bool, output_mask)
    if grad_o is None and grad_a is None:
        return False, False, False
    return want_q, want_k, want_v and grad_o is not None


def _tile(size: int) -> int:
    return max(16, triton.next_power_of_2(max(size, 1)))      # tl.dot needs every tile dimension >= 16


def _strides(t: Optional[Tensor]):
    return (0, 0, 0) if t is None else tuple(t.stride())


def _meta(dtype, D: int, E: int, precision: str, block_m: Optional[int], block_n: Optional[int]) -> dict:
    wide = max(D, E) > 128                     # rows of 256: half the tile rows, for registers / shared memory
    return dict(PRECISION=precision, UPCAST=INTERPRET and dtype == torch.bfloat16,
                BLOCK_M=block_m or (BLOCK_M // 2 if wide else BLOCK_M),
                BLOCK_N=block_n or (BLOCK_N // 2 if wide else BLOCK_N), BLOCK_D=_tile(D), BLOCK_E=_tile(E))


def _forward(q, k, v, causal, store_a, precision, block_m, block_n):
    (B, N, D), E = q.shape, v.shape[-1]
    meta = _meta(q.dtype, D, E, precision, block_m, block_n)
    o = q.new_empty((B, N, E))
    a = q.new_empty((B, N, N)) if store_a else None
    if B and N:
        grid = (triton.cdiv(N, meta["BLOCK_M"]), B)
        _run(_forward_kernel)[grid](q, k, v, o, a if store_a else o,
                              *q.stride(), *k.stride(), *v.stride(), *o.stride(), *_strides(a),
                              N, D, E, CAUSAL=causal, STORE_A=store_a, **meta)
    return o, a


def _backward(grad_o, grad_a, q, k, v, a, causal, output_mask, precision, block_m, block_n):
    """The two backward kernels; ``a`` given: read tiles of it (the lab's op), else recompute them (o-only)."""
    want_q, want_k, want_v = effective_mask(grad_o, grad_a, output_mask)
    # Shapes from what was saved: q only for G_K, k only for G_Q, v only for G_Q or G_K (fused_backward).
    qk = q if q is not None else k
    B, N = (a if a is not None else q).shape[:2]
    D = qk.shape[-1] if qk is not None else 0
    E = (v if v is not None else grad_o).shape[-1] if (v is not None or grad_o is not None) else 0
    meta = _meta(qk.dtype if qk is not None else a.dtype, D, E, precision, block_m, block_n)
    gq = k.new_empty((B, N, D)) if want_q else None
    gk = q.new_empty((B, N, D)) if want_k else None
    gv = grad_o.new_empty((B, N, E)) if want_v else None
    if not (B and N) or not (want_q or want_k or want_v):
        return tuple(None if t is None else t.zero_() for t in (gq, gk, gv))
    any_ = next(t for t in (a, q, k, v, grad_o) if t is not None)
    ptr = lambda t: any_ if t is None else t                  # noqa: E731  (a pointer argument never loaded)
    flags = dict(CAUSAL=causal, SAVED_A=a is not None, HAS_GO=grad_o is not None, HAS_GA=grad_a is not None)
    common = (*_strides(q), *_strides(k), *_strides(v), *_strides(grad_o), *_strides(a), *_strides(grad_a))
    if want_k or want_v:
        grid = (triton.cdiv(N, meta["BLOCK_N"]), B)
        _run(_dkdv_kernel)[grid](ptr(q), ptr(k), ptr(v), ptr(grad_o), ptr(a), ptr(grad_a), ptr(gk), ptr(gv),
                           *common, *_strides(gk), *_strides(gv), N, D, E,
                           NEED_K=want_k, NEED_V=want_v, **flags, **meta)
    if want_q:
        grid = (triton.cdiv(N, meta["BLOCK_M"]), B)
        _run(_dq_kernel)[grid](ptr(q), ptr(k), ptr(v), ptr(grad_o), ptr(a), ptr(grad_a), gq,
                         *common, *gq.stride(), N, D, E, **flags, **meta)
    return gq, gk, gv


def o_only_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, *, precision: str = "ieee",
                   block_m: Optional[int] = None, block_n: Optional[int] = None) -> Tensor:
    """``o = tanh(q kᵀ [masked (37)]) v`` on stacks (B, n, ·): one kernel, no n×n tensor."""
    return _forward(q, k, v, causal, False, precision, block_m, block_n)[0]


def o_only_backward(grad_o: Tensor, q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    output_mask: Sequence[bool] = (True, True, True), *, precision: str = "ieee",
                    block_m: Optional[int] = None, block_n: Optional[int] = None
                    ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``(G_Q, G_K, G_V)`` of ``o_only_forward`` by (33)-(35), (38), tiles of A recomputed; ``None`` where
    ``output_mask`` is False.  q and k are always read; v only for G_Q or G_K."""
    return _backward(grad_o, None, q, k, v, None, causal, output_mask, precision, block_m, block_n)


def fused_forward(q: Tensor, k: Tensor, v: Tensor, *, precision: str = "ieee", block_m: Optional[int] = None,
                  block_n: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """The lab's op ``(o, a)`` (1)-(3) on stacks (B, n, ·): a written once, o accumulated from the same tiles."""
    return _forward(q, k, v, False, True, precision, block_m, block_n)


def fused_backward(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                   v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool] = (True, True, True), *,
                   precision: str = "ieee", block_m: Optional[int] = None, block_n: Optional[int] = None
                   ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(9)-(13) by tiles (33)-(35) from the saved ``a``; ``grad_o`` / ``grad_a`` may be ``None`` (not loaded).
    As ``formulas.attn_backward``: q is read only for G_K, k only for G_Q, v only when G_O reaches q or k."""
    return _backward(grad_o, grad_a, q, k, v, a, False, output_mask, precision, block_m, block_n)


# --------------------------------------------------------------------------------------------- operators
# ``attn_lab::fused_forward`` / ``attn_lab::fused_backward``: ``torch.library.triton_op`` (torch >= 2.6) makes the
# kernels visible to torch.compile (the function is also the fake kernel: outputs are allocated with torch ops,
# kernels launched through ``wrap_triton``).  Under the interpreter ``wrap_triton`` is used only from torch 2.13
# on (before, it does not run interpreted kernels); elsewhere the raw kernels are launched.
_HAS_TRITON_OP = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
_WRAP = _HAS_TRITON_OP and (not INTERPRET or tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 13))


def _run(kernel):
    return torch.library.wrap_triton(kernel) if _WRAP else kernel


def _fused_forward_impl(q: Tensor, k: Tensor, v: Tensor, precision: str) -> Tuple[Tensor, Tensor]:
    return fused_forward(q, k, v, precision=precision)


def _fused_backward_impl(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor],
                         k: Optional[Tensor], v: Optional[Tensor], a: Tensor, need_q: bool, need_k: bool,
                         need_v: bool, precision: str) -> Tuple[Tensor, Tensor, Tensor]:
    """An operator returns tensors: a gradient not computed (``effective_mask``) is an empty tensor."""
    grads = fused_backward(grad_o, grad_a, q, k, v, a, (need_q, need_k, need_v), precision=precision)
    return tuple(a.new_empty(0) if g is None else g for g in grads)


def _setup_context(ctx, inputs, output):
    q, k, v, precision = inputs
    need_q, need_k = ctx.needs_input_grad[:2]
    ctx.save_for_backward(q if need_k else None, k if need_q else None, v if need_q or need_k else None,
                          output[1])                                         # section 6's save rule
    ctx.precision = precision
    ctx.set_materialize_grads(False)           # an unused output's gradient stays None: no n×n zeros


def _fused_backward_rule(ctx, grad_o, grad_a):
    q, k, v, a = ctx.saved_tensors
    mask = effective_mask(grad_o, grad_a, ctx.needs_input_grad[:3])
    if torch.is_grad_enabled():
        raise NotImplementedError(
            "attn_lab::fused_forward: the fused backward kernels are not differentiable (create_graph=True); "
            "use torch_impl.attn, whose backward runs the differentiable formulas when the graph is kept")
    grads = fused_backward_op(grad_o, grad_a, q, k, v, a, *mask, ctx.precision)
    return (*(g if want else None for g, want in zip(grads, mask)), None)


if _HAS_TRITON_OP:
    fused_forward_op = torch.library.triton_op("attn_lab::fused_forward", _fused_forward_impl, mutates_args=())
    fused_backward_op = torch.library.triton_op("attn_lab::fused_backward", _fused_backward_impl, mutates_args=())
    fused_forward_op.register_autograd(_fused_backward_rule, setup_context=_setup_context)
else:                                          # torch < 2.6: plain functions, same signatures
    fused_forward_op, fused_backward_op = _fused_forward_impl, _fused_backward_impl
