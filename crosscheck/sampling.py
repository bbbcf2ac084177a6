"""How crosscheck draws its numbers: normal entries of a given standard deviation, the same for both frameworks and
the ground truth, and an op's inputs scaled so that tanh's argument stays where the dtype's tolerance holds
(``metrics.x_limit``; the derivation of the limit is in crosscheck/metrics.py)."""

from __future__ import annotations

from typing import Tuple

import numpy as np

from .metrics import dtype as dtype_info, x_limit

__all__ = ["Shape", "sample_like", "sample_inputs", "x_std", "qk_std", "scores"]

Shape = Tuple[int, int, int]                       # (n, d, e): the size of a draw (crosscheck.cases, specs)


def sample_like(rng: np.random.Generator, shape, dtype: str, std: float = 1.0) -> np.ndarray:
    """Normal entries with standard deviation ``std`` (complex: real and imaginary parts each ``std/√2``),
    drawn in float64 and rounded once to ``dtype``, so both frameworks and the ground truth see the same
    numbers."""
    if np.dtype(dtype).kind == "c":
        return ((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * (std / np.sqrt(2.0))).astype(dtype)
    return (rng.standard_normal(shape) * std).astype(dtype)


def sample_inputs(spec, rng: np.random.Generator, shape: Shape, dtype: str) -> Tuple[np.ndarray, ...]:
    """The inputs of op ``spec`` (a ``crosscheck.specs.OpSpec``, whose module imports this one), drawn with ``input_std`` and held to |tanh's argument| <= ``metrics.x_limit(dtype)``: a draw
    past it has the factors of x scaled down together so that max |x| is the limit (metrics: beyond it 1 − a²,
    formed from a rounded a, keeps fewer digits than the dtype's tolerance assumes)."""
    n, d, e = shape
    stds = spec.input_std(n, d, e, dtype_info(dtype).is_complex)
    inputs = tuple(sample_like(rng, s, dtype, std) for s, std in zip(spec.input_shapes(n, d, e), stds))
    if spec.tanh_argument is None:
        return inputs
    limit, peak = x_limit(dtype), float(np.max(np.abs(spec.tanh_argument(*inputs)), initial=0.0))
    if peak <= limit:
        return inputs
    scale = (limit / peak) ** (1.0 / len(spec.tanh_factors))
    return tuple((x * scale).astype(x.dtype) if i in spec.tanh_factors else x for i, x in enumerate(inputs))


# Target standard deviation of tanh's argument x: real 0.8 keeps 1 − a² well away from 0 (so a wrong factor
# there shows), complex 0.5 keeps x ~4σ away from tanh's poles ±iπ/2 (so the problem stays well conditioned).
def x_std(is_complex: bool) -> float:
    return 0.5 if is_complex else 0.8


def qk_std(d: int, is_complex: bool) -> float:
    # x_ij = Σ_l q_il k_jl has variance d·σ⁴, so σ = (x_std² / d)^(1/4)
    return (x_std(is_complex) ** 2 / max(d, 1)) ** 0.25


def scores(q: np.ndarray, k: np.ndarray, *_, causal: bool = False) -> np.ndarray:
    """x = q kᵀ (1) in double precision; causal: the entries the mask M of (37) keeps (j <= i)."""
    wide = np.complex128 if np.iscomplexobj(q) else np.float64
    x = q.astype(wide) @ k.astype(wide).T
    return np.tril(x) if causal else x
