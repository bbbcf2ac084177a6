"""How ``AttnFunction`` schedules the formulas to allocate less; the values are exactly those of ``formulas``.

``AttnFunction.forward`` / ``backward`` call ``attn_forward`` / ``attn_backward`` here; everything in place,
fused or blocked lives in this module, and only this module asks ``internals`` whether a write is observable:

* forward: ``tanh`` runs in place on the fresh scores ``x`` (nothing else holds them): one n×n buffer, not two;
  ``attn_forward_into`` writes one key block's scores straight into the caller's columns of ``a`` and adds its
  term of (3) into ``o`` (the sequence-parallel ring, ``torch_impl.sharded.ring``: no block-sized temporary).
* backward, from ``IN_PLACE_FROM_BYTES`` of ``a`` on, when ``internals.may_write_in_place`` says nothing can
  observe an in-place write (a plain backward, not ``create_graph=True``, not under ``torch.func``, not
  compiling; on a torch where that cannot be told, never).  Below that size the buffer saved is smaller than
  what asking costs (about 7 µs for the six tensors: 5 % of a whole step at n=2), so the formulas run as written:

  - (9) is one fused GEMM (``addmm``) into a fresh buffer and (10) is written over it: one n×n buffer, not two;
  - on CPU, from ``BLOCKED_FROM_BYTES`` of ``a`` on, (9)-(12) run one block of rows at a time, eq. (31): the
    scratch is a block of at most ``SCRATCH_BLOCK_BYTES``, not an n×n buffer.  Why there and only there (glibc
    returns buffers of 32 MiB and more to the OS, so each backward would page-fault through a fresh one) is
    measured in docs/performance.md.  Not for float16 / bfloat16 ((12)'s sum over blocks would be rounded at
    every partial sum, where one GEMM accumulates in float32), and only for plain tensors (a DTensor's slices
    would be communication).

  Otherwise ``formulas.attn_backward`` runs as written.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from . import formulas, internals

__all__ = ["attn_forward", "attn_forward_into", "attn_backward", "BLOCKED_FROM_BYTES", "IN_PLACE_FROM_BYTES",
           "SCRATCH_BLOCK_BYTES"]

IN_PLACE_FROM_BYTES = 256 << 10
SCRATCH_BLOCK_BYTES = 4 << 20
BLOCKED_FROM_BYTES = 32 << 20


def attn_forward(q: Tensor, k: Tensor, v: Tensor):
    """``formulas.attn_forward`` (1)-(3), with (2) applied in place to the fresh scores (1)."""
    a = (q @ k.mT).tanh_()                                                   # (1), (2) in place
    return a @ v, a                                                          # (3)


def attn_forward_into(q: Tensor, k: Tensor, v: Tensor, a: Tensor, o: Tensor) -> None:
    """``formulas.attn_forward`` (1)-(3) for one key block J, written where the caller keeps it: (1) straight into
    ``a`` (the block's columns of a row block's scores, a strided view: BLAS writes it with its leading dimension,
    no temporary), (2) in place there, and the block's term A V_J of (3) added into ``o`` (the sum over J)."""
    torch.mm(q, k.mT, out=a)                                                 # (1)
    a.tanh_()                                                                # (2) in place
    o.addmm_(a, v)                                                           # (3), one term of the sum over J


def attn_backward(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                  v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool]):
    """``formulas.attn_backward`` (9)-(13): in place where unobservable, by blocks of rows (31) when large."""
    if _nbytes(a) < IN_PLACE_FROM_BYTES or not internals.may_write_in_place(grad_o, grad_a, q, k, v, a):
        return formulas.attn_backward(grad_o, grad_a, q, k, v, a, output_mask)            # (9)-(13) as written
    want_q, want_k, want_v = output_mask
    grad_v = formulas.mix_vjp(grad_o, a, None, (False, True))[1] if want_v and grad_o is not None else None  # (13)
    if not (want_q or want_k) or (grad_o is None and grad_a is None):
        return None, None, grad_v
    if _blocks_pay(a):
        return (*_scores_grads_by_rows(grad_o, grad_a, q, k, v, a, (want_q, want_k)), grad_v)   # (31)
    return (*_scores_grads(grad_o, grad_a, q, k, v, a, (want_q, want_k)), grad_v)               # (9)-(12)


