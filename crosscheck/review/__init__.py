"""The review of a user's implementation against what the lab asks of it, beyond right numbers: findings with
their evidence, reported apart from the correctness verdict (advice; ``--strict`` makes them fail the run).

``common``: what both frameworks' reviews share; ``torch``: ``torch.profiler``, ``saved_tensors_hooks``,
``Node.register_hook``; ``jax``: the pullback's jaxpr.  What each item looks for, and how: docs/crosscheck.md,
"The review".  An item that cannot run on this version is listed as unavailable, never guessed.
"""

from __future__ import annotations

from typing import Callable

from .. import drivers
from ..errors import first_line
from .common import BAD_INPUTS, KEYS, SHAPE, Finding, Review, Unavailable

__all__ = ["Finding", "Review", "review", "SHAPE", "BAD_INPUTS", "KEYS"]


def review(framework: str, fn: Callable, impl: str, dtype: str = "float64") -> Review:
    """Review ``fn`` (attn(q, k, v) -> (o, a)) of ``framework`` on CPU inputs of ``dtype`` (a real dtype it
    accepts); never raises for a problem of ``fn``."""
    result = Review(framework, impl)
    for name, item in drivers.get(framework).review_items():
        try:
            result.findings += item(fn, dtype)
        except Unavailable as e:
            result.unavailable.append(f"{name}: {e}")
        except Exception as e:                     # noqa: BLE001 - the correctness rows report a crash
            result.unavailable.append(f"{name}: could not run ({first_line(e)})")
    return result
