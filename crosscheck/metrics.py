"""How two results are compared, and the per-dtype tolerances.

Metric (one number per compared array, e.g. "the gradient of q"):

    rel_err = ‖actual − expected‖_F / max(‖expected‖_F, NORM_FLOOR)          (norm-wise relative error)
    max_abs = max |actual − expected|                                         (reported, not judged)

A comparison passes when ``rel_err <= TOLERANCES[dtype]``.  ``NORM_FLOOR`` makes an exactly-zero expected
array (e.g. ∂/∂v when only ``a`` receives a cotangent) a comparison in absolute terms instead of 0/0.  A
missing gradient (``None``, torch's way of saying "zero") counts as zeros; a NaN/Inf on either side or a shape
mismatch gives ``rel_err = inf``, with a note saying which.

Tolerances are for the dtype being checked (both sides computed in it, or one side in float64/complex128, the
"ground truth").  What a correct implementation's rel err can be is roundoff, bounded by the standard error
model (each operation's result exact to a few units u of the last place, u = 2⁻²⁴ for float32/complex64, 2⁻⁵³
for float64/complex128; it holds on every x86-64 CPU, whatever order its kernels sum in or how they vectorise):

    rel_err ≲ u · (4·k·κ  +  (2·c_t + 1)·sinh²(x_max))

* ``4·k·κ``, the matrix products: a product with inner size k has |fl(AB) − AB| ≤ k·u·|A||B| entrywise, so a
  norm-wise relative error ≤ k·u·κ with κ = ‖|A||B|‖_F / ‖AB‖_F ≥ 1 (the cancellation in its sums).  The
  longest chain, G_Q = ((G_O Vᴴ + G_A) ⊙ (1 − a²)) K after x = q kᵀ, has four products; k ≤ 2·8 on the default
  shapes (n, d, e ≤ 8; a JVP of x sums 2d terms).
* ``(2·c_t + 1)·sinh²(x_max)``, the tanh factor: a = tanh(x) is rounded to c_t·u relatively (measured: torch
  (SLEEF) c_t = 1.0 and numpy 1.8 in float32 over |x| ≤ 8; XLA's approximation 4.9 in float32, every float in
  [0.25, 8), and 5.1 in float64 over |x| ≤ 5.6, 16M samples (6.2 near |x| = 7.9, past the float64 limit below);
  ``C_TANH`` = 6 bounds them within the limits), and 1 − a² computed from it loses
  2·a²/(1 − a²) = 2·sinh²(x) of that, plus the rounding of a² (u·sinh²x): a relative error of
  (2·c_t + 1)·u·sinh²(x) in 1 − a², largest at the largest |x| (for complex x, |sinh x|² ≤ sinh²|x|; the truth,
  in double precision, has the same factor at u = 2⁻⁵³).  This term is the algorithm's (save a, form 1 − a² from
  it), not a bug: the problem itself is well conditioned (|d log(1 − tanh²x) / d log x| = 2|x·a|).

Measured on draws not yet held to ``x_limit`` (below; 20 seeds × the default run's rows on an AMD EPYC with
AVX-512; seeds 0-5 also with torch's non-vectorised kernels, ATEN_CPU_CAPABILITY=default, and MKL's AVX2 path):
float32 worst 6.8e-5, 7.5e-5 with the other kernels (seed 3: a 1×1 case with |x| = 3.9, sinh² = 626:
2.0·u·sinh²; the limit scales that case to |x| = 2.44), float64 3.0e-13 (seed 0:
the torch-vs-JAX rows of a gradient whose norm is small, κ ≈ 40), complex128 4.5e-15, complex64 2.6e-6.  On
the default run (seed 0: |x| ≤ 2.34, sinh² = 26.5) the model gives float32 ≤ 4e-5 (13·u·26.5 = 2.1e-5
plus 4·16·u·κ = 1.5e-5 for κ ≤ 4; measured 7.4e-7 here, 1.0e-6 on another CPU) and float64/complex128 ≤ 1e-12 (the
measured 3.0e-13 with a margin of 3; the κ of the torch-vs-JAX rows is measured, not bounded):
``DEFAULT_RUN_BOUNDS``, which --help states and tests/crosscheck/test_run.py checks.

The tolerances sit above those, and the inputs are drawn to keep them there: |q kᵀ| has standard deviation
0.8 (complex 0.5), and a case that draws a tanh argument past ``x_limit(dtype)`` is scaled down to it
(``sampling.sample_inputs``: q and k by √(limit / max|x|), the tanh block's x by limit / max|x|).  The limit keeps
two sides' tanh terms, 2·(2·C_TANH + 1)·u·sinh²x, within half the tolerance (the other half is the products'):
|x| ≤ 2.44 for float32/complex64 (1e-4), 5.57 for float64/complex128 (1e-10).  Unscaled, seed 840's float32
attn 1×1 case draws |x| = 6.8 (sinh² = 2e5) and a correct implementation fails: the JAX hand JVP is 3.2e-2
off the float64 truth (torch's 9.1e-3); that case draws |x| > 4.2 in 11 of 12,000 draws (seeds 0-5999, 2
trials).  A per-case tolerance instead would have to be wide enough for the worst entry yet stay tight for
the whole gradient; the limit keeps one tolerance per dtype, as informative on every case.  Seed 0's default
run draws no |x| past the limits (with --kernels, six float32 cases of the o-only ops are scaled).
float64/complex128 1e-10 is 300x above the 20-seed worst.  Every planted formula bug (missing conjugate, wrong
transpose, ``1 − a`` for ``1 − a²``, a dropped ``G_A`` term) gives 1e-3 to 10 (measured on the default run),
far above all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["DType", "DTYPES", "dtype", "TOLERANCES", "DEFAULT_RUN_BOUNDS", "C_TANH", "x_limit", "NORM_FLOOR",
           "Diff", "diff"]


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

    @property
    def u(self) -> float:
        """The unit roundoff: 2⁻²⁴ (float32 / complex64), 2⁻⁵³ (float64 / complex128)."""
        return 2.0 ** -24 if self.low_precision else 2.0 ** -53


DTYPES = {d.name: d for d in (DType("float32", False, 1e-4, "float64"), DType("complex64", True, 1e-4, "complex128"),
                              DType("float64", False, 1e-10, "float64"),
                              DType("complex128", True, 1e-10, "complex128"))}
TOLERANCES = {name: d.tol for name, d in DTYPES.items()}
# What the error model above gives the default run (seed 0) per dtype: --help states them, and
# tests/crosscheck/test_run.py checks every row of the default run against them (not the tolerances: advice on how
# close to roundoff a run is).  float32 from the model; float64 / complex128 the measured worst with a margin of 3.
DEFAULT_RUN_BOUNDS = {"float32": 4e-5, "float64": 1e-12, "complex128": 1e-12}


def dtype(name: str) -> DType:
    return DTYPES[name]


C_TANH = 6.0     # tanh's relative error in units u within x_limit, at most (measured above: XLA's 4.9 / 5.1)


def x_limit(name: str) -> float:
    """The largest |x| crosscheck gives tanh in dtype ``name`` (see above): two sides' tanh terms,
    2·(2·C_TANH + 1)·u·sinh²x, within half the dtype's tolerance."""
    d = dtype(name)
    return math.asinh(math.sqrt(d.tol / 2 / (2 * (2 * C_TANH + 1) * d.u)))


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
