"""Comparison of one case's results: which oracle pairs are compared, and the rows and failures they produce."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import metrics
from .frameworks import get
from .parts import Failed, Skip, np_tuple
from .results import Comparison, Config, Oracle, Row
from .specs import OpSpec, Side

__all__ = ["Collector", "compare_case", "truth", "jacrev_size", "subset_oracle"]

def subset_oracle(fw: str, who: str = "") -> str:
    return f"{who or fw} hand VJP (input subsets) vs {get(fw).autodiff['vjp']}(ref)"


def _own(fw: str, label: str, candidate: str = "") -> Oracle:
    return Oracle(label, fw, candidate=candidate)


class Collector:
    def __init__(self, config: Config):
        self.config = config
        self.rows: Dict[Tuple[str, str, str], Row] = {}
        self.failures: List[Comparison] = []
        self.skipped: Dict[Tuple[str, str, str, str], None] = {}

    def row(self, op, oracle: Oracle, kind, dtype) -> Row:
        key = (op, oracle.label, dtype)
        if key not in self.rows:
            self.rows[key] = Row(op, oracle.label, kind, dtype, self.config.device, self.config.tolerances[dtype],
                                 framework=oracle.framework, cross=oracle.cross)
        return self.rows[key]

    def skip(self, op, oracle: Oracle, kind, dtype, reason):
        self.row(op, oracle, kind, dtype)
        self.skipped[(op, oracle.label, dtype, reason)] = None

    def compare(self, spec: OpSpec, case_info, oracle: Oracle, kind: str, actual, expected, mode_label: str,
                labels: Sequence[str], wrt: Optional[Sequence[str]] = None):
        """Compare one result tuple against another, element by element (per gradient / per output);
        ``oracle.symmetric``: neither is the reference (see ``metrics.diff``).  ``wrt``: for a VJP with only
        these inputs requiring grad / differentiated — the others must come back absent (``None``)."""
        dtype = case_info[0]
        row = self.row(spec.name, oracle, kind, dtype)
        for value in (expected, actual):
            if isinstance(value, Skip):
                self.skip(spec.name, oracle, kind, dtype, value.reason)
                return
        wrt_label = "" if wrt is None or len(wrt) == len(spec.inputs) else ",".join(wrt)
        if isinstance(actual, Failed):                 # the request raised: one failure for the whole request
            self._record(row, spec, case_info, oracle, kind, *self._raised_labels(spec, kind, actual, mode_label,
                                                                                  labels, wrt),
                         metrics.Diff(math.inf, math.inf), f"hand-written {_KIND_NAMES[kind]} {actual.text}",
                         wrt_label, actual.error)
            return
        for i, label in enumerate(labels):
            if wrt is not None and label not in wrt:
                if actual[i] is None:
                    continue                         # absent, as asked: nothing to compare
                d = metrics.Diff(math.inf, math.inf, "a gradient not asked for was computed (expected None)")
            else:
                d = metrics.diff(actual[i], expected[i], oracle.symmetric)
            if kind == "forward":
                inp, out = "-", label
            elif kind == "jvp":
                inp, out = mode_label, label
            else:
                inp, out = label, mode_label
            self._record(row, spec, case_info, oracle, kind, inp, out, d, d.note, wrt_label)

    @staticmethod
    def _raised_labels(spec: OpSpec, kind: str, failed: Failed, mode_label: str, labels, wrt) -> Tuple[str, str]:
        """(input, output) of a request that raised: every gradient it was asked for (or the one the error
        names, e.g. a gradient of the wrong shape), with its cotangent / tangent mode."""
        if kind == "jvp":
            return mode_label, ",".join(labels)
        asked = [n for n in labels if wrt is None or n in wrt]
        if failed.index is not None:                   # parts.Failed keeps only the index of an input
            asked = [labels[failed.index]]
        return ",".join(asked), mode_label

    def _record(self, row: Row, spec: OpSpec, case_info, oracle: Oracle, kind: str, inp: str, out: str, d,
                note: str, wrt_label: str, error: str = "") -> None:
        dtype, shape, trial, input_shapes = case_info
        c = Comparison(spec.name, oracle.label, kind, dtype, self.config.device, shape, input_shapes, trial, inp, out,
                       d.rel_err, d.max_abs, row.tol, note, wrt_label, error, oracle.framework, oracle.cross,
                       oracle.candidate)
        row.compared += 1
        row.rel_err = max(row.rel_err, d.rel_err) if not math.isnan(d.rel_err) else math.inf
        row.max_abs = max(row.max_abs, d.max_abs) if not math.isnan(d.max_abs) else math.inf
        if not c.ok:
            row.failed += 1
            self.failures.append(c)


_KIND_NAMES = {"forward": "forward", "vjp": "VJP", "jvp": "JVP", "vjp_vjp": "VJP of VJP", "hvp": "HVP"}


def jacrev_size(spec: OpSpec, case, shape, dtype: str) -> int:
    n, d, e = shape
    in_numel = sum(x.size for x in case.inputs)
    out_numel = sum(int(np.prod(s)) for s in spec.output_shapes(n, d, e))
    return in_numel * out_numel * (4 if metrics.dtype(dtype).is_complex else 1)


def truth(spec: OpSpec, case, dtype: str) -> Dict[str, object]:
    """float64/complex128 ground truth on CPU: torch.func of the torch reference, on the same numbers upcast."""
    from . import torch_oracles as O
    ref = spec.torch_side().reference if not spec.replaceable else __import__("torch_impl").attn_reference
    wide = metrics.dtype(dtype).truth
    up = lambda x: None if x is None else O.to_native(x.astype(wide), "cpu")
    inputs = tuple(up(x) for x in case.inputs)
    cots = [tuple(up(c) for c in cs) for cs in case.cots]
    tans = [tuple(up(t) for t in ts) for ts in case.tans]
    return {"forward": np_tuple(ref(*inputs), O.to_numpy),
            "vjp": [np_tuple(r, O.to_numpy) for r in O.ref_vjp(ref, inputs, cots)],
            "jvp": [np_tuple(r, O.to_numpy) for r in O.ref_jvp(ref, inputs, tans)]}


def compare_case(col: Collector, spec: OpSpec, sides: Dict[str, Side], case, dtype: str, shape, trial: int,
                 results: Dict[str, Dict[str, object]], jac_elems: int) -> None:
    n, d, e = shape
    info = (dtype, shape, trial, spec.input_shapes(n, d, e))
    F, V, J = "forward", "vjp", "jvp"
    outs_label = ",".join(spec.outputs)
    n_modes = len(case.cot_modes)
    for fw, r in results.items():
        names = get(fw).autodiff
        cand = sides[fw].candidate
        who = cand or fw                               # the candidate's name in its oracle labels
        if sides[fw].reference_only:
            continue                                   # only the other side's rows compare with it
        if sides[fw].forward_is_hand:
            col.compare(spec, info, _own(fw, f"{who} impl vs {fw} reference", cand), F, r["forward"],
                        r["forward_ref"], "", spec.outputs)
        # every request: (inputs requiring grad, cotangent mode); all inputs first (the first n_modes requests)
        for (wrt, m), got in zip(case.vjp_requests, r["vjp"]):
            all_inputs = len(wrt) == len(spec.inputs)
            label = f"{who} hand VJP vs {names['vjp']}(ref)" if all_inputs else subset_oracle(fw, who)
            oracle = _own(fw, label, cand)
            col.compare(spec, info, oracle, V, got, r["vjp_ref"][m], ",".join(case.cot_modes[m]), spec.inputs,
                        wrt=None if all_inputs else wrt)
        if "vjp_jac" in r:
            for m, got, want in zip(case.cot_modes, r["vjp"][:n_modes], r["vjp_jac"]):
                col.compare(spec, info, _own(fw, f"{who} hand VJP vs {names['jac']}(ref)", cand), V,
                            reported(got, fw, "VJP"), want, ",".join(m), spec.inputs)
        else:
            col.skip(spec.name, _own(fw, f"{who} hand VJP vs {names['jac']}(ref)", cand), V, dtype,
                     f"Jacobian of {jac_elems} elements (empty, or above --jacrev-max-elements)")
        for m, got, want in zip(case.tan_modes, r["jvp"], r["jvp_ref"]):
            col.compare(spec, info, _own(fw, f"{who} hand JVP vs {names['jvp']}(ref)", cand), J, got, want,
                        ",".join(m), spec.outputs)
        if "vjp_vjp" in r:
            labels = tuple(spec.inputs) + tuple(f"g_{o}" for o in spec.outputs)
            col.compare(spec, info, _own(fw, f"{who} hand VJP of VJP vs {names['vjp_vjp']}", cand), "vjp_vjp",
                        r["vjp_vjp"][0], r["vjp_vjp_ref"][0], outs_label, labels)
        if "hvp" in r:
            col.compare(spec, info, _own(fw, f"{who} hand HVP vs {names['hvp']}", cand), "hvp", r["hvp"][0],
                        r["hvp_ref"][0], outs_label, spec.inputs)
    if "torch" in results and "jax" in results:
        _compare_frameworks(col, spec, sides, case, info, results)
    if metrics.dtype(dtype).low_precision:
        t = truth(spec, case, dtype)
        wide = metrics.dtype(dtype).truth
        for fw, r in results.items():
            if sides[fw].reference_only:
                continue
            col.compare(spec, info, _own(fw, f"{fw} vs {wide} truth"), F, r["forward"], t["forward"], "", spec.outputs)
            for m, got, want in zip(case.cot_modes, r["vjp"][:n_modes], t["vjp"]):
                col.compare(spec, info, _own(fw, f"{fw} hand VJP vs {wide} truth"), V, reported(got, fw, "VJP"), want,
                            ",".join(m), spec.inputs)
            for m, got, want in zip(case.tan_modes, r["jvp"], t["jvp"]):
                col.compare(spec, info, _own(fw, f"{fw} hand JVP vs {wide} truth"), J, reported(got, fw, "JVP"), want,
                            ",".join(m), spec.outputs)


def reported(value, fw: str, what: str):
    """A request that raised is one failure, in its first oracle's row; the other rows skip it."""
    if isinstance(value, Failed):
        return Skip(f"the {get(fw).short} hand {what} raised (reported in its own rows)")
    return value


