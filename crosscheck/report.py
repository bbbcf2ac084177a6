"""Rendering a :class:`~crosscheck.runner.Report`: the stdout table and the ``--json`` document.

The JSON schema (``SCHEMA_VERSION``; keys are only ever added, never renamed or removed, within a version) and
what each key means: docs/crosscheck.md, "The --json document"; ``TOP_KEYS`` is its key order.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from . import metrics
from .errors import Raised
from .oracles import Kind
from .results import Report, fmt_err, names
from .cases import modes, subsets
from .specs import SPECS
from .frameworks import NAMES, get
from .hints import hint_lines, only_when

__all__ = ["SCHEMA_VERSION", "format_table", "format_summary", "verdict", "to_json", "error_json", "TOP_KEYS"]

SCHEMA_VERSION = 1
TOP_KEYS = ("schema_version", "tool", "exit_code", "ok", "error", "seed", "trials", "device", "dtypes", "ops",
            "frameworks", "shapes", "torch_impl", "jax_impl", "hand_written", "require_hand_written", "tolerances",
            "norm_floor", "elapsed_seconds", "versions", "rows", "failures", "skipped", "path_shapes", "summary",
            "failing", "hints", "notes", "complex", "review", "strict")

MAX_FAILURES_SHOWN = 25


def _num(x: float) -> Optional[float]:
    return None if (math.isinf(x) or math.isnan(x)) else float(x)


def _hand_notes(report: Report):
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


def format_table(report: Report) -> str:
    header = ("op", "oracle pair", "dtype", "device", "rel err", "max abs", "tol", "verdict")
    lines = [header]
    for r in report.rows:
        lines.append((r.op, r.oracle.label(console=True), r.dtype, r.device, fmt_err(r.rel_err) if r.compared else "-",
                      fmt_err(r.max_abs) if r.compared else "-", f"{r.tol:.0e}", r.verdict))
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    notes = _hand_notes(report)
    return "\n".join(out + ([""] + notes if notes else []))


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


def _consequences(report: Report) -> Dict[tuple, List[str]]:
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
    return {"summary": summary, "failing": failing, "hints": hints, "notes": _hand_notes(report), "also": also,
            "complex": _complex_lines(report),
            "review": _review_lines(report)}


def format_summary(report: Report) -> str:
    reasons = sorted({s.reason for s in report.skipped})
    out = ["skipped:"] + [f"  - {r}" for r in reasons] if reasons else []
    raised = [f for f in report.failures if f.error]
    wrong = [f for f in report.failures if not f.error]
    if raised:
        distinct = len({(f.op, f.framework, f.error) for f in raised})
        out.append(f"RAISED ({len(raised)} request{'s' if len(raised) > 1 else ''}, {distinct} distinct "
                   f"error{'s' if distinct > 1 else ''}):")
        out += _raised_lines(raised, _consequences(report))
    if wrong:
        out += _disagreement_lines(wrong)
    v = verdict(report)
    out += v["review"] + v["complex"] + v["notes"] + [v["summary"]] + v["failing"] + v["hints"] + v["also"]
    return "\n".join(out)


def _disagreement_lines(wrong) -> List[str]:
    """One line per distinct wrong result (op, what is compared, its cotangent / tangent mode): the gradients or
    outputs concerned, how many comparisons saw it (oracle pairs, dtypes, shapes, input subsets) and the worst of
    them in full; the others differ from it only in those."""
    groups: Dict[str, list] = {}
    for f in wrong:
        groups.setdefault(_one_of(f, ("*",)).what(), []).append(f)
    lines = [f"DISAGREEMENTS ({len(wrong)} comparisons, {len(groups)} distinct):"]
    for fs in list(groups.values())[:MAX_FAILURES_SHOWN]:
        worst = max(fs, key=lambda f: f.rel_err if not math.isnan(f.rel_err) else math.inf)
        if len(fs) == 1:
            lines.append(f"  {worst.message(console=True)}")
            continue
        items = tuple(dict.fromkeys(n for f in fs for n in (f.outputs if f.kind.of_outputs else f.inputs)))
        counts = [(len({f.oracle for f in fs}), "oracle"), (len({f.shape for f in fs}), "shape"),
                  (len({f.wrt for f in fs}), "input subset")]
        seen = "; ".join([", ".join(dict.fromkeys(f.dtype for f in fs))]
                         + [f"{k} {what}{'s' if k > 1 else ''}" for k, what in counts
                            if k > 1 or what != "input subset"])
        lines.append(f"  {worst.op}: {_one_of(fs[0], items).what()} disagrees in {len(fs)} comparisons ({seen}); the "
                     f"worst: {worst.where(console=True)}")
    if len(groups) > MAX_FAILURES_SHOWN:
        lines.append(f"  ... and {len(groups) - MAX_FAILURES_SHOWN} more (write them all with --json PATH)")
    return lines


def _one_of(f, items: Tuple[str, ...]):
    """``f`` as the representative of its group: every input subset, the gradients / outputs ``items``."""
    return dataclasses.replace(f, wrt=(), **{"outputs" if f.kind.of_outputs else "inputs": items})


def _raised_lines(raised, consequences: Dict[tuple, List[str]]) -> List[str]:
    """Each distinct error once: the requests (paths) that raised it, with their dtypes, one full message, and
    what else stopped on the same error (``consequences``: (framework, error) -> the review's findings, the
    complex probe)."""
    groups: Dict[tuple, list] = {}
    for f in raised:
        groups.setdefault((f.op, f.framework, f.error), []).append(f)
    lines = []
    for (op, fw, error), fs in groups.items():
        dtypes = ", ".join(dict.fromkeys(f.dtype for f in fs))
        lines.append(f"  {op} ({fw}): {error.text}  [{len(fs)} requests; {dtypes}] on these paths:")
        paths: Dict[str, Counter] = {}                  # path without the inputs -> {gradients asked for: count}
        for f in fs:
            unused = f"; {names(f.unused())} unused" if f.unused() else ""
            head, asked = ((f"backward, cotangent on {names(f.outputs)}{unused}", names(f.inputs))
                           if f.kind is Kind.VJP else (f.what(), ""))
            paths.setdefault(head, Counter())[asked] += 1
        for head, counts in paths.items():
            every = len(counts) == len(subsets(SPECS[op].inputs)) if op in SPECS else False
            asked = (f"whichever inputs {get(fw).requires[1]}" if every else
                     "asked for grad of " + " | ".join(counts)) if "" not in counts else ""
            lines.append(f"    {head}{': ' + asked if asked else ''}  (x{sum(counts.values())})")
        lines.append(f"    first: {fs[0].message(console=True)}")
        also = consequences.pop((fw, error), None)
        if also:
            lines.append(f"    the same error also stops {'; '.join(also)} (not a separate problem)")
    return lines


def _document(c, exit_code: int, ok: bool, error: Optional[str], **rest) -> Dict[str, Any]:
    """The JSON document: its head, the config's keys and ``rest``, in ``TOP_KEYS`` order."""
    doc = dict(schema_version=SCHEMA_VERSION, tool="crosscheck", exit_code=exit_code, ok=ok, error=error,
               seed=c.seed, trials=c.trials, device=c.device, dtypes=list(c.dtypes), ops=list(c.ops),
               frameworks=list(c.frameworks), torch_impl=c.torch_impl_name or "torch_impl.attn",
               jax_impl=c.jax_impl_name or "jax_impl.attn / jax_impl.attn_jvp", strict=bool(c.strict),
               require_hand_written=bool(c.require_hand_written), tolerances=dict(c.tolerances),
               norm_floor=metrics.NORM_FLOOR, **rest)
    return {k: doc[k] for k in TOP_KEYS}


