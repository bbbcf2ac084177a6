"""The input contract (``attn_contract``) for JAX and numpy arrays: one call before any compute, at trace time.

``check_inputs`` is the lab's contract (q, k, v share n; checked on global shapes, i.e. outside ``shard_map``),
``check_block_inputs`` the block's (q has its own m rows: local shards inside ``shard_map``).  Messages, order
of checks and exception types are ``attn_contract``'s, shared with ``torch_impl.validation``.  Shapes and dtypes
are static in JAX, so the checks also run under ``jit`` (on tracers) and ``vmap`` (per-example shapes).

Not checked, unlike torch: devices.  A tracer has no device, numpy arrays have none, and placement of concrete
arrays is JAX's own business (JAX itself raises for arrays committed to different devices).  Python lists and
scalars and numpy scalars are rejected with the "type" message, like non-tensors on the torch side.
"""

from __future__ import annotations

import jax
import numpy as np

import attn_contract
from attn_contract import MESSAGES, message

__all__ = ["check_inputs", "check_block_inputs", "MESSAGES", "message", "FRAMEWORK"]


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name                                    # "float32", "bfloat16", "int64", "bool", ...


FRAMEWORK = attn_contract.Framework(
    accepted="jax.Array or numpy.ndarray",
    array_types=(jax.Array, np.ndarray),
    dtype_ok=lambda dtype: _dtype_name(dtype) in attn_contract.DTYPES,
    dtype_name=_dtype_name,
)


def check_inputs(q, k, v) -> None:
    """The lab's contract: ``q (n, d)``, ``k (n, d)``, ``v (n, e)``; raises ``TypeError`` / ``ValueError``
    naming the argument (see ``attn_contract``)."""
    attn_contract.check(FRAMEWORK, q, k, v)


def check_block_inputs(q, k, v) -> None:
    """The block's contract: ``q (m, d)``, ``k (n, d)``, ``v (n, e)``."""
    attn_contract.check(FRAMEWORK, q, k, v, fn="attn_block", block=True)
