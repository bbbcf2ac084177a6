"""Comparison of one case's results: which oracle pairs are compared, and the rows and failures they produce."""

from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import metrics
from .frameworks import NAMES, get
from .oracles import Kind, Oracle, Party
from .parts import CaseResults, Failed, Skip, np_tuple
from .config import Config
from .results import CaseInfo, Comparison, Row, Skipped
from .specs import OpSpec, Side

__all__ = ["Collector", "compare_case", "truth", "Truth", "jacrev_size", "subset_oracle", "own_oracle", "case_info",
           "second_order_skips"]

Names = Tuple[str, ...]


def own_oracle(fw: str, kind: Kind, what: str, against: Party, candidate: str = "", yours: bool = False) -> Oracle:
    """A pair of one framework's own: its entry (or ``candidate``) ``what`` ("hand VJP") vs ``against``."""
    return Oracle(kind, fw, Party(candidate or fw, what, yours), against, candidate=candidate)


def autodiff(fw: str, key: str) -> Party:
    """The framework's autodiff of the reference: ``torch.func.vjp(ref)``; second order: ``jax.vjp(vjp(ref))``."""
    name = get(fw).autodiff[key]
    return Party(name if key in ("vjp_vjp", "hvp") else f"{name}(ref)")


def subset_oracle(fw: str, who: str = "", yours: bool = False) -> Oracle:
    """The pair of the VJP requests with only some inputs requiring grad / differentiated."""
    return own_oracle(fw, Kind.VJP, "hand VJP (input subsets)", autodiff(fw, "vjp"), who, yours)


def case_info(spec: OpSpec, dtype: str, shape, trial: int) -> CaseInfo:
    return CaseInfo(dtype, tuple(shape), trial, spec.input_shapes(*shape), spec.inputs, spec.outputs)


