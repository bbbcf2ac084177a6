"""``AttnOutput``, the lab's result type: a leaf module (it imports nothing from ``jax_impl``), so that every entry
returning one (``core``, ``sharded``, ``kernels``) imports it without importing another entry, as
``torch_impl.output``.  ``jax_impl.AttnOutput`` and ``jax_impl.core.AttnOutput`` are this class."""

from __future__ import annotations

from typing import NamedTuple

from jax import Array

__all__ = ["AttnOutput"]


class AttnOutput(NamedTuple):
    """Result of the ``attn`` functions: ``o = tanh(q kᵀ) v`` of shape (n, e) and ``a = tanh(q kᵀ)`` of shape
    (n, n).  A NamedTuple is a pytree, so it passes through ``jit`` / ``vmap`` / ``grad`` and is the structure of
    the cotangent the ``custom_vjp`` bwd rule receives."""

    o: Array
    a: Array
