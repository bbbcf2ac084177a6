"""How the hand-written rules are *scheduled* to allocate less; the values are those of ``formulas``.

``AttnFunction`` (and so the ``attn_lab::attn`` operator) calls ``attn_backward`` here rather than the formulas
directly.  Two things happen, both only when ``internals.may_write_in_place`` says no transform can observe an
in-place write (a plain backward, not ``create_graph=True``, not under ``torch.func``; on a torch where that
cannot be told, never):

* (10) overwrites the buffer of (9): one n×n buffer, not two.
* On CPU, from ``BLOCKED_FROM_BYTES`` of ``a`` on, (9)-(12) run one block of rows at a time, eq. (31) of
  derivation.md: the scratch is a block of at most ``SCRATCH_BLOCK_BYTES`` instead of an n×n buffer.
  Why there and only there (glibc returns buffers of 32 MiB and more to the OS, so each backward would
  page-fault through a fresh one) is measured in docs/performance.md.  Not for float16 / bfloat16: (12)'s
  sum over blocks would be rounded at every partial sum, where one GEMM accumulates in float32.
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor

from . import formulas, internals

__all__ = ["attn_backward", "BLOCKED_FROM_BYTES", "SCRATCH_BLOCK_BYTES"]

SCRATCH_BLOCK_BYTES = 4 << 20
BLOCKED_FROM_BYTES = 32 << 20


def attn_backward(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                  v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool]):
    """``formulas.attn_backward`` (9)-(13), in place when unobservable, by blocks of rows (31) when large."""
    if _blocks_pay(a) and any(output_mask[:2]) and internals.may_write_in_place(grad_o, grad_a, q, k, v, a):
        grad_v = formulas.mix_vjp(grad_o, a, None, (False, True))[1] if output_mask[2] and grad_o is not None else None
        return (*_scores_grads_by_rows(grad_o, grad_a, q, k, v, a, output_mask[:2]), grad_v)  # (31); (13)
    # (10) writes into the buffer (9) computed from grad_o, grad_a and v, reading a: those decide
    inplace = internals.may_write_in_place(grad_o, grad_a, v, a)
    return formulas.attn_backward(grad_o, grad_a, q, k, v, a, output_mask, inplace)        # (9)-(13)


def _blocks_pay(a: Tensor) -> bool:
    nbytes = a.numel() * a.element_size()
    return nbytes >= BLOCKED_FROM_BYTES and nbytes > SCRATCH_BLOCK_BYTES and a.is_cpu and a.element_size() >= 4


def _row_blocks(a: Tensor, block_bytes: int):
    """``(examples, rows)`` index pairs that cover ``a`` ((n, n), or a stack (B, n, n)) in blocks of at most
    ``block_bytes`` of ``a`` (at least one row): whole examples at a time when one fits, else rows of one."""
    n_rows, row_bytes = a.shape[-2], max(1, a.shape[-1] * a.element_size())
    if a.dim() == 3 and n_rows * row_bytes <= block_bytes:
        per = max(1, block_bytes // max(1, n_rows * row_bytes))
        return [((slice(b, b + per),), slice(None)) for b in range(0, a.shape[0], per)]
    rows = max(1, block_bytes // row_bytes)
    examples = [()] if a.dim() == 2 else [(slice(b, b + 1),) for b in range(a.shape[0])]
    return [(ex, slice(s, s + rows)) for ex in examples for s in range(0, n_rows, rows)]


def _scores_grads_by_rows(grad_o, grad_a, q, k, v, a, output_mask):
    """Eq. (31): ``formulas.scores_grads`` (9)-(12) on one block of rows at a time.  Rows R of G_Q need rows R
    of G_O, G_A, A and Q only; G_K = Σ_R G_X[R]ᵀ Q̄[R] gets one term per block."""
    grad_q = grad_k = None
    rows_of = lambda t, r: None if t is None else t[r]                     # noqa: E731
    for examples, rows in _row_blocks(a, SCRATCH_BLOCK_BYTES):
        r = (*examples, rows)
        g_q, g_k = formulas.scores_grads(rows_of(grad_o, r), rows_of(grad_a, r), rows_of(q, r),
                                         rows_of(k, examples), rows_of(v, examples), a[r], output_mask,
                                         inplace=True)                       # (9)-(12), rows R
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
