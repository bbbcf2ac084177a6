"""The data of a run: what to check (:class:`Config`), one comparison (:class:`Comparison`), a table row
(:class:`Row`) and the whole result (:class:`Report`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import metrics
from .cases import EDGE_SHAPES, Shape
from .frameworks import get
from .specs import SPECS

__all__ = ["Config", "Oracle", "Comparison", "Row", "Report", "DEFAULT_DTYPES", "USER_DEFAULT_DTYPES", "ALL_DTYPES",
           "FRAMEWORKS", "KINDS", "fmt_err"]

DEFAULT_DTYPES = ("float32", "float64", "complex128")
# a user's implementation: the lab's contract is real (complex is probed apart, see crosscheck.probe)
USER_DEFAULT_DTYPES = ("float32", "float64")
ALL_DTYPES = ("float32", "float64", "complex64", "complex128")
FRAMEWORKS = ("torch", "jax")
# forward outputs; first-order VJP / JVP; second order: VJP of the VJP, Hessian-vector product (forward-over-reverse)
KINDS = ("forward", "vjp", "jvp", "vjp_vjp", "hvp")
# what runs the user's code, per kind, in the words of a failure that raised
_CALLS = {"forward": "forward", "vjp": "backward", "jvp": "jvp", "vjp_vjp": "second order (VJP of the VJP)",
          "hvp": "second order (HVP, forward-over-reverse)"}


@dataclass
class Config:
    """What to check.  Defaults are the CLI's defaults."""

    ops: Sequence[str] = tuple(SPECS)
    dtypes: Sequence[str] = DEFAULT_DTYPES
    device: str = "cpu"
    seed: int = 0
    trials: int = 2                                    # independent input draws per (op, dtype, shape)
    shapes: Sequence[Shape] = EDGE_SHAPES              # always checked
    random_shapes: int = 2                             # plus this many shapes drawn from the ranges below
    n_range: Tuple[int, int] = (1, 8)                  # inclusive
    d_range: Tuple[int, int] = (1, 8)
    e_range: Tuple[int, int] = (1, 8)
    frameworks: Sequence[str] = FRAMEWORKS
    torch_impl: Optional[Callable] = None              # replaces torch_impl.attn for op "attn"
    torch_impl_name: str = ""
    jax_impl: Optional[Callable] = None                # replaces jax_impl.attn / attn_jvp for op "attn"
    jax_impl_name: str = ""
    jacrev_max_elements: int = 300_000                 # skip jacrev oracles for larger Jacobians
    path_shapes: int = 2                               # shapes checked on every path (cases.path_shapes)
    require_hand_written: bool = True                  # an autodiff-derived attn gradient fails the run (else a NOTE)
    review: bool = True                                # review a user's attn (crosscheck.review): advice, ...
    strict: bool = False                               # ... unless strict: any finding fails the run (exit 1)
    probe_complex: bool = False                        # probe a user's complex support apart (crosscheck.probe)
    tolerances: Dict[str, float] = field(default_factory=lambda: dict(metrics.TOLERANCES))
    shards: int = 0                                    # also check the sharded entries on N ranks (crosscheck.sharded)
    torch_layouts: str = ""                            # with shards: "MODULE:ATTR", layouts instead of the project's
    jax_layouts: str = ""

    def impl_name(self, fw: str) -> str:
        """The name of the user's implementation checked for ``fw`` (``--torch-impl`` / ``--jax-impl``), or ""."""
        return getattr(self, f"{fw}_impl_name")


@dataclass(frozen=True)
class Oracle:
    """Who is compared with whom: ``label`` as shown in the table and the JSON (``"torch hand VJP vs
    torch.func.vjp(ref)"``), ``framework``: the side under test (for a torch-vs-JAX pair, the side whose error is
    measured), ``cross``: a torch-vs-JAX pair, ``symmetric``: neither side is trusted (two user implementations:
    rel err divides by the larger norm, see ``metrics.diff``)."""

    label: str
    framework: str
    cross: bool = False
    symmetric: bool = False
    candidate: str = ""        # a candidate other than the framework's own entry ("torch sharded ring on 2 ranks")


