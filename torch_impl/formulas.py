"""The math of tanh attention, once, as pure torch functions.

This module is the analogue of PyTorch's ``FunctionsManual.cpp``: one function per formula, referenced by name
from every torch entry point (``AttnFunction`` and the ``attn_lab::attn`` operator).  Equation numbers are those
of ``derivation.md``.

    X = Q Kᵀ            (1)        Q: (n, d)   K: (n, d)   X: (n, n)
    A = tanh X          (2)
    O = A V             (3)        V: (n, e)   O: (n, e)

Gradients follow PyTorch's complex convention (conjugate Wirtinger): for real dtypes every ``conj`` below is
a no-op, and for complex dtypes ``.conj()`` / ``.mH`` only set the lazy conjugate bit, which the matmul
kernels consume without a copy.

No function here validates its inputs (see ``torch_impl.validation``), and none modifies a tensor it was
given.  Every function also accepts a stack of examples (3-D tensors ``(B, n, ·)``, the batched path of
``torch.vmap``): ``@``, ``.mT`` / ``.mH`` and ``tanh_backward`` broadcast over the leading dimension and the
fused ``addmm`` becomes ``baddbmm`` (``_addmm``).  The only in-place write is into a buffer that the
function itself allocated, and only when no autograd or functorch transform could observe it
(``_owns_scratch``).  On CPU, from 32 MiB of ``a`` on, ``attn_backward`` runs (9)-(12) by blocks of rows, eq.
(31) (``_scores_grads_blocked``), so that scratch is a block, not an n×n buffer.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd import forward_ad

__all__ = [
    "attn_forward", "attn_backward", "attn_jvp", "total_grad_a",
    "scores_vjp", "tanh_vjp", "mix_vjp", "scores_jvp", "tanh_jvp", "mix_jvp",
]

# The C++ callables behind the ``OpOverload`` objects: ``OpOverload.__call__`` is a Python frame that only
# forwards to ``_op`` (about 0.5 µs a call, which matters at the lab's n=2 where a whole fwd+bwd is ~40 µs).
_tanh_backward = getattr(torch.ops.aten.tanh_backward.default, "_op", torch.ops.aten.tanh_backward.default)
_tanh_backward_out = getattr(torch.ops.aten.tanh_backward.grad_input, "_op", torch.ops.aten.tanh_backward.grad_input)
_is_grad_enabled = torch.is_grad_enabled

# Private functorch predicates behind ``_owns_scratch``.  Should a torch version lack one, every in-place
# shortcut is off (``_CAN_CHECK_WRAPPERS``): slower, never wrong.
_functorch_c = torch._C._functorch
_is_functorch_wrapped = getattr(_functorch_c, "is_functorch_wrapped_tensor", None)
_is_legacy_batched = getattr(_functorch_c, "is_legacy_batchedtensor", None)   # torch._vmap_internals.vmap (gradcheck)
_CAN_CHECK_WRAPPERS = _is_functorch_wrapped is not None and _is_legacy_batched is not None


def _dual_level_open() -> bool:
    """A ``forward_ad.dual_level()`` is open: only then can a tensor carry a forward-mode tangent.  Reads the
    private level counter (cheap; unknown in some torch version -> assume open, the conservative answer)."""
    return getattr(forward_ad, "_current_level", 0) >= 0


def _has_tangent(t: Tensor) -> bool:
    """``forward_ad.unpack_dual(t).tangent is not None``, without its Python call when no dual level is open
    (``_current_level < 0``): a tangent only exists inside a ``forward_ad.dual_level()``, and in that case the
    very same ``unpack_dual`` decides.  Answers "yes" (the conservative answer: use the out-of-place op) when
    it cannot tell: below the Autograd key with a dispatch mode active (e.g. ``torch.func.linearize`` or
    ``FlopCounterMode`` inside a dual level), ``unpack_dual`` hits an internal assert in ``_fw_primal``."""
    if not _dual_level_open():
        return False
    try:
        return forward_ad.unpack_dual(t).tangent is not None
    except RuntimeError:
        return True


def _owns_scratch(*tensors: Tensor) -> bool:
    """True when an in-place write into a scratch buffer computed from ``tensors`` is invisible to every
    transform: grad mode is off (so this is not a ``create_graph=True`` backward), no forward-mode dual
    tensor is involved, and no vmap / functorch wrapper is around (their batching rules reject ``out=``
    ops).  Otherwise the caller must use the out-of-place op so the result stays differentiable."""
    # Under torch.compile, Dynamo cannot trace the wrapper checks below, and functionalization would turn the
    # in-place write back into a copy anyway: use the out-of-place ops.
    if _is_grad_enabled() or torch.compiler.is_compiling() or not _CAN_CHECK_WRAPPERS:
        return False
    for t in tensors:
        if _is_functorch_wrapped(t) or _is_legacy_batched(t) or _has_tangent(t):
            return False
    return True


def _addmm(c: Tensor, m1: Tensor, m2: Tensor) -> Tensor:
    """``c + m1 @ m2`` as one fused GEMM that writes a fresh buffer: ``addmm`` for matrices, ``baddbmm`` for
    stacks of them (the batched path, ``function.BatchedAttnFunction``, runs these formulas on 3-D tensors)."""
    return torch.addmm(c, m1, m2) if m1.dim() == 2 else torch.baddbmm(c, m1, m2)


def attn_forward(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """Eqs. (1)-(3): ``o = tanh(q kᵀ) v``; returns ``(o, a)``.

    ``tanh`` is applied in place to the freshly allocated scores ``x`` when that is unobservable, so the
    forward allocates one n×n buffer (``a``), not two; ``x`` is never kept."""
    x = q @ k.mT                                                    # (1)
    a = x.tanh_() if _owns_scratch(x) else torch.tanh(x)            # (2)
    o = a @ v                                                       # (3)
    return o, a


def _tanh_backward_into(grad: Tensor, y: Tensor, fresh: bool) -> Tensor:
    """ATen's fused ``tanh_backward(grad, y) = grad ⊙ conj(1 − y²)``, written into ``grad`` when ``grad`` is a
    scratch buffer we allocated (``fresh``) and nothing can observe the write; out of place otherwise."""
    if fresh and _owns_scratch(grad, y):
        return _tanh_backward_out(grad, y, grad_input=grad)
    if torch.compiler.is_compiling():          # Dynamo cannot trace OpOverload._op; the OpOverload is the same op
        return torch.ops.aten.tanh_backward.default(grad, y)
    return _tanh_backward(grad, y)


# --- the three building blocks (1), (2), (3): VJP and JVP of each ------------------------------------------

def scores_vjp(grad_x: Tensor, q: Optional[Tensor], k: Optional[Tensor],
               output_mask: Sequence[bool] = (True, True)) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """VJP of the scores block ``x = q kᵀ`` (1): eqs. (4)-(5), used as (11)-(12).

        G_Q = G_X K̄        (4)       G_K = G_Xᵀ Q̄        (5)

    ``output_mask = (needs grad q, needs grad k)``; ``k`` is read only for ``G_Q`` and ``q`` only for ``G_K``,
    so the other may be ``None``."""
    grad_q = grad_x @ k.conj() if output_mask[0] else None          # (4) = (11)
    grad_k = grad_x.mT @ q.conj() if output_mask[1] else None       # (5) = (12)
    return grad_q, grad_k


def tanh_vjp(grad_a: Tensor, a: Tensor, fresh: bool = False) -> Tensor:
    """VJP of ``a = tanh x`` (2) from the saved output ``a`` (tanh is not recomputed): eq. (6), used as (10).

        G_X = G_A ⊙ conj(1 − A²)        (6)

    ATen's fused ``tanh_backward`` kernel applies the conjugate for complex dtypes.  When ``grad_a`` is a
    scratch buffer the caller owns (``fresh``), the result overwrites it, so the whole backward allocates at
    most one n×n buffer (or, by blocks of rows (31), one block)."""
    return _tanh_backward_into(grad_a, a, fresh)


def mix_vjp(grad_o: Tensor, a: Optional[Tensor], v: Optional[Tensor],
            output_mask: Sequence[bool] = (True, True)) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """VJP of the mixing block ``o = a v`` (3): eqs. (7)-(8).

        G_A = G_O Vᴴ        (7)       G_V = Aᴴ G_O        (8)

    ``output_mask = (needs grad a, needs grad v)``.  In the whole op (7) is fused with the incoming ``G_A``
    (``total_grad_a``)."""
    grad_a = grad_o @ v.mH if output_mask[0] else None              # (7)
    grad_v = a.mH @ grad_o if output_mask[1] else None              # (8) = (13)
    return grad_a, grad_v


def scores_jvp(q: Tensor, k: Tensor, q_dot: Optional[Tensor], k_dot: Optional[Tensor]) -> Optional[Tensor]:
    """JVP of ``x = q kᵀ``: eq. (14); a ``None`` tangent is a zero, and ``None`` is returned when both are.

        Ẋ = Q̇ Kᵀ + Q K̇ᵀ        (14)

    The result is always a fresh buffer (the second term is accumulated with ``addmm``)."""
    x_dot = None if q_dot is None else q_dot @ k.mT                 # (14), first term
    if k_dot is not None:
        x_dot = q @ k_dot.mT if x_dot is None else _addmm(x_dot, q, k_dot.mT)   # (14), second term
    return x_dot


def tanh_jvp(x_dot: Tensor, a: Tensor, fresh: bool = False) -> Tensor:
    """JVP of ``a = tanh x``: eq. (15) (no conjugate: a JVP is convention-free).

        Ȧ = (1 − A²) ⊙ Ẋ        (15)

    Since ``tanh_backward(g, y) = g ⊙ conj(1 − y²)``, passing ``y = Ā`` gives exactly (15) with the fused
    kernel (for real dtypes ``conj`` is a no-op).  Overwrites ``x_dot`` when it is the caller's scratch
    buffer (``fresh``)."""
    return _tanh_backward_into(x_dot, a.conj(), fresh)


def mix_jvp(a: Tensor, v: Tensor, a_dot: Optional[Tensor], v_dot: Optional[Tensor]) -> Optional[Tensor]:
    """JVP of ``o = a v``: eq. (16); a ``None`` tangent is a zero, and ``None`` is returned when both are.

        Ȯ = Ȧ V + A V̇        (16)
    """
    o_dot = None if a_dot is None else a_dot @ v                    # (16), first term
    if v_dot is not None:
        o_dot = a @ v_dot if o_dot is None else _addmm(o_dot, a, v_dot)   # (16), second term
    return o_dot


# --- the whole op: the blocks chained, with the two incoming gradients combined by (9) --------------------

def total_grad_a(grad_o: Optional[Tensor], grad_a: Optional[Tensor], v: Tensor) -> Tuple[Optional[Tensor], bool]:
    """Eq. (9): total gradient reaching ``a``, ``Ĝ_A = G_O Vᴴ + G_A`` (the mix block's (7) plus ``G_A``).

    ``a`` is used twice (returned, and multiplied by ``v``), so by the multivariable chain rule the two
    contributions add.  Either incoming gradient may be ``None`` (an unused output); no zeros are built in
    its place, and when both are present the sum is fused into one ``addmm``.

    Returns ``(Ĝ_A, fresh)`` where ``fresh`` says the result is a new buffer this function allocated
    (``False`` means it *is* ``grad_a`` and must not be written to)."""
    if grad_o is None:
        return grad_a, False
    if grad_a is None:
        return mix_vjp(grad_o, None, v, (True, False))[0], True    # (9) with G_A = 0: just (7)
    return _addmm(grad_a, grad_o, v.mH), True                      # (9), fused


def attn_backward(
    grad_o: Optional[Tensor],
    grad_a: Optional[Tensor],
    q: Optional[Tensor],
    k: Optional[Tensor],
    v: Optional[Tensor],
    a: Tensor,
    output_mask: Sequence[bool],
) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """Eqs. (9)-(13), the VJP of ``(o, a) = attn(q, k, v)`` in PyTorch's convention.

    ``grad_o`` / ``grad_a`` may be ``None`` (that output did not reach the loss).  ``output_mask`` is
    ``(needs grad q, needs grad k, needs grad v)``; only those gradients are computed, the others are
    ``None``, and the saved tensors a masked-out gradient does not need may be ``None`` too:
    ``q`` is needed only for ``grad_k``, ``k`` only for ``grad_q``, ``v`` only when ``grad_o`` feeds ``q``/``k``.

        Ĝ_A = G_O Vᴴ + G_A               (9)
        G_X = Ĝ_A ⊙ conj(1 − A²)         (10)
        G_Q = G_X K̄                      (11)
        G_K = G_Xᵀ Q̄                     (12)
        G_V = Aᴴ G_O                     (13)

    On CPU, when the n×n scratch of (9)-(10) would reach ``BLOCKED_FROM_BYTES``, the dtype is not float16 /
    bfloat16, and nothing can observe in-place writes, (9)-(12) run block by block of rows instead, eq. (31)
    (``_scores_grads_blocked``): the same block functions, the same result up to the order of (12)'s sum.

    Composed only of differentiable ops when grad mode is on, so this function is its own double backward.
    """
    need_q, need_k, need_v = output_mask[0], output_mask[1], output_mask[2]
    grad_q = grad_k = grad_v = None
    if need_v and grad_o is not None:
        _, grad_v = mix_vjp(grad_o, a, None, (False, True))         # (13)
    if (need_q or need_k) and (grad_o is not None or grad_a is not None):
        if _blocked_pays(a, grad_o, grad_a, q, k, v):
            grad_q, grad_k = _scores_grads_blocked(grad_o, grad_a, q, k, v, a, (need_q, need_k))   # (31)
        else:
            g_a, fresh = total_grad_a(grad_o, grad_a, v)            # (9)
            g_x = tanh_vjp(g_a, a, fresh)                           # (10)
            grad_q, grad_k = scores_vjp(g_x, q, k, (need_q, need_k))   # (11), (12)
    return grad_q, grad_k, grad_v


# --- the backward by blocks of rows, eq. (31) ----------------------------------------------------------------
# (9)-(12) are row-separable: rows R of Ĝ_A and G_X need rows R of G_O, G_A and A only, rows R of G_Q need rows R
# of G_X only, and G_K = Σ_R G_X[R]ᵀ Q̄[R] sums one term per block.  Run that way, the scratch is one block, not
# an n×n buffer (or (B, n, n) stack).
#
# Why from 32 MiB on, on CPU: with glibc a buffer of 32 MiB or more is above malloc's largest mmap threshold, so
# every backward maps it afresh and page-faults on each first write (12-25 ms for 32-64 MiB here, against
# 1.5-3 ms to refill one), while a 4 MiB block is recycled from the heap.  Smaller buffers are recycled from the
# heap too once the first one has been freed (the threshold rises to its size), so blocking them only adds
# per-block work.  Same-process A/Bs against the reference: in a fresh process 8 x 1024 0.71-0.73 -> 0.61-0.65
# and n=4096 0.71-0.72 -> 0.64-0.68; with malloc told to keep everything on the heap (``mallopt``: no page
# faults, the state a long process can reach) 0.979 -> 0.988 and 0.957 -> 0.970, while 32 x 256 cut into two
# blocks lost 3 %.  Not on other devices: CUDA's caching allocator already recycles the buffer, and smaller GEMMs
# would only add launches (not measured here: no GPU).
SCRATCH_BLOCK_BYTES = 4 << 20
BLOCKED_FROM_BYTES = 32 << 20


def _blocked_pays(a: Tensor, *tensors: Optional[Tensor]) -> bool:
    """Run (9)-(12) by blocks of rows (31): a CPU ``a`` of at least ``BLOCKED_FROM_BYTES`` (and more than one
    block) in a dtype of 4 bytes or more, and in-place writes unobservable (the blocked schedule fills the
    gradients in place, so it is for the plain backward only; with ``create_graph=True`` or under a transform
    the one-shot formulas run and stay differentiable).  float16 / bfloat16 (also autocast's outputs) keep
    the one-shot path: there (12)'s sum over blocks would be rounded to 8 or 11 bits at every partial sum,
    where one GEMM accumulates in float32 and rounds once."""
    nbytes = a.numel() * a.element_size()                 # first: the one test a small call needs
    return (nbytes >= BLOCKED_FROM_BYTES and nbytes > SCRATCH_BLOCK_BYTES and a.is_cpu and a.element_size() >= 4
            and _owns_scratch(a, *(t for t in tensors if t is not None)))


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


def _scores_grads_blocked(grad_o, grad_a, q, k, v, a, output_mask):
    """Eq. (31): ``(G_Q, G_K)`` of (9)-(12), one block of rows at a time, with the block functions of the
    one-shot path (``output_mask = (needs grad q, needs grad k)``; at least one of ``grad_o``, ``grad_a`` is
    given).  Only from ``attn_backward`` (CPU, nothing can observe in-place writes)."""
    grad_q = grad_k = None
    rows_of = lambda t, r: None if t is None else t[r]                     # noqa: E731
    for examples, rows in _row_blocks(a, SCRATCH_BLOCK_BYTES):
        r = (*examples, rows)
        g_a, fresh = total_grad_a(rows_of(grad_o, r), rows_of(grad_a, r), rows_of(v, examples))   # (9), rows R
        g_x = tanh_vjp(g_a, a[r], fresh)                                     # (10), rows R
        g_q, g_k = scores_vjp(g_x, rows_of(q, r), rows_of(k, examples), output_mask)
        if g_q is not None:                                                  # (11): rows R of G_Q
            if grad_q is None:
                grad_q = g_q.new_empty((*a.shape[:-1], g_q.shape[-1]))
            grad_q[r] = g_q
        if g_k is not None:                                                  # (12) as the sum (31)
            if grad_k is None:
                grad_k = g_k.new_zeros((*a.shape[:-2], a.shape[-1], g_k.shape[-1]))
            grad_k[examples].add_(g_k)
        del g_a, g_x, g_q, g_k          # free this block's scratch before the next one is allocated
    return grad_q, grad_k


def attn_jvp(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    q_dot: Optional[Tensor],
    k_dot: Optional[Tensor],
    v_dot: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """Eqs. (14)-(16), the JVP (pushforward) of ``(o, a)``; identical in every complex convention because the
    op is holomorphic.  A ``None`` tangent is a zero tangent; no zero tensor is built for it.

        Ẋ = Q̇ Kᵀ + Q K̇ᵀ                  (14)
        Ȧ = (1 − A²) ⊙ Ẋ                 (15)
        Ȯ = Ȧ V + A V̇                    (16)
    """
    x_dot = scores_jvp(q, k, q_dot, k_dot)                         # (14)
    if x_dot is None:
        # Only v has a tangent, so Ȧ = 0.  Function.jvp cannot return None for a differentiable output
        # (autograd asserts on it), so this is the one place a zero tensor is built.
        return mix_jvp(a, v, None, v_dot), torch.zeros_like(a)      # (16) with Ȧ = 0
    a_dot = tanh_jvp(x_dot, a, fresh=True)                          # (15); Ẋ is scratch from (14)
    return mix_jvp(a, v, a_dot, v_dot), a_dot                       # (16)
