"""``AttnOutput``, the lab's result type: a leaf module (it imports nothing from ``torch_impl``), so that every
entry returning one (``function``, ``sharded.rules``, ``sharded.ring``) imports it without importing another entry.
``torch_impl.AttnOutput`` and ``torch_impl.function.AttnOutput`` are this class."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["AttnOutput"]


class AttnOutput(NamedTuple):
    """Result of :func:`torch_impl.attn`: ``o = tanh(q kᵀ) v`` of shape (n, e) and ``a = tanh(q kᵀ)`` of shape
    (n, n)."""

    o: Tensor
    a: Tensor
