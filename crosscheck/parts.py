"""The parts one framework computes for a case (forward, hand-written derivatives on every path, autodiff
oracles), how a failing part is recorded, and the conversion of the results to numpy.

A part is a function ``(inputs, cotangents per mode, tangents per subset, (g, w, t))`` → raw result: a tuple
for the forward parts, a list of tuples (one per VJP request / tangent subset / second-order check) for the
others.  The same functions run eagerly (torch, ``EagerExecutor``) and inside one jitted program (JAX,
``jax_executor``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

from .errors import ImplError, Raised
from .frameworks import eq17, get
from .specs import OpSpec, Side

__all__ = ["Failed", "Skip", "parts", "impl_error", "evaluate", "to_numpy_results", "np_tuple", "outputs",
           "EagerExecutor", "Part", "CaseResults", "Outcome"]

Part = Union[Callable, List[Callable]]             # one callable, or one per request (the hand-written parts)


class Failed:
    """A hand-written derivative that raised: recorded as a disagreement, not a crash."""

    def __init__(self, exc: BaseException, inputs: Sequence[str]):
        # torch: "returned an invalid gradient at index 1 - got [2, 5] ..."; JAX: "... at output[1] the bwd rule ..."
        m = re.search(r"at index (\d+)", str(exc)) or re.search(r"at output\[(\d+)\]", str(exc))
        self._set(Raised.of(exc), int(m.group(1)) if m and int(m.group(1)) < len(inputs) else None)

    @classmethod
    def from_error(cls, error: Raised) -> "Failed":
        """A case that raised in another process (``--shards``' ranks, ``--kernels``' subprocess): recorded as a
        whole, no input singled out."""
        failed = cls.__new__(cls)
        failed._set(error, None)
        return failed

    def _set(self, error: Raised, index: Optional[int]) -> None:
        self.error = error
        self.text = f"raised {error.text}"
        self.index = index                             # the input a wrong-shaped gradient names, or None


class Skip:
    def __init__(self, reason: str):
        self.reason = reason


@dataclass
class CaseResults:
    """One framework's numpy results of one case, per part (the names of :func:`parts`): the forward's outputs
    (tuples), and per request a result tuple, a ``Failed`` or a ``Skip`` (lists).  ``None``: a part not computed
    (``forward_ref``: the forward is not under test; ``vjp``: a reference-only side; ``vjp_jac``: Jacobian too
    large; the second-order parts: not on this case's path shapes, or no second order)."""

    forward: tuple
    vjp_ref: list
    jvp_ref: list
    jvp: list
    forward_ref: Optional[tuple] = None
    vjp: Optional[list] = None
    vjp_jac: Optional[list] = None
    vjp_vjp: Optional[list] = None
    vjp_vjp_ref: Optional[list] = None
    hvp: Optional[list] = None
    hvp_ref: Optional[list] = None


@dataclass
class Outcome:
    """A case run in another process (``--shards``' ranks and JAX subprocess, ``--kernels``' torch subprocess):
    its ``results``, or the ``error`` that left nothing of it to compare; torch's sharded ranks add ``inplace`` (the
    in-place probe's outcome per output: the gradients, or ``("raised", message)``) and ``ranks`` (how a rank ended
    differently from rank 0, or "": every rank ended alike; None: not asked, JAX's devices are one process)."""

    results: Optional[CaseResults] = None
    error: Optional[Raised] = None
    inplace: Optional[dict] = None
    ranks: Optional[str] = None


def parts(fw: str, side: Side, case, spec: OpSpec, do_jacrev: bool) -> Dict[str, Part]:
    """The parts of one case, in order.  The hand-written ones (vjp, jvp, vjp_vjp, hvp: raising is a disagreement)
    are lists with one callable per request (VJP request, tangent subset, second-order check), so a request that
    raises fails alone; the others (forward, oracles) are one callable each.  Second order is included on the
    case's path shapes."""
    O = get(fw).ops
    ref = side.reference
    second_order = case.all_paths
    out: Dict[str, Part] = {"forward": lambda x, c, t, s: outputs(side.forward(*x))}
    if side.forward_is_hand:
        out["forward_ref"] = lambda x, c, t, s: tuple(ref(*x))
    if not side.reference_only:
        out["vjp"] = [lambda x, c, t, s, mask=mask, m=m: side.vjp(x, [(mask, c[m])])[0]   # one request: inputs
                      for mask, m in case.request_masks(spec)]                          # of mask, cotangents m
    out["vjp_ref"] = lambda x, c, t, s: O.ref_vjp(ref, x, c)
    if do_jacrev and not side.reference_only:
        out["vjp_jac"] = lambda x, c, t, s: O.jacrev_vjp(ref, x, c)
    if side.jvp is not None:
        out["jvp"] = [lambda x, c, t, s, i=i: side.jvp(x, [t[i]])[0] for i in range(len(case.tans))]
    out["jvp_ref"] = lambda x, c, t, s: O.ref_jvp(ref, x, t)
    if side.vjp_vjp is not None and second_order:
        out["vjp_vjp"] = [lambda x, c, t, s: side.vjp_vjp(x, s[0], s[1])]
        out["vjp_vjp_ref"] = lambda x, c, t, s: [O.ref_vjp_vjp(ref, x, s[0], s[1])]
    if side.hvp is not None and second_order:
        out["hvp"] = [lambda x, c, t, s: side.hvp(x, s[0], s[2])]
        out["hvp_ref"] = lambda x, c, t, s: [O.ref_hvp(ref, x, s[0], s[2])]
    return out


def outputs(result) -> tuple:
    """The outputs of a forward as a tuple; a single tensor / array stays one output (not its rows)."""
    return (result,) if hasattr(result, "shape") else tuple(result)


def impl_error(side: Side, spec: OpSpec, shape, dtype: str, exc: BaseException, fw: str = "",
               inputs=None) -> ImplError:
    if side.user and fw and inputs is not None:       # a torch impl given to --jax-impl, or vice versa?
        from .impls import wrong_framework
        hint = wrong_framework(fw, side.forward, side.source, inputs)
        if hint:
            return ImplError(hint)
    n, d, e = shape
    return ImplError(f"{side.source} raised {type(exc).__name__}: {exc} — when called as {spec.name}"
                     f"({', '.join(spec.inputs)}) on {dtype} inputs of shapes "
                     f"{', '.join(str(s) for s in spec.input_shapes(n, d, e))} (to check only some dtypes or "
                     f"shapes, use --dtype / --shapes)")


def _plural(k: int, word: str) -> str:
    return word if k == 1 else word + "s"


def _check_forward_shapes(side: Side, spec: OpSpec, shape, outs) -> None:
    n, d, e = shape
    want = spec.output_shapes(n, d, e)
    got = tuple(tuple(getattr(o, "shape", ())) for o in outs)
    if got != want:                                    # got: one shape per output, so a count differs too
        raise ImplError(f"{side.source} returns wrong shapes: expected {len(want)} {_plural(len(want), 'output')} "
                        f"({', '.join(spec.outputs)}) of {_plural(len(want), 'shape')} {', '.join(map(str, want))} "
                        f"for inputs of shapes {', '.join(str(s) for s in spec.input_shapes(n, d, e))}, got "
                        + (f"{len(got)} {_plural(len(got), 'output')} of {_plural(len(got), 'shape')} "
                           f"{', '.join(map(str, got))}" if got else "no outputs (an empty sequence)")
                        + (f" (return the pair ({', '.join(spec.outputs)}), not one tensor)"
                           if len(got) == 1 and len(want) > 1 else ""))


def evaluate(fw: str, side: Side, spec: OpSpec, todo: Dict[str, Part], result: Callable, shape, dtype: str,
             inputs=None) -> Dict[str, object]:
    """The parts' raw results, ``result(name, i)`` giving part ``name``'s (of its request ``i``, or ``None`` for a
    part that is one callable), or raising: a hand-written request that raises becomes a recorded failure
    (``Failed``) of that request alone or, for a missing forward-mode rule (``JvpUnsupported``), a skip; a forward
    that raises is an ImplError (nothing can be checked); an oracle that raises is crosscheck's own bug."""
    raw: Dict[str, object] = {}
    for name, part in todo.items():
        if not isinstance(part, list):
            try:
                raw[name] = result(name, None)
            except Exception as exc:   # noqa: BLE001 - any failure of user code becomes a clear message
                if name == "forward":
                    raise impl_error(side, spec, shape, dtype, exc, fw, inputs) from None
                raise                                  # an oracle failing is crosscheck's own bug: show it
            continue
        raw[name] = []
        for i in range(len(part)):
            try:
                raw[name].append(result(name, i))
            except Exception as exc:   # noqa: BLE001 - any failure of user code becomes a recorded failure
                why = (str(exc).strip().splitlines() or [""])[0]
                hvp = ", which the forward-over-reverse HVP needs" if name == "hvp" else ""
                raw[name].append(Skip(f"{side.source} has no forward-mode (JVP) rule{hvp}: {why}")
                                 if isinstance(exc, get(fw).ops.JvpUnsupported) else Failed(exc, spec.inputs))
    return raw


def np_tuple(values, convert) -> tuple:
    return tuple(convert(v) for v in values)


# the parts whose results are one tuple (the others: a list, one tuple per request); the first-order VJPs
_SINGLE = ("forward", "forward_ref")
_FIRST_ORDER_VJPS = ("vjp", "vjp_ref", "vjp_jac")


def to_numpy_results(fw: str, side: Side, spec: OpSpec, raw: Dict[str, object], shape, dtype: str) -> CaseResults:
    """Check the forward's shapes, convert to numpy; first-order VJPs in PyTorch's convention (eq. (17), see
    ``frameworks``); second-order results stay in their framework's convention (they are compared within it)."""
    to_numpy, flip = get(fw).ops.to_numpy, get(fw).flips(dtype)
    _check_forward_shapes(side, spec, shape, raw["forward"])
    res: Dict[str, object] = {}
    for name, value in raw.items():
        if name in _SINGLE:
            res[name] = np_tuple(value, to_numpy)
        else:
            conj = flip and name in _FIRST_ORDER_VJPS
            res[name] = [r if isinstance(r, (Failed, Skip)) else eq17(np_tuple(r, to_numpy), conj) for r in value]
    res.setdefault("jvp", [Skip(side.jvp_missing)] * len(res["jvp_ref"]))
    return CaseResults(**res)


class EagerExecutor:
    """Runs a :class:`~crosscheck.cases.Job` eagerly, request by request (PyTorch): the same interface as
    ``jax_executor.JaxExecutor`` (``prefetch``, ``run``, ``close``), so the runner treats every framework alike."""

    def __init__(self, fw: str, device: str):
        self.fw, self.device = fw, device

    def prefetch(self, job) -> None:
        """Nothing to build ahead."""

    def close(self) -> None:
        """Nothing to release."""

    def run(self, job) -> CaseResults:
        """Numpy results of one op's case (VJPs in PyTorch's convention)."""
        ops, side, spec, case, dtype = get(self.fw).ops, job.side, job.spec, job.case, job.dtype
        conv = lambda xs: tuple(None if a is None else ops.to_native(a, self.device) for a in xs)
        args = (conv(case.inputs), [conv(cs) for cs in case.cots], [conv(ts) for ts in case.tans],
                tuple(conv(s) for s in case.second))
        todo = parts(self.fw, side, case, spec, job.do_jacrev)
        raw = evaluate(self.fw, side, spec, todo, lambda name, i: (todo[name] if i is None else todo[name][i])(*args),
                       case.shape, dtype, case.inputs)
        if not all(isinstance(o, ops.Array) for o in raw["forward"]):
            types = ", ".join(sorted({type(o).__module__.split(".")[0] + "." + type(o).__name__
                                      for o in raw["forward"]}))
            raise impl_error(side, spec, case.shape, dtype, TypeError(f"returned {types}, not {get(self.fw).arrays}"),
                             self.fw, case.inputs)
        return to_numpy_results(self.fw, side, spec, raw, case.shape, dtype)