@dataclass(frozen=True)
class Comparison:
    op: str
    oracle: str                # Oracle.label
    kind: str                  # one of KINDS
    dtype: str
    device: str
    shape: Shape
    input_shapes: Tuple[Tuple[int, ...], ...]
    trial: int
    # vjp: the gradient's input; jvp: the inputs carrying tangents; forward: "-"; vjp_vjp: the input or
    # cotangent ("g_o") the second-order gradient is taken w.r.t.; hvp: the gradient whose tangent is compared
    input: str
    # vjp / vjp_vjp / hvp: the outputs carrying cotangents; jvp / forward: the output compared
    output: str
    rel_err: float
    max_abs: float
    tol: float
    note: str = ""
    # vjp: the inputs requiring grad (torch) / differentiated (JAX) when not all of them are, else ""
    wrt: str = ""
    # the hand-written derivative raised: "TypeError: ..." (one failure for the whole request), else ""
    error: str = ""
    framework: str = ""        # Oracle.framework: the side whose result is checked
    cross: bool = False        # Oracle.cross: a torch-vs-JAX comparison
    candidate: str = ""        # Oracle.candidate: "" for the framework's own entry

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tol

    def path(self) -> str:
        """The path beyond "every input requires grad, every output used", e.g. ``"o unused; v does not require
        grad"``; ``""`` for that default path."""
        parts = []
        outputs = SPECS[self.op].outputs if self.op in SPECS else ()
        if self.kind == "vjp" and len(outputs) > 1:
            unused = [n for n in outputs if n not in self.output.split(",")]
            if unused:
                parts.append(f"{','.join(unused)} unused")
        missing = [n for n in SPECS[self.op].inputs if n not in self.wrt.split(",")] if self.op in SPECS else []
        if self.wrt and missing:                      # "v does not require grad" / "v is not differentiated"
            parts.append(get(self.framework).missing(missing))
        return "; ".join(parts)

    def subject(self, candidate: bool = True) -> str:
        """What fails, without its path: "grad of q", "tangent of a", "backward raises TypeError" (a sharded
        candidate's: "torch sharded ring on 2 ranks: grad of q")."""
        what = f"{_CALLS[self.kind]} raises {self.error.split(':')[0]}" if self.error else self.what().split(" (")[0]
        return (f"{self.candidate}: " if self.candidate and candidate else "") + what

    def what(self) -> str:
        path = self.path()
        path = f"; {path}" if path else ""
        if self.error:
            where = {"vjp": f"asked for grad of {self.input}; cotangent on {self.output}{path}",
                     "jvp": f"tangent on {self.input}"}.get(self.kind)
            return self.subject(False) + (f" ({where})" if where else "")
        return {"vjp": f"grad of {self.input} (cotangent on {self.output}{path})",
                "jvp": f"tangent of {self.output} (tangent on {self.input})",
                "vjp_vjp": f"second order: grad of {self.input} (VJP of the VJP, cotangent on {self.output})",
                "hvp": f"second order: tangent of grad of {self.input} (HVP, forward-over-reverse)"}.get(
            self.kind, f"forward output {self.output}")

    def message(self) -> str:
        return f"{self.op}: {self.what()}{'' if self.error else ' disagrees'} — {self.where()}"

    def where(self) -> str:
        """Which comparison, on which numbers, and the measurement (or the error of a request that raised)."""
        n, d, e = self.shape
        shapes = ", ".join(f"{name} {s}" for name, s in self.input_shapes_named())
        # a request that raised is named by the side that raised (the left of the oracle pair)
        case = (f"{self.oracle.partition(' vs ')[0] if self.error else self.oracle}, {self.dtype} on {self.device}, "
                f"n={n} d={d} e={e} ({shapes}), trial {self.trial}: ")
        if self.error:
            return case + self.error
        note = f"; {self.note}" if self.note else ""
        return (case + f"rel err {fmt_err(self.rel_err)} > tol {self.tol:.0e}, max abs {fmt_err(self.max_abs)}{note}")

    def input_shapes_named(self):
        return list(zip(SPECS[self.op].inputs if self.op in SPECS else ("?",) * len(self.input_shapes),
                        self.input_shapes))


@dataclass
class Row:
    op: str
    oracle: str
    kind: str
    dtype: str
    device: str
    tol: float
    rel_err: float = 0.0
    max_abs: float = 0.0
    compared: int = 0
    failed: int = 0
    framework: str = ""        # Oracle.framework
    cross: bool = False        # Oracle.cross

    @property
    def verdict(self) -> str:
        return "FAIL" if self.failed else "ok" if self.compared else "skip"


@dataclass
class Report:
    config: Config
    shapes: List[Shape]
    rows: List[Row]
    failures: List[Comparison]
    skipped: List[Dict[str, str]]
    elapsed: float
    versions: Dict[str, str]
    # per framework checked on op attn: {"impl": source, "hand_written": True | False | None (could not tell),
    # "detail": how autodiff reaches the inputs, or why it could not tell}
    hand_written: Dict[str, Dict[str, object]] = field(default_factory=dict)
    path_shapes: List[Shape] = field(default_factory=list)       # shapes on which every path was checked
    reviews: Dict[str, object] = field(default_factory=dict)     # framework -> crosscheck.review.Review
    complex_support: Dict[str, object] = field(default_factory=dict)   # framework -> probe.ComplexSupport

    @property
    def autodiff_sides(self) -> List[str]:
        """Frameworks whose `attn` gradient is not hand-written (autodiff differentiates the forward)."""
        return [fw for fw, h in self.hand_written.items() if h["hand_written"] is False]

    @property
    def findings(self) -> int:
        """The number of review findings (over the frameworks reviewed)."""
        return sum(len(r.findings) for r in self.reviews.values())

    @property
    def ok(self) -> bool:
        return (not self.failures and not (self.config.require_hand_written and self.autodiff_sides)
                and not (self.config.strict and self.findings))

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def fmt_err(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.1e}")
