"""The ``hint`` line: one table, observed pattern → cause → where in derivation.md.

For each framework whose own rows of op ``attn`` fail, the failures (and the review's findings) are reduced to
one :class:`Observed` pattern, and the first row of :data:`RULES` that matches it gives the hint: the rows run
from the most specific pattern to the least (docs/crosscheck.md, "What the closing lines say").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from .frameworks import BY_NAME, NAMES, get
from .metrics import dtype
from .oracles import Kind

__all__ = ["Observed", "Rule", "RULES", "EQ", "observe", "choose", "hint_text", "hint_lines", "only_when", "slips"]

Names = Tuple[str, ...]
O_A, O, A = ("o", "a"), ("o",), ("a",)          # attn's cotangent modes: both outputs, o alone, a alone
ATTN_INPUTS = ("q", "k", "v")                    # its inputs, in the order a backward returns their gradients

# derivation.md equation numbers per framework convention (torch: (9)-(13); JAX: (18)-(22), eq. (17) relates them):
# ``Framework.equations``
EQ = {name: fw.equations for name, fw in BY_NAME.items()}


@dataclass(frozen=True)
class Observed:
    """What failed in one framework's own rows of ``attn`` (never the cross-framework rows)."""

    fw: str
    forward: bool = False                        # the forward differs from the reference
    grads: FrozenSet[str] = frozenset()          # first order, every input requiring grad: failing gradients
    modes: FrozenSet[Names] = frozenset()        # ... the cotangent modes they fail in: ("o", "a"), ("o",), ("a",)
    dtypes: FrozenSet[str] = frozenset()         # ... and the dtypes
    jvp: bool = False                            # a JVP fails
    wrts: FrozenSet[Names] = frozenset()         # VJPs with only some inputs requiring grad that fail: their inputs
    second: bool = False                         # a second-order check fails
    review: Tuple[Tuple[str, str], ...] = ()     # the review's findings: (key, title)
    real_tested: bool = True                     # a real dtype was checked
    verb: str = "fails"                          # "raises TypeError" when every failure is one exception type
    # return-order slips, when they explain every first-order failure (:func:`slips`): (the input a returned
    # gradient stands for, the inputs whose expected gradient it agrees with / whose shape it has, how we know:
    # "matches" | "shape")
    slips: Tuple[Tuple[str, Tuple[str, ...], str], ...] = ()
    returned: Optional[Tuple[int, int]] = None   # (gradients returned, inputs): every first-order request raised so

    def found(self, key: str) -> Optional[str]:
        """The title of the review finding ``key``, or None."""
        return next((title for k, title in self.review if k == key), None)

    @property
    def second_only(self) -> bool:
        return self.second and not (self.forward or self.grads or self.jvp or self.wrts)

    @property
    def words(self):
        """The framework's words (``frameworks.Framework``)."""
        return get(self.fw)


@dataclass(frozen=True)
class Rule:
    key: str
    when: Callable[[Observed], bool]              # the observed pattern
    says: Callable[[Observed, Dict[str, str]], str]   # cause → equation (derivation.md numbers of the framework)
    first_order_vjp: bool = False                # a rule about the VJP: "; the JVP fails too" is appended


def _return_order(o: Observed, eq: Dict[str, str]) -> str:
    parts = []
    for position, whose, how in o.slips:
        grads = (" and " if how == "matches" else " or ").join(f"G_{n.upper()}" for n in whose)
        parts.append(f"what you return as g_{position} " + (f"matches {grads}" if how == "matches" else
                                                            f"has the shape of {grads}"))
    right = ("the gradients themselves agree with autodiff, as " if all(how == "matches" for _, _, how in o.slips)
             else "")
    return (f"your {o.words.backward} returns the gradients in the wrong order: {', '.join(parts)} → return "
            f"(G_Q, G_K, G_V), in the order of the inputs q, k, v; {right}{eq['all']}")


def _returns_count(o: Observed, eq: Dict[str, str]) -> str:
    got, inputs = o.returned
    return (f"your {o.words.backward} returns {got} gradient{'s' if got != 1 else ''} for {inputs} inputs → return "
            f"one per input, in their order (G_Q, G_K, G_V); section 5 and {eq['all']}")


