"""The math of tanh attention, once, as pure torch functions: the analogue of PyTorch's ``FunctionsManual.cpp``.

One function per formula, each citing its equation in ``derivation.md``; ``jax_impl.formulas`` has the same
functions under the same names (in JAX's convention).  Nothing here validates inputs (``torch_impl.validation``),
decides where results are written or in what order (``torch_impl.performance``), or modifies a tensor it was
given; the one concession to memory is ``tanh_vjp``'s ``out=``, the standard torch spelling of "write the result
there", which ``performance`` passes with a buffer it owns.

    X = Q Kᵀ            (1)        Q: (m, d)   K: (n, d)   X: (m, n)
    A = tanh X          (2)
    O = A V             (3)        V: (n, e)   O: (m, e)

The lab fixes m = n; the math does not, and the sharded blocks (32)-(36) use these functions with m ≠ n.  Every
function also takes stacks (B, ·, ·), what the vmap rules pass: ``@``, ``.mT`` / ``.mH`` and ``tanh_backward``
broadcast over leading dimensions.

Gradients follow PyTorch's complex convention (conjugate Wirtinger): for real dtypes every ``conj`` is a no-op,
and for complex dtypes ``.conj()`` / ``.mH`` only set the lazy conjugate bit, which the matmul kernels consume.
A gradient or tangent may be ``None``: a zero that is never built (an output that did not reach the loss, an
input without a tangent).  ``output_mask`` says which gradients are wanted; the others are ``None`` and not
computed, and the saved tensor only a masked-out gradient reads may be ``None`` too.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    "attn_forward", "attn_backward", "attn_jvp", "total_grad_a",
    "scores_vjp", "tanh_vjp", "mix_vjp", "scores_jvp", "tanh_jvp", "mix_jvp",
]

_tanh_backward = torch.ops.aten.tanh_backward.default         # ATen's g ⊙ conj(1 − y²), as derivatives.yaml uses
_tanh_backward_out = torch.ops.aten.tanh_backward.grad_input    # the same, written into ``grad_input``


# --- the whole op ---------------------------------------------------------------------------------------------

def attn_forward(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """Eqs. (1)-(3): returns ``(o, a)``; ``x = q kᵀ`` is not kept."""
    a = torch.tanh(q @ k.mT)                                        # (1), (2)
    return a @ v, a                                                 # (3)


def attn_backward(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                  v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool] = (True, True, True),
                  ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """Eqs. (9)-(13), the VJP of ``(o, a) = attn(q, k, v)`` from the saved output ``a``.

        Ĝ_A = G_O Vᴴ + G_A               (9)
        G_X = Ĝ_A ⊙ conj(1 − A²)         (10)
        G_Q = G_X K̄                      (11)
        G_K = G_Xᵀ Q̄                     (12)
        G_V = Aᴴ G_O                     (13)

    ``output_mask = (q, k, v)``: which gradients to compute.  ``q`` is read only for G_K, ``k`` only for G_Q,
    ``v`` only when G_O reaches q or k.  Made of differentiable ops, so with grad mode on it is its own double
    backward (23)-(27)."""
    want_q, want_k, want_v = output_mask
    grad_v = mix_vjp(grad_o, a, None, (False, True))[1] if want_v and grad_o is not None else None   # (13)
    g_a = total_grad_a(grad_o, grad_a, v) if want_q or want_k else None                              # (9)
    if g_a is None:
        return None, None, grad_v
    g_x = tanh_vjp(g_a, a)                                                                           # (10)
    return (*scores_vjp(g_x, q, k, (want_q, want_k)), grad_v)                                        # (11), (12)


def attn_jvp(q: Tensor, k: Tensor, v: Tensor, a: Tensor, q_dot: Optional[Tensor], k_dot: Optional[Tensor],
             v_dot: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Eqs. (14)-(16), the JVP of ``(o, a)``; the same in every complex convention (the op is holomorphic).

        Ẋ = Q̇ Kᵀ + Q K̇ᵀ                  (14)
        Ȧ = (1 − A²) ⊙ Ẋ                 (15)
        Ȯ = Ȧ V + A V̇                    (16)

    Some tangent is given (autograd calls a JVP rule only then).  Both tangents are returned as tensors (a JVP
    rule must give one per output): with no tangent on q and k, Ȧ = 0 is the one zero tensor built."""
    x_dot = scores_jvp(q, k, q_dot, k_dot)                                                           # (14)
    a_dot = None if x_dot is None else tanh_jvp(x_dot, a)                                            # (15)
    o_dot = mix_jvp(a, v, a_dot, v_dot)                                                              # (16)
    return o_dot, torch.zeros_like(a) if a_dot is None else a_dot


