"""The input contract (``attn_contract``) for torch tensors: one call before any compute, at every entry point.

``check_inputs`` is the lab's contract (q, k, v share n; a DTensor is checked on its global shape),
``check_block_inputs`` the block's (q has its own m rows), ``check_block_backward_inputs`` the block's backward
operator's, and ``defined_grads`` which gradients that operator returns (read by the operator and by its
DTensor sharding rule, ``torch_impl.sharded``).  Messages, order of checks and exception types are
``attn_contract``'s, shared with ``jax_impl.validation``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

import attn_contract
from attn_contract import MESSAGES, message

__all__ = ["check_inputs", "check_block_inputs", "check_block_backward_inputs", "defined_grads", "refuse_nested",
           "MESSAGES", "message", "FRAMEWORK"]

_ALLOWED = frozenset(getattr(torch, name) for name in attn_contract.DTYPES)   # a set lookup: on the hot path

FRAMEWORK = attn_contract.Framework(
    accepted="torch.Tensor",
    array_types=(torch.Tensor,),
    dtype_ok=_ALLOWED.__contains__,
    dtype_name=lambda dtype: str(dtype).removeprefix("torch."),
    device=lambda t: t.device,
)


def refuse_nested(fn: str, q, k, v) -> None:
    """A nested tensor (``torch.nested``, either layout) has ``ndim`` but no sizes (reading ``shape`` raises
    "NestedTensorImpl doesn't support sizes" or an indeterminate symbolic relation), so it cannot go through
    ``attn_contract.check``: ``TypeError`` naming the argument, before any other check reads its shape."""
    for name, t in zip(attn_contract.NAMES, (q, k, v)):
        if isinstance(t, torch.Tensor) and t.is_nested:
            layout = "jagged" if t.layout == torch.jagged else "strided"
            raise TypeError(message("nested", fn, name=name, layout=layout))


def check_inputs(q, k, v) -> None:
    """The lab's contract: ``q (n, d)``, ``k (n, d)``, ``v (n, e)``; raises ``TypeError`` / ``ValueError``
    naming the argument (see ``attn_contract``)."""
    refuse_nested("attn", q, k, v)
    attn_contract.check(FRAMEWORK, q, k, v)


def check_block_inputs(q, k, v) -> None:
    """The block's contract: ``q (m, d)``, ``k (n, d)``, ``v (n, e)``."""
    refuse_nested("attn_block", q, k, v)
    attn_contract.check(FRAMEWORK, q, k, v, fn="attn_block", block=True)


def check_block_backward_inputs(q, k, v, a, grad_o, grad_a) -> None:
    """The block contract for q, k, v, then ``a (m, n)``, ``grad_o (m, e)``, ``grad_a (m, n)`` (each may be None
    but ``a``), all of q's dtype: ``ValueError`` / ``TypeError`` naming the argument, before any compute."""
    check_block_inputs(q, k, v)
    m, n, e = q.shape[0], k.shape[0], v.shape[1]
    for name, t, shape in (("a", a, (m, n)), ("grad_o", grad_o, (m, e)), ("grad_a", grad_a, (m, n))):
        if t is None:
            if name == "a":
                raise TypeError("attn_block_backward(): argument 'a' must be a torch.Tensor, got NoneType")
            continue
        if tuple(t.shape) != shape:
            raise ValueError(f"attn_block_backward(): argument '{name}' must have shape {shape} (q is (m, d), "
                             f"k is (n, d), v is (n, e)), got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"attn_block_backward(): argument '{name}' must have q's dtype "
                            f"{str(q.dtype).removeprefix('torch.')}, got {str(t.dtype).removeprefix('torch.')}")


def defined_grads(grad_o: Optional[torch.Tensor], grad_a: Optional[torch.Tensor], output_mask: Sequence[bool]):
    """Which of (grad_q, grad_k, grad_v) the block's backward returns: a gradient is None when it is masked out or
    when no output gradient reaches it (as ``formulas.attn_backward``: G_V needs G_O (13); G_Q, G_K need either
    (9))."""
    reaches_qk = grad_o is not None or grad_a is not None
    return (bool(output_mask[0]) and reaches_qk, bool(output_mask[1]) and reaches_qk,
            bool(output_mask[2]) and grad_o is not None)