class Collector:
    def __init__(self, config: Config):
        self.config = config
        self.rows: Dict[Tuple[str, Oracle, str], Row] = {}
        self.failures: List[Comparison] = []
        self.skipped: Dict[Skipped, None] = {}

    def row(self, op: str, oracle: Oracle, dtype: str) -> Row:
        key = (op, oracle, dtype)
        if key not in self.rows:
            self.rows[key] = Row(op, oracle, dtype, self.config.device, self.config.tolerances[dtype])
        return self.rows[key]

    def skip(self, op: str, oracle: Oracle, dtype: str, reason: str) -> None:
        self.row(op, oracle, dtype)
        self.skipped[Skipped(op, oracle, dtype, reason)] = None

    def compare(self, spec: OpSpec, info: CaseInfo, oracle: Oracle, actual, expected, mode: Names,
                labels: Sequence[str], wrt: Optional[Sequence[str]] = None):
        """Compare one result tuple against another, element by element (per gradient / per output);
        ``oracle.symmetric``: neither is the reference (see ``metrics.diff``).  ``mode``: the cotangent (tangent)
        mode, the outputs (inputs) carrying one.  ``wrt``: for a VJP with only these inputs requiring grad /
        differentiated — the others must come back absent (``None``)."""
        row = self.row(spec.name, oracle, info.dtype)
        for value in (expected, actual):
            if isinstance(value, Skip):
                self.skip(spec.name, oracle, info.dtype, value.reason)
                return
        subset = () if wrt is None or len(wrt) == len(spec.inputs) else tuple(wrt)
        if isinstance(actual, Failed):                 # the request raised: one failure for the whole request
            self.record(row, spec, info, oracle, *self._raised_names(oracle.kind, actual, mode, labels, wrt),
                        metrics.Diff(math.inf, math.inf), f"hand-written {oracle.kind.title} {actual.text}", subset,
                        actual.error)
            return
        for i, label in enumerate(labels):
            matches: Names = ()
            if wrt is not None and label not in wrt:
                if actual[i] is None:
                    continue                         # absent, as asked: nothing to compare
                d = metrics.Diff(math.inf, math.inf, "a gradient not asked for was computed (expected None)")
            else:
                d = metrics.diff(actual[i], expected[i], oracle.symmetric)
                if not d.rel_err <= row.tol:
                    matches = self._matches(oracle, actual, expected, i, labels, row.tol)
            if oracle.kind is Kind.FORWARD:
                inp, out = (), (label,)
            elif oracle.kind is Kind.JVP:
                inp, out = tuple(mode), (label,)
            else:
                inp, out = (label,), tuple(mode)
            self.record(row, spec, info, oracle, inp, out, d, d.note, subset, matches=matches)

    @staticmethod
    def _matches(oracle: Oracle, actual, expected, i: int, labels, tol: float) -> Names:
        """A first-order VJP's failing gradient ``i``: the other inputs whose expected gradient it agrees with
        (the gradients returned in the wrong order), where the shapes allow it; ``("0",)`` when the only ones it
        agrees with are zero (a zero or absent gradient returned where another input's gradient is zero proves no
        slip); () else, and for any other kind (``Comparison.matches``)."""
        if oracle.kind is not Kind.VJP:
            return ()
        if actual[i] is None:                          # absent (zero), of no shape: like any zero gradient
            agree = [j for j in range(len(labels)) if j != i and not np.any(expected[j])]
        else:
            agree = [j for j in range(len(labels)) if j != i and np.shape(actual[i]) == np.shape(expected[j])
                     and metrics.diff(actual[i], expected[j], oracle.symmetric).rel_err <= tol]
        nonzero = tuple(labels[j] for j in agree if np.any(expected[j] != 0))
        return nonzero or (("0",) if agree else ())

    @staticmethod
    def _raised_names(kind: Kind, failed: Failed, mode: Names, labels, wrt) -> Tuple[Names, Names]:
        """(inputs, outputs) of a request that raised: every gradient it was asked for (or the one the error
        names, e.g. a gradient of the wrong shape), with its cotangent / tangent mode."""
        if kind is Kind.JVP:
            return tuple(mode), tuple(labels)
        asked = [n for n in labels if wrt is None or n in wrt]
        if failed.index is not None:                   # parts.Failed keeps only the index of an input
            asked = [labels[failed.index]]
        return tuple(asked), tuple(mode)

    def record(self, row: Row, spec: OpSpec, info: CaseInfo, oracle: Oracle, inputs: Names, outputs: Names, d,
               note: str, wrt: Names = (), error=None, matches: Names = ()) -> None:
        """One comparison into ``row`` (and the failures when it fails)."""
        c = Comparison(spec.name, oracle, info, self.config.device, inputs, outputs, d.rel_err, d.max_abs, row.tol,
                       note, wrt, error, matches)
        row.compared += 1
        row.rel_err = max(row.rel_err, d.rel_err) if not math.isnan(d.rel_err) else math.inf
        row.max_abs = max(row.max_abs, d.max_abs) if not math.isnan(d.max_abs) else math.inf
        if not c.ok:
            row.failed += 1
            self.failures.append(c)


def jacrev_size(spec: OpSpec, case, shape, dtype: str) -> int:
    n, d, e = shape
    in_numel = sum(x.size for x in case.inputs)
    out_numel = sum(int(np.prod(s)) for s in spec.output_shapes(n, d, e))
    return in_numel * out_numel * (4 if metrics.dtype(dtype).is_complex else 1)


class Truth(NamedTuple):
    """The ground truth of a case: the forward's outputs, one VJP per cotangent mode, one JVP per tangent subset."""

    forward: tuple
    vjp: list
    jvp: list