RULES: Tuple[Rule, ...] = (
    Rule("returns_count", lambda o: o.returned is not None, _returns_count),
    Rule("return_order", lambda o: bool(o.slips), _return_order),
    Rule("a_not_differentiable", lambda o: o.found("a_not_differentiable") is not None,
         lambda o, eq: "a is returned non-differentiable (ctx.mark_non_differentiable(a), or a computed outside "
                       "autograd): a's cotangent never reaches backward, so the G_A term is lost in first and second "
                       f"order → return a as a differentiable output; {eq['ga']} and section 5"),
    Rule("forward", lambda o: o.forward, lambda o, eq: "the forward differs from the reference → (1)–(3)"),
    Rule("complex_only", lambda o: bool(o.grads) and o.real_tested and all(dtype(d).is_complex for d in o.dtypes),
         lambda o, eq: ("only complex dtypes fail → an extra conjugate (JAX's VJP has none), " + eq["all"]
                        + " and relation (17)") if o.words.conjugate_vjp else
         ("only complex dtypes fail → a missing conjugate, " + eq["all"]), True),
    Rule("v_only", lambda o: o.grads == {"v"}, lambda o, eq: f"only the gradient of v fails → G_V, {eq['v']}", True),
    Rule("both_cotangents", lambda o: bool(o.grads) and o.modes == {O_A},
         lambda o, eq: f"fails only when both cotangents arrive (o's alone and a's alone agree) → Ĝ_A = G_O "
                       f"V{'ᵀ' if o.words.conjugate_vjp else 'ᴴ'} + G_A keeps one of its two terms when both are "
                       f"present "
                       f"(the classic bug: G_A dropped once G_O arrives), {eq['ga']}", True),
    Rule("o_absent", lambda o: bool(o.grads) and o.modes == {A},
         lambda o, eq: f"fails only when o is unused (its cotangent is {o.words.unused}; with o's cotangent present it "
                       f"agrees) → the handling of an absent G_O in {eq['ga']} and section 5", True),
    Rule("one_absent", lambda o: bool(o.grads) and o.modes == {O, A},
         lambda o, eq: f"fails whenever one output is unused (its cotangent is {o.words.unused}; with both present it "
                       f"agrees) → the handling of an absent G_O or G_A in {eq['ga']} and section 5", True),
    Rule("a_absent", lambda o: bool(o.grads) and o.modes == {O},
         lambda o, eq: f"fails only when a is unused (its cotangent is {o.words.unused}; with a's cotangent present it "
                       f"agrees) → the handling of an absent G_A in {eq['ga']} and section 5", True),
    Rule("ga_term", lambda o: bool(o.grads) and o.grads <= {"q", "k"} and O not in o.modes and A in o.modes,
         lambda o, eq: f"fails only when a's cotangent is present (never with o's alone) → the G_A term of Ĝ_A, "
                       f"{eq['ga']}", True),
    Rule("tanh_factor", lambda o: o.grads == {"q", "k"},
         lambda o, eq: f"q and k fail, v agrees → {eq['qk']}, the tanh factor (1 − a²)", True),
    Rule("q_or_k", lambda o: o.grads in ({"q"}, {"k"}),
         lambda o, eq: f"only the gradient of {min(o.grads)} fails → G_{min(o.grads).upper()}, {eq[min(o.grads)]}",
         True),
    Rule("jvp_only", lambda o: o.jvp and not o.grads and not o.forward,
         lambda o, eq: "only the JVP fails → (14)–(16)"),
    Rule("subsets_only", lambda o: bool(o.wrts) and not (o.forward or o.grads or o.jvp),
         lambda o, eq: f"fails only {only_when(('q', 'k', 'v'), o.fw, o.wrts)} (every input {o.words.requiring} "
                       f"agrees) → {o.words.subset_cause}: section 5 (which gradient reads which saved tensor)"),
    Rule("once_differentiable", lambda o: o.second_only and o.found("not_twice_differentiable") is not None,
         lambda o, eq: "fails only in second order (first order agrees): the backward cannot be differentiated "
                       "(@once_differentiable, or gradients computed outside the graph) → section 9, (23)–(27)"),
    Rule("saves_intermediate", lambda o: o.second_only and o.found("saves_nxn") is not None,
         lambda o, eq: f"fails only in second order (first order agrees), and the review found it: "
                       f"\"{o.found('saves_nxn')}\" → a tensor the forward computed and saved (x = q kᵀ) is a "
                       f"constant to autograd, so tanh recomputed from it carries no dependence on q and k into "
                       f"the second derivative: save the output a instead (1 − a² needs no tanh); section 6 "
                       f"(point 3) and section 9, (23)–(27)"),
    Rule("second_only", lambda o: o.second_only,
         lambda o, eq: f"fails only in second order (first order agrees) → the backward is right but not "
                       f"differentiable as written: {o.words.second_order_culprit}; section 9, (23)–(27)"),
)


def choose(o: Observed) -> Optional[Rule]:
    """The most specific row matching ``o`` (the first one in table order), or None."""
    return next((rule for rule in RULES if rule.when(o)), None)


def hint_text(o: Observed) -> Optional[str]:
    rule = choose(o)
    if rule is None:
        return None
    text = rule.says(o, o.words.equations)
    if rule.first_order_vjp and o.jvp:
        text += "; the JVP fails too → (14)–(16)"
    return text.replace("fails only", o.verb + " only", 1)


# --- from a report --------------------------------------------------------------------------------------------------

def only_when(inputs, fw: str, wrts) -> str:
    """"when v does not require grad": the inputs missing from every failing subset (``wrts``: tuples of input
    names), else the subsets."""
    from .cases import subsets
    if set(wrts) >= set(subsets(inputs)[1:]):
        return "whenever some input " + get(fw).not_requires[0]
    missing = [n for n in inputs if all(n not in w for w in wrts)]
    if missing:
        return "when " + get(fw).missing(missing)
    return "with only " + " / only ".join(sorted(",".join(w) for w in wrts)) + " " + get(fw).requiring


