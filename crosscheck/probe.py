"""Before any work, on a user's implementation: which dtypes its forward accepts, and whether it handles complex
inputs right.

The lab's contract is real (float32, float64): complex support is *probed* apart, without failing a real-only
solution.  A dtype asked for that the forward rejects is a usage error named before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from .errors import ImplError, first_line
from .frameworks import eq17, get

__all__ = ["ComplexSupport", "check_dtypes", "probe_complex", "PROBE_SHAPE", "COMPLEX_DTYPE"]

PROBE_SHAPE = (3, 2, 4)                            # n, d, e
COMPLEX_DTYPE = "complex128"
_TOL = 1e-9


@dataclass(frozen=True)
class ComplexSupport:
    status: str                                    # "right", "unsupported", "wrong"
    detail: str = ""

    def line(self, fw: str, impl: str) -> str:
        head = {"right": "supported and right", "unsupported": "not supported",
                "wrong": "supported but WRONG"}[self.status]
        tail = ("" if self.status == "right" else
                " (not part of the lab's contract: the verdict does not count it; check it with --dtype complex128)")
        return f"complex ({fw}, {impl}): {head}{': ' + self.detail if self.detail else ''}{tail}"


def _inputs(dtype: str):
    """q, k, v at ``PROBE_SHAPE``, drawn as the correctness checks draw them (``sampling.sample_inputs``), seed 0."""
    from .sampling import sample_inputs
    from .specs import SPECS
    return list(sample_inputs(SPECS["attn"], np.random.default_rng(0), PROBE_SHAPE, dtype))


def _forward(fw: str, fn: Callable, arrays):
    from .parts import outputs
    ops = get(fw).ops
    with ops.context("cpu"):
        return outputs(fn(*(ops.to_native(x, "cpu") for x in arrays)))


def check_dtypes(fw: str, fn: Callable, source: str, dtypes: Sequence[str]) -> None:
    """Raise :class:`ImplError` naming every dtype of ``dtypes`` whose forward raises, and the ones that work."""
    failing: Dict[str, str] = {}
    for dtype in dtypes:
        try:
            _forward(fw, fn, _inputs(dtype))
        except Exception as exc:                   # noqa: BLE001 - any failure of user code is named
            failing[dtype] = first_line(exc)
    if not failing:
        return
    if len(failing) == len(dtypes):                # a torch implementation given to --jax-impl, or vice versa?
        from .impls import wrong_framework
        hint = wrong_framework(fw, fn, source, _inputs("float64"))
        if hint:
            raise ImplError(hint)
    fine = [d for d in dtypes if d not in failing]
    advice = (f"check only the dtypes it supports: --dtype {','.join(fine)}" if fine else
              "its forward raises on every dtype asked for")
    raise ImplError(f"{source} raises on " + "; ".join(f"{d} inputs ({e})" for d, e in failing.items())
                    + f". Nothing was checked; {advice} (the lab asks for float32 and float64; complex is optional)")


def probe_complex(fw: str, fn: Callable, reference: Callable) -> ComplexSupport:
    """Run the forward and one VJP (every input differentiated, a cotangent on each output) in complex128 and
    compare them with autodiff of the reference."""
    arrays = _inputs(COMPLEX_DTYPE)
    try:
        outs = _forward(fw, fn, arrays)
    except Exception as exc:                       # noqa: BLE001
        return ComplexSupport("unsupported", f"the forward raises {first_line(exc)}")
    rng = np.random.default_rng(1)
    g = [(rng.standard_normal(np.shape(o)) + 1j * rng.standard_normal(np.shape(o))).astype(COMPLEX_DTYPE)
         for o in outs]
    try:
        got, want, other = _vjps(fw, fn, reference, arrays, g)
    except Exception as exc:                       # noqa: BLE001
        return ComplexSupport("unsupported", f"the backward raises {first_line(exc)}")
    wrong = [name for name, a, b in zip(("q", "k", "v"), got, want) if _rel(a, b) > _TOL]
    if not wrong:
        return ComplexSupport("right")
    why = (f"; it matches the other convention: {get(fw).other_convention}"
           if all(_rel(a, b) <= _TOL for a, b in zip(got, other)) else "")
    worst = max(_rel(a, b) for a, b in zip(got, want))
    return ComplexSupport("wrong", f"the gradient of {', '.join(wrong)} disagrees with autodiff (rel err "
                                   f"{worst:.1e}){why}")


def _rel(a: Optional[np.ndarray], b: np.ndarray) -> float:
    a = np.zeros_like(b) if a is None else a
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _vjps(fw: str, fn: Callable, reference: Callable, arrays, g):
    """(hand-written VJP, autodiff VJP of the reference, the reference's VJP in the other complex convention:
    conj(vjp(conj(g))), eq. (17)), as numpy arrays in ``fw``'s own convention."""
    ops = get(fw).ops
    with ops.context("cpu"):
        x = tuple(ops.to_native(a, "cpu") for a in arrays)
        gs = tuple(ops.to_native(c, "cpu") for c in g)
        (got,) = ops.hand_vjp(fn)(x, [((True,) * len(x), gs)])
        (want,) = ops.ref_vjp(reference, x, [gs])
        (flipped,) = ops.ref_vjp(reference, x, [tuple(ops.to_native(np.conj(c), "cpu") for c in g)])
        numpy = lambda ts: [ops.to_numpy(t) for t in ts]
        return numpy(got), numpy(want), list(eq17(tuple(numpy(flipped)), True))