def truth(spec: OpSpec, case, dtype: str) -> Truth:
    """float64/complex128 ground truth on CPU: torch.func of the torch reference, on the same numbers upcast."""
    from . import torch_oracles as O
    ref = spec.torch_side().reference if not spec.replaceable else __import__("torch_impl").attn_reference
    wide = metrics.dtype(dtype).truth
    up = lambda x: None if x is None else O.to_native(x.astype(wide), "cpu")
    inputs = tuple(up(x) for x in case.inputs)
    cots = [tuple(up(c) for c in cs) for cs in case.cots]
    tans = [tuple(up(t) for t in ts) for ts in case.tans]
    return Truth(np_tuple(ref(*inputs), O.to_numpy), [np_tuple(r, O.to_numpy) for r in O.ref_vjp(ref, inputs, cots)],
                 [np_tuple(r, O.to_numpy) for r in O.ref_jvp(ref, inputs, tans)])


def compare_case(col: Collector, spec: OpSpec, sides: Dict[str, Side], case, dtype: str, shape, trial: int,
                 results: Dict[str, CaseResults], jac_elems: int) -> None:
    info = case_info(spec, dtype, shape, trial)
    for fw, r in results.items():
        if not sides[fw].reference_only:               # a reference-only side: the other side's rows compare with it
            _compare_own(col, spec, sides[fw], fw, case, info, r, jac_elems)
    if all(fw in results for fw in NAMES):
        _compare_frameworks(col, spec, sides, case, info, results)
    if metrics.dtype(dtype).low_precision:
        _compare_truth(col, spec, sides, case, info, results)


def _compare_own(col: Collector, spec: OpSpec, side: Side, fw: str, case, info: CaseInfo, r: CaseResults,
                 jac_elems: int) -> None:
    """A framework's (or candidate's) own rows: each hand-written part against its autodiff oracle."""
    cand, yours = side.candidate, side.user

    def own(kind: Kind, what: str, against: Party) -> Oracle:
        return own_oracle(fw, kind, what, against, cand, yours)

    n_modes = len(case.cot_modes)
    if side.forward_is_hand:
        col.compare(spec, info, own(Kind.FORWARD, "impl", Party(fw, "reference")), r.forward, r.forward_ref, (),
                    spec.outputs)
    # every request: (inputs requiring grad, cotangent mode); all inputs first (the first n_modes requests)
    for (wrt, m), got in zip(case.vjp_requests, r.vjp):
        all_inputs = len(wrt) == len(spec.inputs)
        oracle = own(Kind.VJP, "hand VJP", autodiff(fw, "vjp")) if all_inputs else subset_oracle(fw, cand, yours)
        col.compare(spec, info, oracle, got, r.vjp_ref[m], case.cot_modes[m], spec.inputs,
                    wrt=None if all_inputs else wrt)
    jac = own(Kind.VJP, "hand VJP", autodiff(fw, "jac"))
    if r.vjp_jac is not None:
        for m, got, want in zip(case.cot_modes, r.vjp[:n_modes], r.vjp_jac):
            col.compare(spec, info, jac, reported(got, fw, Kind.VJP), want, m, spec.inputs)
    else:
        col.skip(spec.name, jac, info.dtype, f"Jacobian of {jac_elems} elements (empty, or above "
                                             f"--jacrev-max-elements)")
    for m, got, want in zip(case.tan_modes, r.jvp, r.jvp_ref):
        col.compare(spec, info, own(Kind.JVP, "hand JVP", autodiff(fw, "jvp")), got, want, m, spec.outputs)
    if r.vjp_vjp is not None:
        labels = tuple(spec.inputs) + tuple(f"g_{o}" for o in spec.outputs)
        col.compare(spec, info, own(Kind.VJP_VJP, "hand VJP of VJP", autodiff(fw, "vjp_vjp")), r.vjp_vjp[0],
                    r.vjp_vjp_ref[0], spec.outputs, labels)
    if r.hvp is not None:
        col.compare(spec, info, own(Kind.HVP, "hand HVP", autodiff(fw, "hvp")), r.hvp[0], r.hvp_ref[0],
                    spec.outputs, spec.inputs)


