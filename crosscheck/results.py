"""The data of a run: one comparison (:class:`Comparison`, on the numbers of a :class:`CaseInfo`, of an
:class:`~crosscheck.oracles.Oracle` pair), a table row (:class:`Row`) and the whole result (:class:`Report`).  What to
check (:class:`Config`, :class:`UserImpl`) lives in ``crosscheck.config``, re-exported here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .config import ALL_DTYPES, DEFAULT_DTYPES, FRAMEWORKS, USER_DEFAULT_DTYPES, Config, UserImpl
from .errors import Raised
from .frameworks import get
from .oracles import KINDS, Kind, Oracle, Party
from .sampling import Shape

__all__ = ["Config", "UserImpl", "Oracle", "Kind", "KINDS", "Party", "CaseInfo", "Comparison", "Row", "Skipped", "HandWritten",
           "Report", "DEFAULT_DTYPES", "USER_DEFAULT_DTYPES", "ALL_DTYPES", "FRAMEWORKS", "fmt_err", "names"]


@dataclass(frozen=True)
class CaseInfo:
    """Which numbers a comparison was made on: dtype, shape (n, d, e), trial, the inputs' shapes, and the op's
    input and output names (``OpSpec.inputs`` / ``outputs``: what a path and a message name)."""

    dtype: str
    shape: Shape
    trial: int
    input_shapes: Tuple[Tuple[int, ...], ...]
    input_names: Tuple[str, ...]
    output_names: Tuple[str, ...]


def names(items: Sequence[str]) -> str:
    """A set of inputs / outputs as the JSON and the messages write it: ``"q,k"``."""
    return ",".join(items)


@dataclass(frozen=True)
class Comparison:
    op: str
    oracle: Oracle
    case: CaseInfo
    device: str
    # vjp: the gradient's input; jvp: the inputs carrying tangents; forward: () ("-"); vjp_vjp: the input or
    # cotangent ("g_o") the second-order gradient is taken w.r.t.; hvp: the gradient whose tangent is compared
    inputs: Tuple[str, ...]
    # vjp / vjp_vjp / hvp: the outputs carrying cotangents; jvp / forward: the output compared
    outputs: Tuple[str, ...]
    rel_err: float
    max_abs: float
    tol: float
    note: str = ""
    # vjp: the inputs requiring grad (torch) / differentiated (JAX) when not all of them are, else ()
    wrt: Tuple[str, ...] = ()
    # the hand-written derivative raised (one failure for the whole request), else None
    error: Optional[Raised] = None
    # a failing VJP gradient that agrees with another input's nonzero expected gradient instead (a return-order
    # slip: (g_k, g_q, g_v) returned for (g_q, g_k, g_v)): those inputs' names, else (); "0" alone: it is zero
    # (or absent), as another input's expected gradient is, which tells nothing either way  (crosscheck.hints)
    matches: Tuple[str, ...] = ()

    kind = property(lambda self: self.oracle.kind)
    framework = property(lambda self: self.oracle.framework, doc="the side whose result is checked")
    cross = property(lambda self: self.oracle.cross, doc="a torch-vs-JAX comparison")
    candidate = property(lambda self: self.oracle.candidate, doc='"" for the framework\'s own entry')
    label = property(lambda self: self.oracle.label(), doc="the oracle pair as the JSON names it")
    dtype = property(lambda self: self.case.dtype)
    shape = property(lambda self: self.case.shape)
    trial = property(lambda self: self.case.trial)
    input_shapes = property(lambda self: self.case.input_shapes)

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tol

    def unused(self) -> Tuple[str, ...]:
        """The outputs a VJP request left unused (no cotangent)."""
        outputs = self.case.output_names
        if self.kind is not Kind.VJP or len(outputs) < 2:
            return ()
        return tuple(n for n in outputs if n not in self.outputs)

    def path(self) -> str:
        """The path beyond "every input requires grad, every output used", e.g. ``"o unused; v does not require
        grad"``; ``""`` for that default path."""
        parts = [f"{names(self.unused())} unused"] if self.unused() else []
        missing = [n for n in self.case.input_names if n not in self.wrt]
        if self.wrt and missing:                      # "v does not require grad" / "v is not differentiated"
            parts.append(get(self.framework).missing(missing))
        return "; ".join(parts)

    def subject(self, candidate: bool = True) -> str:
        """What fails, without its path: "grad of q", "tangent of a", "backward raises TypeError" (a sharded
        candidate's: "torch sharded ring on 2 ranks: grad of q")."""
        error = self.error
        what = (f"{self.kind.call} raises {error.type}" if error.type else error.message) if error else self._head()
        return (f"{self.candidate}: " if self.candidate and candidate else "") + what

    def _head(self) -> str:
        ins, outs = names(self.inputs), names(self.outputs)
        return {Kind.VJP: f"grad of {ins}", Kind.JVP: f"tangent of {outs}", Kind.VJP_VJP: f"second order: grad of {ins}",
                Kind.HVP: f"second order: tangent of grad of {ins}"}.get(self.kind, f"forward output {outs}")

    def _detail(self) -> str:
        ins, outs, path = names(self.inputs), names(self.outputs), self.path()
        path = f"; {path}" if path else ""
        if self.error:
            return {Kind.VJP: f"asked for grad of {ins}; cotangent on {outs}{path}",
                    Kind.JVP: f"tangent on {ins}"}.get(self.kind, "")
        return {Kind.VJP: f"cotangent on {outs}{path}", Kind.JVP: f"tangent on {ins}",
                Kind.VJP_VJP: f"VJP of the VJP, cotangent on {outs}",
                Kind.HVP: "HVP, forward-over-reverse"}.get(self.kind, "")

    def what(self) -> str:
        head = self.subject(False) if self.error else self._head()
        detail = self._detail()
        return head + (f" ({detail})" if detail else "")

    def message(self, console: bool = False) -> str:
        """One line: what disagrees, on which numbers (``console``: labels as the console shows them)."""
        return f"{self.op}: {self.what()}{'' if self.error else ' disagrees'} — {self.where(console)}"

    def where(self, console: bool = False) -> str:
        """Which comparison, on which numbers, and the measurement (or the error of a request that raised)."""
        n, d, e = self.shape
        shapes = ", ".join(f"{name} {s}" for name, s in self.input_shapes_named())
        # a request that raised is named by the side that raised
        who = self.oracle.side(console) if self.error else self.oracle.label(console)
        case = f"{who}, {self.dtype} on {self.device}, n={n} d={d} e={e} ({shapes}), trial {self.trial}: "
        if self.error:
            return case + self.error.text
        note = f"; {self.note}" if self.note else ""
        return (case + f"rel err {fmt_err(self.rel_err)} > tol {self.tol:.0e}, max abs {fmt_err(self.max_abs)}{note}")

    def input_shapes_named(self):
        return list(zip(self.case.input_names, self.input_shapes))