def total_grad_a(grad_o: Optional[Tensor], grad_a: Optional[Tensor], v: Optional[Tensor]) -> Optional[Tensor]:
    """Eq. (9): the total gradient reaching ``a``, ``Ĝ_A = G_O Vᴴ + G_A``.  ``a`` is used twice (returned, and
    multiplied by ``v``), so by the chain rule the two contributions add.  ``None`` when both are absent."""
    return _sum(None if grad_o is None else mix_vjp(grad_o, None, v, (True, False))[0],   # (7)
                grad_a)


# --- the three building blocks (1), (2), (3): VJP and JVP of each ----------------------------------------------

def scores_vjp(grad_x: Tensor, q: Optional[Tensor], k: Optional[Tensor],
               output_mask: Sequence[bool] = (True, True)) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """VJP of ``x = q kᵀ`` (1): eqs. (4)-(5), used as (11)-(12).  ``output_mask = (q, k)``.

        G_Q = G_X K̄        (4)       G_K = G_Xᵀ Q̄        (5)
    """
    grad_q = grad_x @ k.conj() if output_mask[0] else None          # (4)
    grad_k = grad_x.mT @ q.conj() if output_mask[1] else None       # (5)
    return grad_q, grad_k


def tanh_vjp(grad_a: Tensor, a: Tensor, *, out: Optional[Tensor] = None) -> Tensor:
    """VJP of ``a = tanh x`` (2) from the saved output (tanh is not recomputed): eq. (6), used as (10).

        G_X = G_A ⊙ conj(1 − A²)        (6)

    ``out``: the tensor to write the result into (it may be ``grad_a`` itself)."""
    return _tanh_backward(grad_a, a) if out is None else _tanh_backward_out(grad_a, a, grad_input=out)


def mix_vjp(grad_o: Tensor, a: Optional[Tensor], v: Optional[Tensor],
            output_mask: Sequence[bool] = (True, True)) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """VJP of ``o = a v`` (3): eqs. (7)-(8).  ``output_mask = (a, v)``.

        G_A = G_O Vᴴ        (7)       G_V = Aᴴ G_O        (8)
    """
    grad_a = grad_o @ v.mH if output_mask[0] else None              # (7)
    grad_v = a.mH @ grad_o if output_mask[1] else None              # (8)
    return grad_a, grad_v


def scores_jvp(q: Tensor, k: Tensor, q_dot: Optional[Tensor], k_dot: Optional[Tensor]) -> Optional[Tensor]:
    """JVP of ``x = q kᵀ``: eq. (14).  ``None`` when both tangents are.

        Ẋ = Q̇ Kᵀ + Q K̇ᵀ        (14)
    """
    return _sum(None if q_dot is None else q_dot @ k.mT,           # (14), first term
                None if k_dot is None else q @ k_dot.mT)           # (14), second term


def tanh_jvp(x_dot: Tensor, a: Tensor) -> Tensor:
    """JVP of ``a = tanh x``: eq. (15), no conjugate (a JVP is convention-free).

        Ȧ = (1 − A²) ⊙ Ẋ        (15)

    ``tanh_backward(g, y) = g ⊙ conj(1 − y²)``, so ``y = Ā`` gives exactly (15) with the fused kernel."""
    return tanh_vjp(x_dot, a.conj())


def mix_jvp(a: Tensor, v: Tensor, a_dot: Optional[Tensor], v_dot: Optional[Tensor]) -> Optional[Tensor]:
    """JVP of ``o = a v``: eq. (16).  ``None`` when both tangents are.

        Ȯ = Ȧ V + A V̇        (16)
    """
    return _sum(None if a_dot is None else a_dot @ v,              # (16), first term
                None if v_dot is None else a @ v_dot)              # (16), second term


def _sum(first: Optional[Tensor], second: Optional[Tensor]) -> Optional[Tensor]:
    """``first + second`` where ``None`` is a zero that is never built; ``None`` when both are."""
    return second if first is None else first if second is None else first + second