def _compare_frameworks(col: Collector, spec: OpSpec, sides: Dict[str, Side], case, info, results) -> None:
    """torch against JAX on the same numbers: forward, first-order VJPs (every input requiring grad, eq. (17))
    and JVPs.  The reference (denominator of rel err) is the project's side when the other is the user's: a
    wrong user gradient near zero must not blow the relative error up.  The user's side is labelled "(yours)"."""
    F, V, J = "forward", "vjp", "jvp"
    actual, expected = ("jax", "torch") if (sides["jax"].user and not sides["torch"].user) else ("torch", "jax")
    label = {fw: fw + (" (yours)" if sides[fw].user else "") for fw in ("torch", "jax")}
    got_r, want_r = results[actual], results[expected]
    both_user = sides["torch"].user and sides["jax"].user      # no trusted side: divide by the larger norm

    def name(what: str) -> Oracle:
        if not what:
            text = f"{label[actual]} vs {label[expected]}" + (" reference" if sides[expected].reference_only else "")
            return Oracle(text, actual, cross=True, symmetric=both_user)
        theirs = (f"{expected}.{what.lower()}(ref)" if sides[expected].reference_only else
                  f"{expected} hand {what}{' (yours)' if sides[expected].user else ''}")
        return Oracle(f"{actual} hand {what}{' (yours)' if sides[actual].user else ''} vs {theirs}"
                      + (" (eq. 17)" if what == "VJP" else ""), actual, cross=True, symmetric=both_user)

    col.compare(spec, info, name(""), F, got_r["forward"], want_r["forward"], "", spec.outputs)
    n_modes = len(case.cot_modes)
    ref_only = sides[expected].reference_only
    for what, kind, modes, labels, count in (("VJP", V, case.cot_modes, spec.inputs, n_modes),
                                             ("JVP", J, case.tan_modes, spec.outputs, len(case.tan_modes))):
        theirs = want_r[kind + "_ref"] if ref_only else want_r[kind]
        for m, got, want in zip(modes, got_r[kind][:count], theirs[:count]):
            col.compare(spec, info, name(what), kind, reported(got, actual, what), reported(want, expected, what),
                        ",".join(m), labels)
