"""How two results are compared, and the per-dtype tolerances.

Metric (one number per compared array, e.g. "the gradient of q"):

    rel_err = ‖actual − expected‖_F / max(‖expected‖_F, NORM_FLOOR)          (norm-wise relative error)
    max_abs = max |actual − expected|                                         (reported, not judged)

A comparison passes when ``rel_err <= TOLERANCES[dtype]``.  ``NORM_FLOOR`` makes an exactly-zero expected
array (e.g. ∂/∂v when only ``a`` receives a cotangent) a comparison in absolute terms instead of 0/0.  A
missing gradient (``None``, torch's way of saying "zero") counts as zeros; a NaN/Inf on either side or a shape
mismatch gives ``rel_err = inf``, with a note saying which.

Tolerances are for the dtype being checked (both sides computed in it, or one side in float64/complex128, the
"ground truth").  Inputs are drawn so that ``|q kᵀ|`` is O(1) (tanh is neither saturated nor near its complex
poles ±iπ/2), so the problems are well conditioned and the observed errors sit near the unit roundoff:
float32/complex64 ≲ 1e-6 and float64/complex128 ≲ 1e-12 on the default shapes (n, d, e ≤ 8; most rows
1e-16 to 1e-14, the torch-vs-JAX rows up to ~3e-13 where a gradient's norm is small).  The tolerances
leave a margin of ~50-1000x for larger user-chosen shapes (errors grow roughly like √n·eps), while every
planted formula bug (missing conjugate, wrong transpose, ``1 − a`` for ``1 − a²``, a dropped ``G_A`` term)
produces relative errors of 1e-3 to 10 (measured on the default run), far above all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["DType", "DTYPES", "dtype", "TOLERANCES", "NORM_FLOOR", "Diff", "diff"]


@dataclass(frozen=True)
class DType:
    """A dtype crosscheck checks, parsed once: whether it is complex, its tolerance, and the dtype of its ground
    truth (float64 / complex128: a float32 / complex64 result is also compared with the same numbers computed in
    double precision; a double dtype is its own)."""

    name: str
    is_complex: bool
    tol: float
    truth: str

    @property
    def low_precision(self) -> bool:
        return self.truth != self.name


DTYPES = {d.name: d for d in (DType("float32", False, 1e-4, "float64"), DType("complex64", True, 1e-4, "complex128"),
                              DType("float64", False, 1e-10, "float64"),
                              DType("complex128", True, 1e-10, "complex128"))}
TOLERANCES = {name: d.tol for name, d in DTYPES.items()}


def dtype(name: str) -> DType:
    return DTYPES[name]


NORM_FLOOR = 1e-6


@dataclass(frozen=True)
class Diff:
    rel_err: float
    max_abs: float
    note: str = ""            # e.g. "shape (2, 5) but expected (5, 2)", "NaN in result"


def diff(actual: Optional[np.ndarray], expected: Optional[np.ndarray], symmetric: bool = False) -> Diff:
    """Compare two numpy arrays (``None`` = zeros of the other's shape).  ``symmetric``: divide by the larger of
    the two norms (neither side is a trusted reference, e.g. two user implementations compared)."""
    if actual is None:
        actual = np.zeros_like(expected)
    if expected is None:
        expected = np.zeros_like(actual)
    if actual.shape != expected.shape:
        return Diff(math.inf, math.inf, f"shape {tuple(actual.shape)} but expected {tuple(expected.shape)}")
    a = actual.astype(np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64)
    e = expected.astype(a.dtype)
    if a.size == 0:
        return Diff(0.0, 0.0)
    if not np.all(np.isfinite(a)):
        return Diff(math.inf, math.inf, "NaN/Inf in result")
    if not np.all(np.isfinite(e)):      # else the norms below would make the error NaN, which no tolerance rejects
        return Diff(math.inf, math.inf, "NaN/Inf in the expected result")
    d = a - e
    num = float(np.linalg.norm(d.ravel()))
    den = float(np.linalg.norm(e.ravel()))
    if symmetric:
        den = max(den, float(np.linalg.norm(a.ravel())))
    den = max(den, NORM_FLOOR)
    return Diff(num / den, float(np.max(np.abs(d))))
