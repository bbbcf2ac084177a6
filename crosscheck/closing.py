"""The closing lines of a run (console and JSON): the verdict line, the ``failing`` lines grouping the failing
gradients by path, the ``hint`` lines (``crosscheck.hints``), NOTEs on gradients autodiff derived, the review's and
the complex probe's lines, and which of those only repeat a first-order crash (named once, under RAISED).
docs/crosscheck.md, "What the closing lines say"."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .cases import modes, subsets
from .errors import Raised
from .frameworks import NAMES, get
from .hints import hint_lines, only_when
from .oracles import Kind
from .results import Report, names
from .specs import SPECS

__all__ = ["verdict", "hand_notes", "consequences"]


def hand_notes(report: Report):
    """NOTE lines: implementations whose gradient is not hand-written (or that crosscheck could not classify)."""
    notes = []
    for fw, h in report.hand_written.items():
        if h.hand_written is False:
            consequence = ("this fails the run; to check an autodiff-based (CompositeImplicitAutograd-style) "
                           "solution anyway, pass --allow-autodiff" if report.config.require_hand_written
                           else "allowed by --allow-autodiff")
            notes.append(f"NOTE: no hand-written gradient in {h.impl} ({fw}): autodiff differentiates its forward "
                         f"({h.detail}), so its 'hand VJP'/'hand JVP' rows compare autodiff with autodiff. The "
                         f"lab asks for a hand-written backward ({get(fw).hand_written}); {consequence}.")
        elif h.hand_written is None:
            notes.append(f"NOTE: could not tell whether {h.impl} ({fw}) has a hand-written gradient: {h.detail}")
    return notes

def _crash_errors(report: Report) -> Dict[str, List[Raised]]:
    """Per framework, the distinct errors its own first-order requests raised (a first-order crash): the cause a
    review finding or the complex probe that raises the same error only repeats."""
    errors: Dict[str, List[Raised]] = {}
    for f in report.failures:
        if f.error and f.kind in (Kind.VJP, Kind.JVP) and not f.cross and not f.candidate:
            errors.setdefault(f.framework, [])
            if f.error not in errors[f.framework]:
                errors[f.framework].append(f.error)
    return errors


def _follows(text: str, errors: List[Raised]) -> Optional[Raised]:
    """The first-order error ``text`` (a finding's evidence, the probe's detail) repeats, or None.  An error
    without a message ("TypeError") says too little to be the same one."""
    return next((e for e in errors if e.message.strip() and e.text in text), None)


def consequences(report: Report) -> Dict[tuple, List[str]]:
    """(framework, error) -> what repeats that first-order crash: review findings (by title), the complex probe.
    The console names them under the crash in RAISED and points there instead of repeating the error."""
    crash = _crash_errors(report)
    out: Dict[tuple, List[str]] = {}
    for fw, r in report.reviews.items():
        for f in r.findings:
            error = _follows(f.evidence, crash.get(fw, []))
            if error:
                out.setdefault((fw, error), []).append(f"the review's \"{f.title}\"")
    for fw, cs in report.complex_support.items():
        error = _follows(cs.detail, crash.get(fw, [])) if cs.status == "unsupported" else None
        if error:
            out.setdefault((fw, error), []).append("the complex probe")
    return out


def _review_lines(report: Report) -> List[str]:
    """The review of each user implementation: its findings with evidence, or that it is clean.  A finding whose
    evidence is a first-order crash (the same error) is one line pointing at RAISED, where the crash is reported."""
    lines = []
    crash = _crash_errors(report)
    for fw, r in report.reviews.items():
        consequence = ("these fail the run (--strict)" if report.config.strict else
                       "advice, not counted in the verdict; --strict makes them fail the run")
        if r.findings:
            lines.append(f"review ({fw}, {r.impl}): {len(r.findings)} finding{'s' if len(r.findings) > 1 else ''} "
                         f"on the lab's asks ({consequence}):")
            for f in r.findings:
                error = _follows(f.evidence, crash.get(fw, []))
                lines.append(f"  - {f.title}: {_pointer(error)}" if error else
                             f"  - {f.title}" + (f": {f.evidence}" if f.evidence else ""))
        else:
            lines.append(f"review ({fw}, {r.impl}): clean ({get(fw).review_clean})")
        lines += [f"  (not reviewed: {item})" for item in r.unavailable]
    return lines


def _pointer(error: Raised) -> str:
    return f"the first-order {error.type} under RAISED (the same error; fix that first)"


def _complex_lines(report: Report) -> List[str]:
    """The complex probe's line per framework; a probe whose backward raised the first-order crash points at
    RAISED (the crash is not a complex problem)."""
    crash = _crash_errors(report)
    lines = []
    for fw, cs in report.complex_support.items():
        error = _follows(cs.detail, crash.get(fw, [])) if cs.status == "unsupported" else None
        lines.append(f"complex ({fw}, {report.config.impl_name(fw)}): not probed: its backward raises "
                     f"{_pointer(error)}" if error else cs.line(fw, report.config.impl_name(fw)))
    return lines


def _all_modes(op: str, kind: Kind) -> List[Tuple[str, ...]]:
    return modes(SPECS[op].outputs) if kind is Kind.VJP else subsets(SPECS[op].inputs)


def _first_order_all_inputs(failures) -> list:
    """The failures on the default path: forward, first-order VJP with every input requiring grad, JVP."""
    return [f for f in failures if not f.kind.second_order and not f.wrt]


def _rank(f) -> int:
    """Where a failure's gradient (output) stands in its op's inputs (outputs), for the order of the lines; after
    them, a request that raised."""
    names_, item = (SPECS[f.op].inputs, f.inputs) if f.kind is Kind.VJP else (SPECS[f.op].outputs, f.outputs)
    return names_.index(item[0]) if not f.error and len(item) == 1 and item[0] in names_ else len(names_)


def _failing_lines(report: Report) -> List[str]:
    """One line per group of failing gradients / tangents / outputs that fail in the same cotangent (tangent)
    modes, with the dtypes each fails in."""
    c = report.config
    per_what: Dict[tuple, tuple] = {}                  # (op, kind, what) -> (failing modes, dtypes, rank)
    for f in _first_order_all_inputs(report.failures):
        failing_modes, dtypes, _ = per_what.setdefault((f.op, f.kind, f.subject()), (set(), set(), _rank(f)))
        dtypes.add(f.dtype)
        if f.kind is not Kind.FORWARD:
            failing_modes.add(f.outputs if f.kind is Kind.VJP else f.inputs)
    groups: Dict[tuple, List[str]] = {}

    def order(item):                                   # ops, then the spec's input / output order
        (op, kind, what), (_, _, rank) = item
        return (list(SPECS).index(op), kind.value, rank, what)

    for (op, kind, what), (failing_modes, dtypes, _) in sorted(per_what.items(), key=order):
        dts = ", ".join(d for d in c.dtypes if d in dtypes)
        groups.setdefault((op, kind, tuple(m for m in _all_modes(op, kind) if m in failing_modes)), []).append(
            f"{op}: {what} [{dts}]")
    lines = []
    for (op, kind, failing_modes), items in groups.items():
        head = "failing"
        if kind is not Kind.FORWARD:
            word = "cotangent" if kind is Kind.VJP else "tangent"
            rest = [m for m in _all_modes(op, kind) if m not in failing_modes]
            head += (f" (with {word} on " + ", ".join(f"({names(m)})" for m in failing_modes)
                     + (f"; agrees with {word} on " + ", ".join(f"({names(m)})" for m in rest) if rest else "") + ")")
        lines.append(f"{head}: " + "; ".join(items))
    lines += _path_lines(report)
    return lines


def _path_lines(report: Report) -> List[str]:
    """Failures on the other paths, per op and framework: some inputs not requiring grad (when the default path of
    that op and framework agrees; otherwise they would only repeat the same bug), and second order (always: the
    JSON has them, the console says so)."""
    c = report.config
    first_fails = {(f.op, f.framework) for f in _first_order_all_inputs(report.failures)}
    subset: Dict[tuple, tuple] = {}                    # (op, framework, what) -> (input subsets, dtypes)
    second: Dict[tuple, set] = {}
    for f in report.failures:
        key = (f.op, f.framework)
        if key in first_fails and not f.kind.second_order:
            continue                                   # a subset failure when the default path fails: same bug
        if f.kind is Kind.VJP and f.wrt:
            wrts, dtypes = subset.setdefault((f.op, f.framework, f.subject()), (set(), set()))
            wrts.add(f.wrt)
            dtypes.add(f.dtype)
        elif f.kind.second_order:
            what = f.subject() if f.error else ((f"{f.candidate}: " if f.candidate else "")
                                                + ("VJP of the VJP" if f.kind is Kind.VJP_VJP else "HVP"))
            second.setdefault((f.op, f.framework, what), set()).add(f.dtype)
    lines = []
    for (op, fw, subject), (wrts, dtypes) in subset.items():
        dts = ", ".join(d for d in c.dtypes if d in dtypes)
        lines.append(f"failing only {only_when(SPECS[op].inputs, fw, wrts)} ({fw}; agrees when every input "
                     f"{get(fw).requires[0]}): {op}: {subject} [{dts}]")
    for (op, fw, what), dtypes in second.items():
        dts = ", ".join(d for d in c.dtypes if d in dtypes)
        too = (op, fw) in first_fails
        lines.append(f"failing in second order {'too' if too else 'only'} ({fw}; first order "
                     f"{'fails too' if too else 'agrees'}): {op}: {what} [{dts}]")
    return lines


def verdict(report: Report) -> Dict[str, Any]:
    """The closing lines of a run, also written to the JSON: ``summary`` (the verdict line), ``failing`` (failing
    gradients grouped by path), ``hints`` (pointers at derivation.md), ``notes`` (NOTE lines), ``also``."""
    c = report.config
    compared = sum(r.compared for r in report.rows)
    n_fail = len(report.failures)
    impls = "".join(f"{fw} impl {c.impl_name(fw)}; " for fw in NAMES if c.impl_name(fw))
    scope = (f"{impls}ops {','.join(c.ops)}; dtypes {','.join(c.dtypes)}; {len(report.shapes)} "
             f"shapes x {c.trials} trials; seed {c.seed}; device {c.device}; {report.elapsed:.1f} s")
    autodiff = report.autodiff_sides if c.require_hand_written else []
    not_hand = "no hand-written gradient in " + ", ".join(report.hand_written[fw].impl for fw in autodiff)
    failing, hints = [], []
    also = [f"also: {not_hand} (see NOTE)"] if n_fail and autodiff else []
    if n_fail:
        summary = f"crosscheck: FAIL: {n_fail} of {compared} comparisons disagree ({scope})"
        failing, hints = _failing_lines(report), hint_lines(report)
    elif autodiff:
        summary = (f"crosscheck: FAIL: {not_hand} (all {compared} comparisons agree, but autodiff computed the "
                   f"'hand' gradients; see NOTE) ({scope})")
    elif c.strict and report.findings:
        summary = (f"crosscheck: FAIL: {report.findings} review findings under --strict (all {compared} "
                   f"comparisons agree) ({scope})")
    else:
        summary = f"crosscheck: OK: all {compared} comparisons agree ({scope})"
    return {"summary": summary, "failing": failing, "hints": hints, "notes": hand_notes(report), "also": also,
            "complex": _complex_lines(report),
            "review": _review_lines(report)}