def _verb(failures) -> str:
    """"raises UnboundLocalError" when every failure is a request that raised (errors of one type), else
    "fails"."""
    if not all(f.error for f in failures):
        return "fails"
    types = {f.error.type for f in failures}
    return f"raises {types.pop()}" if len(types) == 1 else "fails"


# a gradient of the wrong shape, or the wrong number of gradients, as each framework words it (the first line of
# its message, errors.Raised): torch's autograd.Function, JAX's custom_vjp
_SHAPE = (re.compile(r"invalid gradient at index \d+ - got \[([\d, ]*)\]"),
          re.compile(r"at output\[\d+\] the bwd rule produced an output of [\w/]+ \w+\[([\d,]*)\]"))
_COUNT = (re.compile(r"incorrect number of gradients \(expected (\d+), got (\d+)\)"),
          re.compile(r"but got bwd output structure PyTreeDef\(\(([*, ]*)\)\) for primal input structure "
                     r"PyTreeDef\(\(([*, ]*)\)\)"))


def _returned_count(f) -> Optional[Tuple[int, int]]:
    """(returned, inputs) of a request that raised for returning the wrong number of gradients, else None."""
    text = f.error.text if f.error else ""
    m = _COUNT[0].search(text)
    if m:
        return int(m.group(2)), int(m.group(1))
    m = _COUNT[1].search(text)
    return (m.group(1).count("*"), m.group(2).count("*")) if m else None


def _shape_of(f) -> Optional[Tuple[str, ...]]:
    """A request that raised for a gradient of the wrong shape: the other inputs whose shape it has, else None."""
    m = next((m for p in _SHAPE for m in [p.search(f.error.text if f.error else "")] if m), None)
    if m is None or len(f.inputs) != 1:
        return None
    got = tuple(int(x) for x in re.findall(r"\d+", m.group(1)))    # the sizes the message names, in order
    whose = tuple(name for name, shape in f.input_shapes_named() if tuple(shape) == got and name != f.inputs[0])
    return whose or None


def slips(first_order) -> Tuple[Tuple[str, Tuple[str, ...], str], ...]:
    """The return-order slips that explain EVERY failure in ``first_order`` (first-order VJP comparisons of one
    framework's own rows), else (): each failing gradient agrees with another input's expected gradient
    (``Comparison.matches``) or raised for having another input's shape.  Per returned position, the inputs it
    agrees with on every failure (by numbers where any were compared, else by shape)."""
    numbers: Dict[str, set] = {}
    shapes: Dict[str, set] = {}
    for f in first_order:
        if f.error:
            whose = _shape_of(f)
            if whose is None:
                return ()
            shapes.setdefault(f.inputs[0], set(whose)).intersection_update(whose)
        elif f.matches == ("0",):
            continue                                 # zero where another input's gradient is zero: no evidence
        elif f.matches and len(f.inputs) == 1:
            numbers.setdefault(f.inputs[0], set(f.matches)).intersection_update(f.matches)
        else:
            return ()
    out = []
    for position in sorted(set(numbers) | set(shapes), key=ATTN_INPUTS.index):
        whose, how = (numbers[position], "matches") if position in numbers else (shapes[position], "shape")
        if not whose:
            return ()                                # agrees with different inputs on different cases
        out.append((position, tuple(sorted(whose, key=ATTN_INPUTS.index)), how))
    return tuple(out)


def observe(report, fw: str) -> Optional[Observed]:
    """The pattern of ``fw``'s own failures of op attn in ``report`` (None if it has none)."""
    # the entry's own failures: not a cross-framework pair, not a sharded candidate (its hints would point at the
    # single-device formulas; its failures name their layout instead)
    own = [f for f in report.failures if f.op == "attn" and f.framework == fw and not f.cross and not f.candidate]
    if not own:
        return None
    default = [f for f in own if not f.kind.second_order and not f.wrt]
    vjp = [f for f in default if f.kind is Kind.VJP]
    review = report.reviews.get(fw)
    first_order = [f for f in own if f.kind is Kind.VJP]
    counts = {_returned_count(f) for f in first_order}
    returned = counts.pop() if len(counts) == 1 and first_order else None
    return Observed(
        fw=fw, forward=any(f.kind is Kind.FORWARD for f in default), grads=frozenset(n for f in vjp for n in f.inputs),
        modes=frozenset(f.outputs for f in vjp), dtypes=frozenset(f.dtype for f in vjp),
        jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind is Kind.VJP and f.wrt),
        second=any(f.kind.second_order for f in own),
        review=tuple((f.key, f.title) for f in review.findings) if review is not None else (),
        real_tested=any(not dtype(d).is_complex for d in report.config.dtypes), verb=_verb(own),
        slips=slips(first_order), returned=returned)


def hint_lines(report) -> List[str]:
    """``hint (fw, impl): ... in derivation.md``, one per framework whose own rows of attn fail."""
    texts = {fw: hint_text(o) for fw in NAMES for o in [observe(report, fw)] if o is not None}
    return [f"hint ({fw}, {report.config.impl_name(fw) or get(fw).entry}): {text} in derivation.md"
            for fw, text in texts.items() if text]