@dataclass
class Row:
    op: str
    oracle: Oracle
    dtype: str
    device: str
    tol: float
    rel_err: float = 0.0
    max_abs: float = 0.0
    compared: int = 0
    failed: int = 0

    kind = property(lambda self: self.oracle.kind)
    framework = property(lambda self: self.oracle.framework)
    cross = property(lambda self: self.oracle.cross)
    label = property(lambda self: self.oracle.label(), doc="the oracle pair as the JSON names it")

    @property
    def verdict(self) -> str:
        return "FAIL" if self.failed else "ok" if self.compared else "skip"


@dataclass(frozen=True)
class Skipped:
    """A row's comparisons left out on some case, and why (one entry per distinct reason)."""

    op: str
    oracle: Oracle
    dtype: str
    reason: str

    label = property(lambda self: self.oracle.label())


@dataclass(frozen=True)
class HandWritten:
    """Whether a framework's attn gradient is hand-written: ``hand_written`` True, False (autodiff differentiates
    the forward; ``detail`` says how it reaches the inputs) or None (could not tell; ``detail`` says why)."""

    impl: str
    hand_written: Optional[bool]
    detail: str = ""


@dataclass
class Report:
    config: Config
    shapes: List[Shape]
    rows: List[Row]
    failures: List[Comparison]
    skipped: List[Skipped]
    elapsed: float
    versions: Dict[str, str]
    hand_written: Dict[str, HandWritten] = field(default_factory=dict)      # per framework checked on op attn
    path_shapes: List[Shape] = field(default_factory=list)       # shapes on which every path was checked
    reviews: Dict[str, object] = field(default_factory=dict)     # framework -> crosscheck.review.Review
    complex_support: Dict[str, object] = field(default_factory=dict)   # framework -> probe.ComplexSupport

    @property
    def autodiff_sides(self) -> List[str]:
        """Frameworks whose `attn` gradient is not hand-written (autodiff differentiates the forward)."""
        return [fw for fw, h in self.hand_written.items() if h.hand_written is False]

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