def to_json(report: Report) -> Dict[str, Any]:
    v = verdict(report)
    return _document(
        report.config, report.exit_code, report.ok, None, shapes=[list(s) for s in report.shapes],
        hand_written={fw: dataclasses.asdict(h) for fw, h in report.hand_written.items()},
        elapsed_seconds=round(report.elapsed, 3), versions=dict(report.versions),
        rows=[{"op": r.op, "oracle": r.label, "kind": r.kind.value, "dtype": r.dtype, "device": r.device,
               "rel_err": _num(r.rel_err), "max_abs": _num(r.max_abs), "tol": r.tol, "verdict": r.verdict,
               "compared": r.compared, "failed": r.failed} for r in report.rows],
        failures=[{"op": f.op, "oracle": f.label, "kind": f.kind.value, "dtype": f.dtype, "device": f.device,
                   "shape": list(f.shape), "input_shapes": {n: list(s) for n, s in f.input_shapes_named()},
                   "trial": f.trial, "input": names(f.inputs) or "-", "output": names(f.outputs),
                   "rel_err": _num(f.rel_err), "max_abs": _num(f.max_abs), "tol": f.tol, "note": f.note,
                   "message": f.message(), "wrt": names(f.wrt), "error": f.error.text if f.error else ""}
                  for f in report.failures],
        skipped=[{"op": s.op, "oracle": s.label, "dtype": s.dtype, "reason": s.reason} for s in report.skipped], path_shapes=[list(s) for s in report.path_shapes], summary=v["summary"],
        failing=v["failing"], hints=v["hints"], notes=v["notes"] + v["also"],
        complex={fw: {"status": c.status, "detail": c.detail} for fw, c in report.complex_support.items()},
        review={fw: {"impl": r.impl, "findings": [{"key": f.key, "title": f.title, "evidence": f.evidence}
                                                  for f in r.findings], "unavailable": list(r.unavailable)}
                for fw, r in report.reviews.items()})


def error_json(config, message: str, versions: Dict[str, str]) -> Dict[str, Any]:
    """The ``--json`` document of a run that ended with exit code 2 (nothing judged)."""
    return _document(config, 2, False, message, shapes=[], hand_written={}, elapsed_seconds=0.0, versions=versions,
                     rows=[], failures=[], skipped=[], path_shapes=[], summary=f"crosscheck: error: {message}",
                     failing=[], hints=[], notes=[], complex={}, review={})
