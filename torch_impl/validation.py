"""The input contract (``attn_contract``) for torch tensors: one call before any compute, at every entry point.

``check_inputs`` is the lab's contract (q, k, v share n; a DTensor is checked on its global shape),
``check_block_inputs`` the block's (q has its own m rows).  Messages, order of checks and exception types are
``attn_contract``'s, shared with ``jax_impl.validation``.
"""

from __future__ import annotations

import torch

import attn_contract
from attn_contract import MESSAGES, message

__all__ = ["check_inputs", "check_block_inputs", "MESSAGES", "message", "FRAMEWORK"]

_ALLOWED = frozenset(getattr(torch, name) for name in attn_contract.DTYPES)   # a set lookup: on the hot path

FRAMEWORK = attn_contract.Framework(
    accepted="torch.Tensor",
    array_types=(torch.Tensor,),
    dtype_ok=_ALLOWED.__contains__,
    dtype_name=lambda dtype: str(dtype).removeprefix("torch."),
    device=lambda t: t.device,
)


def check_inputs(q, k, v) -> None:
    """The lab's contract: ``q (n, d)``, ``k (n, d)``, ``v (n, e)``; raises ``TypeError`` / ``ValueError``
    naming the argument (see ``attn_contract``)."""
    attn_contract.check(FRAMEWORK, q, k, v)


def check_block_inputs(q, k, v) -> None:
    """The block's contract: ``q (m, d)``, ``k (n, d)``, ``v (n, e)``."""
    attn_contract.check(FRAMEWORK, q, k, v, fn="attn_block", block=True)
