"""Rendering a :class:`~crosscheck.runner.Report`: the stdout table, the summary (RAISED, DISAGREEMENTS, then the
closing lines of ``crosscheck.closing``) and the ``--json`` document.

The JSON schema (``SCHEMA_VERSION``; keys are only ever added, never renamed or removed, within a version) and
what each key means: docs/crosscheck.md, "The --json document"; ``TOP_KEYS`` is its key order.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from . import metrics
from .cases import subsets
from .closing import consequences, hand_notes, verdict
from .frameworks import get
from .oracles import Kind
from .results import Report, fmt_err, names
from .specs import SPECS

__all__ = ["SCHEMA_VERSION", "format_table", "format_summary", "fit", "verdict", "to_json", "error_json", "TOP_KEYS",
           "QUIET_WIDTH", "QUIET_ROWS"]

SCHEMA_VERSION = 1
TOP_KEYS = ("schema_version", "tool", "exit_code", "ok", "error", "seed", "trials", "device", "dtypes", "ops",
            "frameworks", "shapes", "torch_impl", "jax_impl", "hand_written", "require_hand_written", "tolerances",
            "norm_floor", "elapsed_seconds", "versions", "rows", "failures", "skipped", "path_shapes", "summary",
            "failing", "hints", "notes", "complex", "review", "strict")

MAX_FAILURES_SHOWN = 25
QUIET_WIDTH = 120          # -q: the columns a line may take ...
QUIET_ROWS = 3             # ... and the rows an indented (detail) line may wrap to; the JSON keeps every word


def _num(x: float) -> Optional[float]:
    return None if (math.isinf(x) or math.isnan(x)) else float(x)


def format_table(report: Report) -> str:
    header = ("op", "oracle pair", "dtype", "device", "rel err", "max abs", "tol", "verdict")
    lines = [header]
    for r in report.rows:
        lines.append((r.op, r.oracle.label(console=True), r.dtype, r.device, fmt_err(r.rel_err) if r.compared else "-",
                      fmt_err(r.max_abs) if r.compared else "-", f"{r.tol:.0e}", r.verdict))
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    notes = hand_notes(report)
    return "\n".join(out + ([""] + notes if notes else []))


def format_summary(report: Report) -> str:
    reasons = sorted({s.reason for s in report.skipped})
    out = ["skipped:"] + [f"  - {r}" for r in reasons] if reasons else []
    raised = [f for f in report.failures if f.error]
    wrong = [f for f in report.failures if not f.error]
    if raised:
        distinct = len({(f.op, f.framework, f.error) for f in raised})
        out.append(f"RAISED ({len(raised)} request{'s' if len(raised) > 1 else ''}, {distinct} distinct "
                   f"error{'s' if distinct > 1 else ''}):")
        out += _raised_lines(raised, consequences(report))
    if wrong:
        out += _disagreement_lines(wrong)
    v = verdict(report)
    out += v["review"] + v["complex"] + v["notes"] + [v["summary"]] + v["failing"] + v["hints"] + v["also"]
    return "\n".join(out)


def fit(text: str, width: int = QUIET_WIDTH, rows: int = QUIET_ROWS) -> str:
    """``text`` for a terminal (``-q``): each line wrapped at ``width`` columns, its continuation rows indented 4
    columns past the line's own indent (a detail line under it is indented 2); an indented line is cut after
    ``rows`` rows, ending "…" (the full run and the JSON keep it whole), a line without indent (the verdict, the
    failing and hint lines, a section's head) is kept whole."""
    import textwrap
    out: List[str] = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip(" "))
        wrapped = textwrap.wrap(line.strip(), width, initial_indent=" " * indent,
                                subsequent_indent=" " * (indent + 4), break_long_words=True, break_on_hyphens=False)
        if indent and len(wrapped) > rows:
            last = wrapped[rows - 1]
            wrapped = wrapped[:rows - 1] + [(last if len(last) <= width - 2 else last[:width - 2].rstrip()) + " …"]
        out += wrapped
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
    if f.kind.of_outputs:
        return dataclasses.replace(f, wrt=(), outputs=items)
    return dataclasses.replace(f, wrt=(), inputs=items)


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
