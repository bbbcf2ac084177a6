"""Seeded random inputs written once for the torch.distributed tests (tests/sharded/test_distributed_torch.py,
tests/sharded/test_dtensor_second_order.py, tests/sharded/test_ring_second_order.py, tests/sharded/test_rank_losses.py): entries in U[-1, 1), drawn
in float64 from a ``torch.Generator``, real then imaginary part for a complex ``dtype`` (a real-valued complex input
would hide a missing conjugate).

They run in the test process and on the gloo ranks (tests/support/gloo.py) alike.  conftest's ``attn_inputs`` draws
square ``(n, ·)`` inputs with optional batch dimensions, ``requires_grad`` and device; :func:`block_inputs` gives
the block shapes q (m, d), k (n, d), v (n, e) with m ≠ n.
"""

from __future__ import annotations

import torch


def uniform(*shape, dtype, g):
    """A ``shape`` tensor of ``dtype`` in U[-1, 1) from generator ``g``: drawn in float64 (real, then imaginary part
    for a complex ``dtype``), then cast to ``dtype`` (no copy for float64 and complex128)."""
    draw = lambda: torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1  # noqa: E731
    return (torch.complex(draw(), draw()) if dtype.is_complex else draw()).to(dtype)


def block_inputs(m, n, d=3, e=2, dtype=torch.float64, seed=0):
    """``(q (m, d), k (n, d), v (n, e))`` of :func:`uniform`, in that order from one generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return uniform(m, d, dtype=dtype, g=g), uniform(n, d, dtype=dtype, g=g), uniform(n, e, dtype=dtype, g=g)