def _compare_truth(col: Collector, spec: OpSpec, sides: Dict[str, Side], case, info: CaseInfo,
                   results: Dict[str, CaseResults]) -> None:
    """float32 / complex64: every framework's forward, VJPs and JVPs against the double-precision truth."""
    t = truth(spec, case, info.dtype)
    wide = Party(f"{metrics.dtype(info.dtype).truth} truth")
    n_modes = len(case.cot_modes)
    for fw, r in results.items():
        if sides[fw].reference_only:
            continue
        yours = sides[fw].user
        col.compare(spec, info, own_oracle(fw, Kind.FORWARD, "", wide, yours=yours), r.forward, t.forward, (),
                    spec.outputs)
        for m, got, want in zip(case.cot_modes, r.vjp[:n_modes], t.vjp):
            col.compare(spec, info, own_oracle(fw, Kind.VJP, "hand VJP", wide, yours=yours),
                        reported(got, fw, Kind.VJP), want, m, spec.inputs)
        for m, got, want in zip(case.tan_modes, r.jvp, t.jvp):
            col.compare(spec, info, own_oracle(fw, Kind.JVP, "hand JVP", wide, yours=yours),
                        reported(got, fw, Kind.JVP), want, m, spec.outputs)


def reported(value, fw: str, kind: Kind):
    """A request that raised is one failure, in its first oracle's row; the other rows skip it."""
    if isinstance(value, Failed):
        return Skip(f"the {get(fw).short} hand {kind.title} raised (reported in its own rows)")
    return value


def _compare_frameworks(col: Collector, spec: OpSpec, sides: Dict[str, Side], case, info: CaseInfo,
                        results: Dict[str, CaseResults]) -> None:
    """torch against JAX on the same numbers: forward, first-order VJPs (every input requiring grad, eq. (17))
    and JVPs.  The reference (denominator of rel err) is the project's side when the other is the user's: a
    wrong user gradient near zero must not blow the relative error up.  The user's side is labelled "(yours)"."""
    first, second = NAMES
    actual, expected = (second, first) if sides[second].user and not sides[first].user else (first, second)
    got_r, want_r = results[actual], results[expected]
    both_user = sides[first].user and sides[second].user      # no trusted side: divide by the larger norm
    ref_only = sides[expected].reference_only

    def pair(kind: Kind, what: str) -> Oracle:
        mine = Party(actual, what, sides[actual].user)
        if not what:
            theirs = Party(expected, "reference" if ref_only else "", sides[expected].user)
        else:
            theirs = (autodiff(expected, kind.value) if ref_only else Party(expected, what, sides[expected].user))
        return Oracle(kind, actual, mine, theirs, cross=True, symmetric=both_user)

    col.compare(spec, info, pair(Kind.FORWARD, ""), got_r.forward, want_r.forward, (), spec.outputs)
    n_modes = len(case.cot_modes)
    for kind, modes, labels, count in ((Kind.VJP, case.cot_modes, spec.inputs, n_modes),
                                       (Kind.JVP, case.tan_modes, spec.outputs, len(case.tan_modes))):
        mine = got_r.vjp if kind is Kind.VJP else got_r.jvp
        theirs = ((want_r.vjp_ref if kind is Kind.VJP else want_r.jvp_ref) if ref_only else
                  (want_r.vjp if kind is Kind.VJP else want_r.jvp))
        for m, got, want in zip(modes, mine[:count], theirs[:count]):
            col.compare(spec, info, pair(kind, f"hand {kind.title}"), reported(got, actual, kind),
                        reported(want, expected, kind), m, labels)


def second_order_skips(col: Collector, spec: OpSpec, side: Side, case, dtype: str, fw: str) -> None:
    """The second-order rows of a side without second order (``Side.second_order_missing``): skipped, with the
    refusal, on the case's path shapes (where second order is checked)."""
    if not (side.second_order_missing and case.all_paths):
        return
    for kind, what in ((Kind.VJP_VJP, "hand VJP of VJP"), (Kind.HVP, "hand HVP")):
        col.skip(spec.name, own_oracle(fw, kind, what, autodiff(fw, kind.value), side.candidate), dtype,
                 side.second_order_missing)
