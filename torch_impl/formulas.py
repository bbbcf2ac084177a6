"""The math of tanh attention, once, as pure torch functions.

This module is the analogue of PyTorch's ``FunctionsManual.cpp``: one function per formula, referenced by name
from every torch entry point (``AttnFunction`` and the ``attn_lab`` operators).  Equation numbers are those of
``derivation.md``.

    X = Q Kᵀ            (1)        Q: (n, d)   K: (n, d)   X: (n, n)
    A = tanh X          (2)
    O = A V             (3)        V: (n, e)   O: (n, e)

Gradients follow PyTorch's complex convention (conjugate Wirtinger): for real dtypes every ``conj`` below is
a no-op, and for complex dtypes ``.conj()`` / ``.mH`` only set the lazy conjugate bit, which the matmul
kernels consume without a copy.

No function here validates its inputs (see ``torch_impl.validation``), and none modifies a tensor it was
given, except ``tanh_vjp`` with ``inplace=True``, which the whole-op functions pass only for a buffer they
just allocated.  Every function also accepts a stack of examples (3-D tensors ``(B, n, ·)``, what the vmap rules
pass): ``@``, ``.mT`` / ``.mH`` and ``tanh_backward`` broadcast over the leading dimension and the fused
``addmm`` becomes ``baddbmm`` (``_addmm``).  Two writes are in place, both into a buffer the function itself
just allocated: ``tanh_`` on the scores ``x`` in the forward (always: nothing else holds ``x``), and (10)
into the buffer of (9) when the caller passes ``inplace=True`` (``torch_impl.performance`` decides when that
is unobservable; how the backward is scheduled to allocate less lives there too).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    "attn_forward", "attn_backward", "attn_jvp", "scores_grads", "total_grad_a",
    "scores_vjp", "tanh_vjp", "mix_vjp", "scores_jvp", "tanh_jvp", "mix_jvp",
]

_tanh_backward = torch.ops.aten.tanh_backward.default          # ATen's fused g ⊙ conj(1 − y²)
_tanh_backward_out = torch.ops.aten.tanh_backward.grad_input     # the same, written into ``grad_input``


def _addmm(c: Tensor, m1: Tensor, m2: Tensor) -> Tensor:
    """``c + m1 @ m2`` as one fused GEMM that writes a fresh buffer: ``addmm`` for matrices, ``baddbmm`` for
    stacks of them (the vmap rules run these formulas on 3-D tensors)."""
    return torch.addmm(c, m1, m2) if m1.dim() == 2 else torch.baddbmm(c, m1, m2)


def attn_forward(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """Eqs. (1)-(3): ``o = tanh(q kᵀ) v``; returns ``(o, a)``.

    ``tanh`` is applied in place to the freshly allocated scores ``x`` (nothing else holds them, and autograd,
    forward AD and vmap all support an in-place ``tanh_`` there), so the forward allocates one n×n buffer
    (``a``), not two; ``x`` is never kept."""
    x = q @ k.mT                                                    # (1)
    a = x.tanh_()                                                   # (2)
    o = a @ v                                                       # (3)
    return o, a


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


def tanh_vjp(grad_a: Tensor, a: Tensor, inplace: bool = False) -> Tensor:
    """VJP of ``a = tanh x`` (2) from the saved output ``a`` (tanh is not recomputed): eq. (6), used as (10).

        G_X = G_A ⊙ conj(1 − A²)        (6)

    ATen's fused ``tanh_backward`` kernel applies the conjugate for complex dtypes.  ``inplace=True``
    (``grad_a`` is the caller's own scratch buffer and nothing can observe the write) overwrites ``grad_a``
    with the result, so the whole backward allocates one n×n buffer, not two."""
    return _tanh_backward_out(grad_a, a, grad_input=grad_a) if inplace else _tanh_backward(grad_a, a)


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


def tanh_jvp(x_dot: Tensor, a: Tensor) -> Tensor:
    """JVP of ``a = tanh x``: eq. (15) (no conjugate: a JVP is convention-free).

        Ȧ = (1 − A²) ⊙ Ẋ        (15)

    Since ``tanh_backward(g, y) = g ⊙ conj(1 − y²)``, passing ``y = Ā`` gives exactly (15) with the fused
    kernel (for real dtypes ``conj`` is a no-op)."""
    return tanh_vjp(x_dot, a.conj())


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
    inplace: bool = False,
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

    ``inplace=True`` lets (10) overwrite the buffer (9) allocated (see ``tanh_vjp``); pass it only when
    nothing can observe that write (``torch_impl.performance`` decides).  Composed only of differentiable
    ops otherwise, so with grad mode on this function is its own double backward.
    """
    grad_v = None
    if output_mask[2] and grad_o is not None:
        _, grad_v = mix_vjp(grad_o, a, None, (False, True))         # (13)
    grad_q, grad_k = scores_grads(grad_o, grad_a, q, k, v, a, output_mask[:2], inplace)   # (9)-(12)
    return grad_q, grad_k, grad_v


def scores_grads(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                 v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool],
                 inplace: bool = False) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Eqs. (9)-(12): ``(G_Q, G_K)``, the part of the VJP that goes through the scores.  ``output_mask =
    (needs grad q, needs grad k)``.  Row-separable, which ``torch_impl.performance`` uses (eq. (31))."""
    if not (output_mask[0] or output_mask[1]) or (grad_o is None and grad_a is None):
        return None, None
    g_a, fresh = total_grad_a(grad_o, grad_a, v)                    # (9)
    g_x = tanh_vjp(g_a, a, inplace and fresh)                       # (10)
    return scores_vjp(g_x, q, k, output_mask)                       # (11), (12)


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
    a_dot = tanh_jvp(x_dot, a)                                      # (15)
    return mix_jvp(a, v, a_dot, v_dot), a_dot                       # (16)