def _scores_grads(grad_o, grad_a, q, k, v, a, output_mask):
    """(9)-(12) with one n×n buffer: (9) by one fused GEMM into a fresh buffer, (10) written over it."""
    if grad_o is None:
        g_x = formulas.tanh_vjp(grad_a, a)                                   # (9) is G_A itself: (10) out of place
    else:
        g_a = (formulas.mix_vjp(grad_o, None, v, (True, False))[0] if grad_a is None
               else torch.baddbmm(grad_a, grad_o, v.mH) if a.dim() == 3 else torch.addmm(grad_a, grad_o, v.mH))  # (9)
        g_x = formulas.tanh_vjp(g_a, a, out=g_a)                             # (10) over (9)'s buffer
    return formulas.scores_vjp(g_x, q, k, output_mask)                       # (11), (12)


def _nbytes(a: Tensor) -> int:
    return a.numel() * a.element_size()


def _blocks_pay(a: Tensor) -> bool:
    nbytes = _nbytes(a)
    return (type(a) is Tensor and a.is_cpu and a.element_size() >= 4
            and nbytes >= BLOCKED_FROM_BYTES and nbytes > SCRATCH_BLOCK_BYTES)


def _row_blocks(a: Tensor, block_bytes: int):
    """``(examples, rows)`` index pairs that cover ``a`` ((m, n), or a stack (B, m, n)) in blocks of at most
    ``block_bytes`` of ``a`` (at least one row): whole examples at a time when one fits, else rows of one."""
    n_rows, row_bytes = a.shape[-2], max(1, a.shape[-1] * a.element_size())
    if a.dim() == 3 and n_rows * row_bytes <= block_bytes:
        per = max(1, block_bytes // max(1, n_rows * row_bytes))
        return [((slice(b, b + per),), slice(None)) for b in range(0, a.shape[0], per)]
    rows = max(1, block_bytes // row_bytes)
    examples = [()] if a.dim() == 2 else [(slice(b, b + 1),) for b in range(a.shape[0])]
    return [(ex, slice(s, s + rows)) for ex in examples for s in range(0, n_rows, rows)]


def _scores_grads_by_rows(grad_o, grad_a, q, k, v, a, output_mask):
    """Eq. (31): ``_scores_grads`` (9)-(12) on one block of rows R at a time.  Rows R of G_Q need rows R of G_O,
    G_A, A and Q only; G_K = Σ_R G_X[R]ᵀ Q̄[R] gets one term per block."""
    grad_q = grad_k = None
    rows_of = lambda t, r: None if t is None else t[r]                     # noqa: E731
    for examples, rows in _row_blocks(a, SCRATCH_BLOCK_BYTES):
        r = (*examples, rows)
        g_q, g_k = _scores_grads(rows_of(grad_o, r), rows_of(grad_a, r), rows_of(q, r), rows_of(k, examples),
                                 rows_of(v, examples), a[r], output_mask)    # (9)-(12), rows R
        if g_q is not None:                                                  # (11): rows R of G_Q
            if grad_q is None:
                grad_q = g_q.new_empty((*a.shape[:-1], g_q.shape[-1]))
            grad_q[r] = g_q
        if g_k is not None:                                                  # (12) as the sum (31)
            if grad_k is None:
                grad_k = g_k.new_zeros((*a.shape[:-2], a.shape[-1], g_k.shape[-1]))
            grad_k[examples].add_(g_k)
        del g_q, g_k                    # free this block's scratch before the next one is allocated
    return grad_q, grad_k
