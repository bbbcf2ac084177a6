"""Case generation: the shapes of a run, and for one (op, dtype, shape, trial) the inputs and every path a
gradient can take.

A case holds seeded random inputs and, per path: VJP requests (every non-empty subset of the inputs requiring
grad / differentiated, crossed with every cotangent mode: all outputs together, then each alone, the other
*unused*: ``None``); JVP tangents on every non-empty subset of the inputs (``None``: no tangent); for second order,
a cotangent on every output, a cotangent ``w`` on the gradients (VJP of the VJP) and a tangent on every input (HVP).
Every draw is keyed by the case itself, so ``--op attn --dtype float64`` draws the same numbers as the full run.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from .sampling import Shape, sample_inputs, sample_like
from .specs import OpSpec, Side

__all__ = ["Shape", "EDGE_SHAPES", "resolve_shapes", "modes", "subsets", "path_shapes", "Case", "Job"]

# 1×1 everything; n = 1; d = 1; d ≠ e; tall (n > d) and wide (n < d) q and k; a square n = d = e case.
EDGE_SHAPES: Tuple[Shape, ...] = ((1, 1, 1), (1, 3, 2), (4, 1, 3), (5, 2, 3), (2, 5, 4), (3, 3, 3))


def resolve_shapes(config) -> List[Shape]:
    """The fixed shapes, then ``random_shapes`` drawn from the ranges (seeded by ``config.seed``)."""
    rng = np.random.default_rng([config.seed, zlib.crc32(b"shapes")])
    ranges = (config.n_range, config.d_range, config.e_range)
    shapes = [tuple(int(x) for x in s) for s in config.shapes] + [
        tuple(int(rng.integers(lo, hi + 1)) for lo, hi in ranges) for _ in range(config.random_shapes)]
    return list(dict.fromkeys(shapes))                 # keep order, drop duplicates


def modes(names: Sequence[str]) -> List[Tuple[str, ...]]:
    """Cotangent modes: all names together, then each alone (if there is more than one)."""
    return [tuple(names)] + ([(n,) for n in names] if len(names) > 1 else [])


def subsets(names: Sequence[str]) -> List[Tuple[str, ...]]:
    """Every non-empty subset of ``names``: all of them first, then the singletons, pairs, ... (spec order)."""
    return [tuple(names)] + [c for r in range(1, len(names)) for c in itertools.combinations(names, r)]


def path_shapes(shapes: Sequence[Shape], k: int) -> List[Shape]:
    """The ``k`` shapes on which every path is checked: those with n, d, e >= 2 first (where no dimension is
    trivial), then the others, each group in run order."""
    return ([s for s in shapes if min(s) >= 2] + [s for s in shapes if min(s) < 2])[:k]


class Case:
    """One (op, dtype, shape, trial).  ``all_paths``: check every path (every subset of inputs requiring grad,
    tangents on every subset, second order); otherwise every input requires grad (each cotangent mode still
    leaves the other output unused), tangents go on all inputs together and on each alone, and no second
    order."""

    def __init__(self, spec: OpSpec, dtype: str, shape: Shape, trial: int, seed: int, all_paths: bool = True):
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode()), zlib.crc32(dtype.encode()), *shape, trial])
        self.shape = shape
        n, d, e = shape
        self.inputs = sample_inputs(spec, rng, shape, dtype)
        g = [sample_like(rng, s, dtype) for s in spec.output_shapes(n, d, e)]
        t = [sample_like(rng, s, dtype) for s in spec.input_shapes(n, d, e)]
        w = [sample_like(rng, s, dtype) for s in spec.input_shapes(n, d, e)]     # drawn last: earlier draws kept
        self.cot_modes = modes(spec.outputs)
        self.cots = [tuple(gi if name in m else None for gi, name in zip(g, spec.outputs)) for m in self.cot_modes]
        self.all_paths = all_paths
        # VJP requests: (inputs differentiated, index of the cotangent mode); all inputs first, mode by mode
        self.vjp_requests = [(wrt, m) for wrt in (subsets(spec.inputs) if all_paths else [tuple(spec.inputs)])
                             for m in range(len(self.cot_modes))]
        self.tan_modes = subsets(spec.inputs) if all_paths else modes(spec.inputs)
        self.tans = [tuple(ti if name in m else None for ti, name in zip(t, spec.inputs)) for m in self.tan_modes]
        # second order: cotangent on every output, w on the gradients, tangent on every input
        self.second = (tuple(g), tuple(w), tuple(t))

    def request_masks(self, spec: OpSpec):
        """``[(wrt mask, cotangent mode index)]`` in ``vjp_requests`` order (``Side.vjp`` gets the mask and
        ``self.cots[index]``)."""
        return [(tuple(name in wrt for name in spec.inputs), m) for wrt, m in self.vjp_requests]


@dataclass(frozen=True, eq=False)
class Job:
    """What a framework's executor runs: one side (the functions under test and the reference) on one case."""

    side: Side
    spec: OpSpec
    case: Case
    dtype: str
    do_jacrev: bool                                # the materialised-Jacobian oracle too (small enough)
