"""Rendering a :class:`~crosscheck.runner.Report`: the stdout table and the ``--json`` document.

JSON schema (``SCHEMA_VERSION`` 1; keys are only ever added, never renamed or removed, within a version)::

    {"schema_version": 1, "tool": "crosscheck", "exit_code": 0 | 1 | 2, "ok": bool, "error": str | null,
     "seed": int, "trials": int, "device": "cpu" | "cuda", "dtypes": [str], "ops": [str],
     "frameworks": [str], "shapes": [[n, d, e]], "torch_impl": str, "jax_impl": str,
     "tolerances": {dtype: float}, "norm_floor": float, "elapsed_seconds": float,
     "versions": {"crosscheck", "python", "numpy", "torch", "platform", ["jax", "jaxlib"]},
     "rows": [{"op", "oracle", "kind", "dtype", "device", "rel_err", "max_abs", "tol", "verdict",
               "compared", "failed"}],
     "failures": [{"op", "oracle", "kind", "dtype", "device", "shape": [n, d, e], "input_shapes": {name: [..]},
                   "trial", "input", "output", "rel_err", "max_abs", "tol", "note", "message"}],
     "skipped": [{"op", "oracle", "dtype", "reason"}]}

``rel_err`` / ``max_abs`` are ``null`` when infinite or NaN (a raised error, a wrong shape, a NaN result).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from . import metrics
from .runner import Report

__all__ = ["SCHEMA_VERSION", "format_table", "format_summary", "to_json", "error_json", "ROW_KEYS",
           "FAILURE_KEYS", "TOP_KEYS"]

SCHEMA_VERSION = 1
TOP_KEYS = ("schema_version", "tool", "exit_code", "ok", "error", "seed", "trials", "device", "dtypes", "ops",
            "frameworks", "shapes", "torch_impl", "jax_impl", "tolerances", "norm_floor", "elapsed_seconds",
            "versions", "rows", "failures", "skipped")
ROW_KEYS = ("op", "oracle", "kind", "dtype", "device", "rel_err", "max_abs", "tol", "verdict", "compared", "failed")
FAILURE_KEYS = ("op", "oracle", "kind", "dtype", "device", "shape", "input_shapes", "trial", "input", "output",
                "rel_err", "max_abs", "tol", "note", "message")

MAX_FAILURES_SHOWN = 25


def _num(x: float) -> Optional[float]:
    return None if (math.isinf(x) or math.isnan(x)) else float(x)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.1e}")


def format_table(report: Report) -> str:
    header = ("op", "oracle pair", "dtype", "device", "rel err", "max abs", "tol", "verdict")
    lines = [header]
    for r in report.rows:
        lines.append((r.op, r.oracle, r.dtype, r.device, _fmt(r.rel_err) if r.compared else "-",
                      _fmt(r.max_abs) if r.compared else "-", f"{r.tol:.0e}", r.verdict))
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(header))]
    out = []
    for i, l in enumerate(lines):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_summary(report: Report) -> str:
    c = report.config
    compared = sum(r.compared for r in report.rows)
    n_fail = len(report.failures)
    out = []
    reasons = sorted({s["reason"] for s in report.skipped})
    if reasons:
        out.append("skipped:")
        out += [f"  - {r}" for r in reasons]
    if n_fail:
        out.append(f"DISAGREEMENTS ({n_fail}):")
        out += [f"  {f.message()}" for f in report.failures[:MAX_FAILURES_SHOWN]]
        if n_fail > MAX_FAILURES_SHOWN:
            out.append(f"  ... and {n_fail - MAX_FAILURES_SHOWN} more (write them all with --json PATH)")
    scope = (f"ops {','.join(c.ops)}; dtypes {','.join(c.dtypes)}; {len(report.shapes)} shapes x {c.trials} "
             f"trials; seed {c.seed}; device {c.device}; {report.elapsed:.1f} s")
    if n_fail:
        failing: Dict[tuple, set] = {}
        for f in report.failures:
            failing.setdefault((f.op, f.what().split(" (")[0]), set()).add(f.dtype)
        out.append(f"crosscheck: FAIL: {n_fail} of {compared} comparisons disagree ({scope})")
        out.append("failing: " + "; ".join(f"{op}: {w} [{', '.join(d for d in c.dtypes if d in failing[(op, w)])}]"
                                           for op, w in sorted(failing)))
    else:
        out.append(f"crosscheck: OK: all {compared} comparisons agree ({scope})")
    return "\n".join(out)


def _config_json(report_or_config) -> Dict[str, Any]:
    c = report_or_config
    return {"seed": c.seed, "trials": c.trials, "device": c.device, "dtypes": list(c.dtypes), "ops": list(c.ops),
            "frameworks": list(c.frameworks), "torch_impl": c.torch_impl_name or "torch_impl.attn",
            "jax_impl": c.jax_impl_name or "jax_impl.attn / jax_impl.attn_jvp",
            "tolerances": {k: c.tolerances[k] for k in c.tolerances}, "norm_floor": metrics.NORM_FLOOR}


def to_json(report: Report) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": "crosscheck", "exit_code": report.exit_code,
                           "ok": report.ok, "error": None}
    doc.update(_config_json(report.config))
    doc["shapes"] = [list(s) for s in report.shapes]
    doc["elapsed_seconds"] = round(report.elapsed, 3)
    doc["versions"] = dict(report.versions)
    doc["rows"] = [{"op": r.op, "oracle": r.oracle, "kind": r.kind, "dtype": r.dtype, "device": r.device,
                    "rel_err": _num(r.rel_err), "max_abs": _num(r.max_abs), "tol": r.tol, "verdict": r.verdict,
                    "compared": r.compared, "failed": r.failed} for r in report.rows]
    doc["failures"] = [{"op": f.op, "oracle": f.oracle, "kind": f.kind, "dtype": f.dtype, "device": f.device,
                        "shape": list(f.shape), "input_shapes": {n: list(s) for n, s in f.input_shapes_named()},
                        "trial": f.trial, "input": f.input, "output": f.output, "rel_err": _num(f.rel_err),
                        "max_abs": _num(f.max_abs), "tol": f.tol, "note": f.note, "message": f.message()}
                       for f in report.failures]
    doc["skipped"] = list(report.skipped)
    return {k: doc[k] for k in TOP_KEYS}


def error_json(config, message: str, versions: Dict[str, str]) -> Dict[str, Any]:
    """The ``--json`` document of a run that ended with exit code 2 (nothing judged)."""
    doc: Dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": "crosscheck", "exit_code": 2, "ok": False,
                           "error": message}
    doc.update(_config_json(config))
    doc.update({"shapes": [], "elapsed_seconds": 0.0, "versions": versions, "rows": [], "failures": [],
                "skipped": []})
    return {k: doc[k] for k in TOP_KEYS}
