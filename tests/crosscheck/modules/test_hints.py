"""crosscheck.hints through its public entry points (``python -m mutation hints`` runs this file on each mutant):
the table's rows and where each one stops matching, the hint's words per framework, and ``observe`` /
``hint_lines`` on fabricated reports (a report's failures, reviews and config, as a run builds them).  Pure Python:
no torch or JAX import, well under a second."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from crosscheck.hints import RULES, Observed, choose, hint_lines, hint_text, observe, only_when
from crosscheck.results import Comparison, Config
from crosscheck.review.common import Finding, Review

QK, QKV = frozenset("qk"), frozenset("qkv")
ALL_MODES = frozenset({"o,a", "o", "a"})
NXN = ("saves_nxn", "saves an n x n tensor other than a for backward")
ONCE = ("not_twice_differentiable", "backward is not differentiable (no second order)")
RECOMPUTES = ("recomputes", "recomputes tanh in backward")


def _t(texts) -> frozenset:
    """Sets of names (cotangent modes, input subsets) written "o,a" for short: as the tuples crosscheck keeps."""
    return frozenset(tuple(t.split(",")) for t in texts)


def _o(**kw) -> Observed:
    kw.setdefault("fw", "torch")
    for name in ("grads", "modes", "wrts", "dtypes"):
        if name in kw:
            kw[name] = _t(kw[name]) if name in ("modes", "wrts") else frozenset(kw[name])
    kw.setdefault("dtypes", frozenset({"float64"}) if kw.get("grads") else frozenset())
    return Observed(**kw)


def _key(o: Observed):
    rule = choose(o)
    return None if rule is None else rule.key


# --- the record ------------------------------------------------------------------------------------------------------

def test_nothing_observed_gives_no_hint():
    o = Observed(fw="torch")
    assert hint_text(o) is None and choose(o) is None
    assert o.verb == "fails" and not o.second_only


def test_observed_and_rules_are_frozen_records():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _o().forward = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        RULES[0].key = "x"


def test_found_is_the_title_of_that_key_only():
    o = _o(review=(NXN, RECOMPUTES))
    assert o.found("saves_nxn") == NXN[1] and o.found("recomputes") == RECOMPUTES[1]
    assert o.found("a_not_differentiable") is None and o.found("zeros") is None and o.found("validation") is None


def test_second_only_means_second_order_and_nothing_else():
    assert _o(second=True).second_only
    for other in (dict(forward=True), dict(grads={"q"}), dict(jvp=True), dict(wrts={"q"})):
        assert not _o(second=True, **other).second_only, other
    assert not _o().second_only


# --- each row, and where it stops matching -----------------------------------------------------------------------------

SWAP_QK = (("q", ("k",), "matches"), ("k", ("q",), "matches"))


@pytest.mark.parametrize("o, key", [
    (_o(grads=QK, modes=ALL_MODES, returned=(2, 3), verb="raises RuntimeError"), "returns_count"),
    (_o(second=True, returned=(4, 3), slips=SWAP_QK), "returns_count"),
    (_o(grads=QK, modes=ALL_MODES, slips=SWAP_QK), "return_order"),                  # not the tanh factor
    (_o(grads=QK, modes=ALL_MODES, slips=SWAP_QK, second=True, review=(("a_not_differentiable", "t"),)),
     "return_order"),
    (_o(grads={"q", "v"}, modes=ALL_MODES, slips=(("q", ("v",), "shape"),)), "return_order"),
    (_o(grads=QK, modes={"o,a", "a"}, second=True, review=(("a_not_differentiable", "returns a non-differentiable a"),)),
     "a_not_differentiable"),
    (_o(forward=True, grads=QKV, modes=ALL_MODES), "forward"),
    (_o(forward=True), "forward"),
    (_o(grads={"q"}, modes=ALL_MODES, dtypes={"complex128"}), "complex_only"),
    (_o(grads={"q"}, modes=ALL_MODES, dtypes={"complex128"}, real_tested=False), "q_or_k"),   # no real dtype ran
    (_o(grads={"q"}, modes=ALL_MODES, dtypes={"complex128", "float64"}), "q_or_k"),
    (_o(jvp=True, dtypes={"complex128"}), "jvp_only"),                   # no gradient failed: not complex_only
    (_o(grads={"v"}, modes={"o,a", "o"}), "v_only"),
    (_o(grads={"k", "v"}, modes=ALL_MODES), None),
    (_o(grads=QK, modes={"o,a"}), "both_cotangents"),
    (_o(grads=QK, modes={"a"}), "o_absent"),
    (_o(grads=QKV, modes={"o", "a"}), "one_absent"),
    (_o(grads=QK, modes={"o"}), "a_absent"),
    (_o(grads=QK, modes={"o,a", "a"}), "ga_term"),
    (_o(grads={"q"}, modes={"o,a", "a"}), "ga_term"),
    (_o(grads=QKV, modes={"o,a", "a"}), None),
    (_o(grads=QK, modes={"o,a", "o"}), "tanh_factor"),
    (_o(grads=QK, modes=ALL_MODES), "tanh_factor"),
    (_o(grads=QKV, modes=ALL_MODES), None),
    (_o(grads={"k"}, modes=ALL_MODES), "q_or_k"),
    (_o(jvp=True, second=True), "jvp_only"),
    (_o(wrts={"q,k"}, second=True), "subsets_only"),
    (_o(grads=QKV, modes={"o,a", "a"}, wrts={"q"}), None),
    (_o(grads=QKV, modes={"o,a", "a"}, wrts={"q"}, jvp=True), None),
    (_o(second=True, review=(ONCE, NXN)), "once_differentiable"),
    (_o(second=True, review=(NXN, RECOMPUTES)), "saves_intermediate"),
    (_o(second=True, review=(RECOMPUTES,)), "second_only"),
    (_o(second=True), "second_only"),
    (_o(review=(ONCE, NXN)), None),                                      # a finding alone: no failing row to explain
    (_o(grads=QKV, modes={"o,a", "a"}, review=(ONCE, NXN)), None),
])
def test_the_first_matching_row_wins(o, key):
    assert _key(o) == key


# --- the words -------------------------------------------------------------------------------------------------------

def test_each_row_cites_the_frameworks_equations():
    for fw, eq in (("torch", {"ga": "(9)", "qk": "(10)–(12)", "q": "(11)", "k": "(12)", "v": "(13)",
                              "all": "(9)–(13)"}),
                   ("jax", {"ga": "(18)", "qk": "(19)–(21)", "q": "(20)", "k": "(21)", "v": "(22)",
                            "all": "(18)–(22)"})):
        assert hint_text(_o(fw=fw, grads={"v"}, modes=ALL_MODES)) == f"only the gradient of v fails → G_V, {eq['v']}"
        assert hint_text(_o(fw=fw, grads={"q"}, modes=ALL_MODES)) == f"only the gradient of q fails → G_Q, {eq['q']}"
        assert hint_text(_o(fw=fw, grads={"k"}, modes=ALL_MODES)) == f"only the gradient of k fails → G_K, {eq['k']}"
        assert hint_text(_o(fw=fw, grads=QK, modes=ALL_MODES)) == (
            f"q and k fail, v agrees → {eq['qk']}, the tanh factor (1 − a²)")
        assert hint_text(_o(fw=fw, grads=QK, modes={"o,a", "a"})) == (
            f"fails only when a's cotangent is present (never with o's alone) → the G_A term of Ĝ_A, {eq['ga']}")
        assert f"in {eq['ga']} and section 5" in hint_text(_o(fw=fw, grads=QK, modes={"a"}))
        assert f"in {eq['ga']} and section 5" in hint_text(_o(fw=fw, grads=QKV, modes={"o", "a"}))
        assert f"in {eq['ga']} and section 5" in hint_text(_o(fw=fw, grads=QK, modes={"o"}))
        assert eq["all"] in hint_text(_o(fw=fw, grads={"q"}, modes=ALL_MODES, dtypes={"complex64"}))


def test_conjugate_words_follow_the_frameworks_convention():
    torch_complex = hint_text(_o(grads={"q"}, modes=ALL_MODES, dtypes={"complex64"}))
    jax_complex = hint_text(_o(fw="jax", grads={"q"}, modes=ALL_MODES, dtypes={"complex64"}))
    assert torch_complex == "only complex dtypes fail → a missing conjugate, (9)–(13)"
    assert jax_complex == ("only complex dtypes fail → an extra conjugate (JAX's VJP has none), (18)–(22) and "
                           "relation (17)")
    assert "Ĝ_A = G_O Vᴴ + G_A" in hint_text(_o(grads=QK, modes={"o,a"}))
    assert "Ĝ_A = G_O Vᵀ + G_A" in hint_text(_o(fw="jax", grads=QK, modes={"o,a"}))


def test_unused_output_words_per_framework():
    assert "its cotangent is None;" in hint_text(_o(grads=QK, modes={"a"}))
    assert "its cotangent is a symbolic zero;" in hint_text(_o(fw="jax", grads=QK, modes={"o"}))


@pytest.mark.parametrize("o", [
    _o(grads={"q"}, modes=ALL_MODES, dtypes={"complex64"}), _o(grads={"v"}, modes=ALL_MODES),
    _o(grads=QK, modes={"o,a"}), _o(grads=QK, modes={"a"}), _o(grads=QKV, modes={"o", "a"}),
    _o(grads=QK, modes={"o"}), _o(grads=QK, modes={"o,a", "a"}), _o(grads=QK, modes=ALL_MODES),
    _o(grads={"q"}, modes=ALL_MODES)])
def test_first_order_vjp_rows_add_the_jvp_when_it_fails_too(o):
    assert choose(o).first_order_vjp
    assert not hint_text(o).endswith("(14)–(16)")
    assert hint_text(dataclasses.replace(o, jvp=True)) == hint_text(o) + "; the JVP fails too → (14)–(16)"


@pytest.mark.parametrize("o", [_o(forward=True, jvp=True), _o(jvp=True), _o(wrts={"q"}, second=True),
                               _o(second=True, review=(ONCE,)), _o(second=True, review=(NXN,)), _o(second=True)])
def test_other_rows_never_add_the_jvp(o):
    rule = choose(o)
    assert not rule.first_order_vjp
    assert "; the JVP fails too" not in hint_text(dataclasses.replace(o, jvp=True))


def test_row_texts_of_the_other_patterns():
    assert hint_text(_o(forward=True)) == "the forward differs from the reference → (1)–(3)"
    assert hint_text(_o(jvp=True)) == "only the JVP fails → (14)–(16)"
    nxn = hint_text(_o(second=True, review=(NXN,)))
    assert nxn.startswith("fails only in second order (first order agrees), and the review found it: "
                          f"\"{NXN[1]}\" → ") and "save the output a instead" in nxn
    assert hint_text(_o(second=True, review=(ONCE,))).startswith("fails only in second order (first order agrees): "
                                                                 "the backward cannot be differentiated")
    assert ".detach()" in hint_text(_o(second=True)) and "stop_gradient" in hint_text(_o(fw="jax", second=True))
    assert "returned non-differentiable" in hint_text(_o(second=True, review=(("a_not_differentiable", "t"),)))


def test_the_verb_replaces_fails_only():
    assert hint_text(_o(second=True, verb="raises TypeError")).startswith("raises TypeError only in second order")
    assert hint_text(_o(grads=QK, modes={"a"}, verb="raises KeyError")).startswith(
        "raises KeyError only when o is unused")


def test_return_order_texts():
    assert hint_text(_o(grads=QK, modes=ALL_MODES, slips=SWAP_QK)) == (
        "your backward returns the gradients in the wrong order: what you return as g_q matches G_K, what you "
        "return as g_k matches G_Q → return (G_Q, G_K, G_V), in the order of the inputs q, k, v; the gradients "
        "themselves agree with autodiff, as (9)–(13)")
    by_shape = hint_text(_o(fw="jax", grads={"q", "v"}, modes=ALL_MODES,
                            slips=(("q", ("v",), "shape"), ("v", ("q", "k"), "shape"))))
    assert by_shape == (
        "your bwd rule returns the gradients in the wrong order: what you return as g_q has the shape of G_V, what "
        "you return as g_v has the shape of G_Q or G_K → return (G_Q, G_K, G_V), in the order of the inputs q, k, "
        "v; (18)–(22)")
    mixed = hint_text(_o(grads=QKV, slips=(("q", ("k",), "matches"), ("v", ("q",), "shape"))))
    assert "g_q matches G_K, what you return as g_v has the shape of G_Q" in mixed and "agree with" not in mixed
    assert hint_text(_o(returned=(2, 3))) == ("your backward returns 2 gradients for 3 inputs → return one per "
                                              "input, in their order (G_Q, G_K, G_V); section 5 and (9)–(13)")
    assert hint_text(_o(fw="jax", returned=(1, 3))).startswith("your bwd rule returns 1 gradient for 3 inputs → ")


# --- only_when: which subsets fail -----------------------------------------------------------------------------------

def test_only_when_every_proper_subset_fails():
    six = _t({"q", "k", "v", "q,k", "q,v", "k,v"})
    assert only_when(("q", "k", "v"), "torch", six) == "whenever some input does not require grad"
    assert only_when(("q", "k", "v"), "jax", six) == "whenever some input is not differentiated"


def test_only_when_an_input_is_missing_from_every_failing_subset():
    assert only_when(("q", "k", "v"), "torch", _t({"q", "k", "q,k"})) == "when v does not require grad"
    assert only_when(("q", "k", "v"), "jax", _t({"q"})) == "when k and v are not differentiated"


def test_only_when_no_input_is_always_missing_names_the_subsets():
    # all but "q" alone: q is still in a failing subset, so no input is missing from all of them
    assert only_when(("q", "k", "v"), "torch", _t({"k", "v", "q,k", "q,v", "k,v"})) == (
        "with only k / only k,v / only q,k / only q,v / only v requiring grad")
    assert only_when(("q", "k", "v"), "jax", _t({"q,k", "v"})) == "with only q,k / only v differentiated"


def test_subsets_hint_text():
    assert hint_text(_o(wrts={"q,k"}, second=True)) == (
        "fails only when v does not require grad (every input requiring grad agrees) → what setup_context saves "
        "and backward computes for ctx.needs_input_grad: section 5 (which gradient reads which saved tensor)")


# --- observe and hint_lines on a report ------------------------------------------------------------------------------

def _s(text: str) -> str:
    """``text`` built at run time (a report's strings are: crosscheck must compare them by value, not identity)."""
    return "".join(list(text))


def _fail(kind="vjp", input="q", output="o,a", wrt="", error="", op="attn", fw="torch", cross=False, candidate="",
          dtype="float64", matches="") -> Comparison:
    """One failing comparison as a run records it (``input`` / ``output`` / ``wrt`` / ``matches`` written as the
    JSON writes them, ``error`` as ``"TypeError: message"``)."""
    fields = {f.name for f in dataclasses.fields(Comparison)}
    if "case" not in fields:                           # the string-typed record
        return Comparison(op=_s(op), oracle=_s(f"{fw} hand vs ref"), kind=_s(kind), dtype=_s(dtype), device="cpu",
                          shape=(3, 2, 4), input_shapes=((3, 2), (3, 2), (3, 4)), trial=0, input=_s(input),
                          output=_s(output), rel_err=1.0, max_abs=1.0, tol=1e-6, wrt=_s(wrt), error=_s(error),
                          framework=_s(fw), cross=cross, candidate=_s(candidate))
    from crosscheck.errors import Raised
    from crosscheck.oracles import Kind, Oracle, Party
    from crosscheck.results import CaseInfo
    from crosscheck.specs import SPECS

    def items(text):
        return tuple(_s(x) for x in text.split(",")) if text and text != "-" else ()

    raised = None
    if error:
        kind_of, _, message = error.partition(": ")
        raised = Raised(_s(kind_of), _s(message))
    oracle = Oracle(kind=Kind(kind), framework=_s(fw), tested=Party(_s(fw), "hand"), against=Party("ref"),
                    cross=cross, candidate=_s(candidate))
    return Comparison(op=_s(op), oracle=oracle, case=CaseInfo(_s(dtype), (3, 2, 4), 0, ((3, 2), (3, 2), (3, 4)),
                                                                SPECS[op].inputs, SPECS[op].outputs),
                      device="cpu", inputs=items(input), outputs=items(output), rel_err=1.0, max_abs=1.0, tol=1e-6,
                      wrt=items(wrt), error=raised, matches=items(matches))


def _report(failures, dtypes=("float64",), reviews=None, **config):
    return SimpleNamespace(failures=list(failures), reviews=reviews or {},
                           config=Config(dtypes=dtypes, **config))


def test_observe_reduces_a_frameworks_own_default_path_failures():
    report = _report([_fail(input="q", output="o,a"), _fail(input="k", output="a", dtype="complex128"),
                      _fail(kind="jvp", input="q", output="o")], dtypes=("float64", "complex128"))
    assert observe(report, "torch") == Observed(fw="torch", grads=QK, modes=_t({"o,a", "a"}),
                                                dtypes=frozenset({"float64", "complex128"}), jvp=True)
    assert observe(report, "jax") is None


def test_observe_keeps_forward_subset_and_second_order_failures_apart():
    report = _report([_fail(kind="forward", input="-", output="o"), _fail(input="q", wrt="q,k"),
                      _fail(input="v", wrt="v"), _fail(kind="vjp_vjp", input="g_o"), _fail(kind="hvp", input="k")])
    assert observe(report, "torch") == Observed(fw="torch", forward=True, wrts=_t({"q,k", "v"}), second=True)


@pytest.mark.parametrize("kind", ["vjp_vjp", "hvp"])
def test_observe_second_order_alone(kind):
    finding = Finding(_s(NXN[0]), NXN[1])                   # a key built at run time: found() compares by value
    report = _report([_fail(kind=kind, input="q")], reviews={"torch": Review("torch", "X", [finding])})
    o = observe(report, "torch")
    assert o == Observed(fw="torch", second=True, review=(NXN,))
    assert choose(o).key == "saves_intermediate"


def test_observe_only_a_subset_vjp_fails():
    o = observe(_report([_fail(input="q", wrt="q,k")]), "torch")
    assert o == Observed(fw="torch", wrts=_t({"q,k"}))
    assert choose(o).key == "subsets_only"


@pytest.mark.parametrize("other", [dict(op="mix"), dict(op="scores"), dict(fw="jax"), dict(cross=True),
                                   dict(candidate="torch sharded ring on 2 ranks")])
def test_observe_ignores_other_ops_frameworks_cross_pairs_and_candidates(other):
    assert observe(_report([_fail(**other)]), "torch") is None
    lines = hint_lines(_report([_fail(**other)]))
    if other.get("fw") == "jax":                       # jax's own row: its hint, and none for torch
        assert len(lines) == 1 and lines[0].startswith("hint (jax, jax_impl.attn): fails only when both cotangents")
    else:
        assert lines == []


def test_observe_of_jax_ignores_torchs_failures():
    assert observe(_report([_fail(fw="torch")]), "jax") is None
    assert observe(_report([_fail(fw="jax")]), "jax").grads == frozenset({"q"})


def test_observe_real_tested_follows_the_runs_dtypes():
    assert observe(_report([_fail()], dtypes=("float32", "complex64")), "torch").real_tested
    assert not observe(_report([_fail(dtype="complex64")], dtypes=("complex64",)), "torch").real_tested


@pytest.mark.parametrize("errors, verb", [
    (["TypeError: bad", "TypeError: worse"], "raises TypeError"),
    (["TypeError: bad", "KeyError: 'q'"], "fails"),
    (["TypeError: bad", ""], "fails"),
    (["", ""], "fails"),
])
def test_observe_verb_names_one_exception_type(errors, verb):
    report = _report([_fail(input=n, error=e) for n, e in zip("qk", errors)])
    assert observe(report, "torch").verb == verb


def test_hint_lines_name_the_implementation_checked():
    failures = [_fail(input="v"), _fail(fw="jax", input="q", output="o")]
    assert hint_lines(_report(failures)) == [
        "hint (torch, torch_impl.attn): only the gradient of v fails → G_V, (13) in derivation.md",
        "hint (jax, jax_impl.attn): fails only when a is unused (its cotangent is a symbolic zero; with a's "
        "cotangent present it agrees) → the handling of an absent G_A in (18) and section 5 in derivation.md"]
    named = _report([_fail(input="v")], torch_impl_name="my_attn.py:MyAttn")
    assert hint_lines(named) == ["hint (torch, my_attn.py:MyAttn): only the gradient of v fails → G_V, (13) in "
                                 "derivation.md"]


def test_hint_lines_skip_a_pattern_without_a_row():
    kv = [_fail(input=n, output=m) for n in "kv" for m in ("o,a", "o", "a")]
    assert observe(_report(kv), "torch").grads == frozenset("kv") and hint_lines(_report(kv)) == []
    assert hint_lines(_report([])) == []


def test_hint_lines_carry_the_review_and_the_verb():
    reviews = {"torch": Review("torch", "X", [Finding(*ONCE)])}
    report = _report([_fail(kind="hvp", input="q", error="RuntimeError: no grad")], reviews=reviews)
    (line,) = hint_lines(report)
    assert line.startswith("hint (torch, torch_impl.attn): raises RuntimeError only in second order (first order "
                           "agrees): the backward cannot be differentiated")


# --- return-order slips: observe reads Comparison.matches and the frameworks' shape / count errors -----------------

TORCH_SHAPE = ("RuntimeError: Function SwapsQVBackward returned an invalid gradient at index {i} - got [{got}] but "
               "expected shape compatible with [{want}]")
JAX_SHAPE = ("ValueError: Custom VJP bwd rule must produce an output with the same type as the args tuple of the "
             "primal function, but at output[{i}] the bwd rule produced an output of type float64[{got}] "
             "corresponding to an input of type float64[{want}], so the shapes do not match")
TORCH_COUNT = ("RuntimeError: function ReturnsTwoBackward returned an incorrect number of gradients (expected 3, "
               "got 2)")
JAX_COUNT = ("TypeError: Custom VJP bwd rule must produce an output with the same container (pytree) structure as "
             "the args tuple of the primal function, and in particular must produce a tuple of length equal to the "
             "number of arguments to the primal function, but got bwd output structure PyTreeDef((*, *)) for "
             "primal input structure PyTreeDef((*, *, *)).")


def _swap_qk(output="o,a", **kw):
    return [_fail(input="q", output=output, matches="k", **kw), _fail(input="k", output=output, matches="q", **kw)]


def test_observe_a_swap_of_q_and_k_on_every_path():
    # the second-order and JVP rows carry no matches: they are no first-order evidence against the slip
    failures = [f for m in ("o,a", "o", "a") for f in _swap_qk(m)] + _swap_qk(wrt="q,v") + [
        _fail(kind="vjp_vjp"), _fail(kind="hvp", input="k"), _fail(kind="jvp", input="q", output="o")]
    o = observe(_report(failures), "torch")
    assert o.slips == SWAP_QK and o.grads == QK and o.returned is None
    assert choose(o).key == "return_order"


@pytest.mark.parametrize("extra", [
    _fail(input="q", output="a"),                                    # a failure no slip explains
    _fail(input="q", output="a", matches="v"),                       # q's agrees with k on one case, v on another
    _fail(input="q", output="a", error="TypeError: unsupported operand type(s) for @: 'NoneType' and 'Tensor'"),
    _fail(input="q", output="a", error=TORCH_SHAPE.format(i=0, got="3, 7", want="3, 2")),   # no input's shape
    _fail(input="q", output="a", error=TORCH_SHAPE.format(i=0, got="3, 3", want="3, 2")),   # v's is larger: no match
    _fail(input="v", output="a", error=TORCH_SHAPE.format(i=0, got="3, 4", want="3, 2")),   # v's own shape only
])
def test_a_slip_must_explain_every_first_order_failure(extra):
    o = observe(_report(_swap_qk() + [extra]), "torch")
    assert o.slips == () and _key(o) != "return_order"
    assert observe(_report(_swap_qk()), "torch").slips == SWAP_QK


def test_a_zero_like_another_inputs_zero_gradient_is_no_evidence():
    assert observe(_report([_fail(input="q", output="a", matches="0")]), "torch").slips == ()
    o = observe(_report(_swap_qk() + [_fail(input="q", output="a", matches="0")]), "torch")
    assert o.slips == SWAP_QK


@pytest.mark.parametrize("fw, template", [("torch", TORCH_SHAPE), ("jax", JAX_SHAPE)])
def test_a_gradient_of_another_inputs_shape(fw, template):
    # input shapes q (3, 2), k (3, 2), v (3, 4): what is returned as g_q has v's shape, as g_v q's and k's
    sep = ", " if fw == "torch" else ","                 # torch writes [3, 4], JAX float64[3,4]
    failures = [_fail(fw=fw, input="q", error=template.format(i=0, got=f"3{sep}4", want=f"3{sep}2")),
                _fail(fw=fw, input="v", output="a", error=template.format(i=2, got=f"3{sep}2", want=f"3{sep}4"))]
    o = observe(_report(failures), fw)
    assert o.slips == (("q", ("v",), "shape"), ("v", ("q", "k"), "shape"))
    # numbers, where a case compared them, win over the shape
    numbers = observe(_report(failures + [_fail(fw=fw, input="v", matches="q")]), fw)
    assert numbers.slips == (("q", ("v",), "shape"), ("v", ("q",), "matches"))


@pytest.mark.parametrize("fw, error", [("torch", TORCH_COUNT), ("jax", JAX_COUNT)])
def test_the_wrong_number_of_gradients(fw, error):
    failures = [_fail(fw=fw, input=n, output=m, error=error) for n in "qkv" for m in ("o,a", "a")]
    o = observe(_report(failures + [_fail(fw=fw, kind="hvp", error=error)]), fw)
    assert o.returned == (2, 3) and choose(o).key == "returns_count"
    other = observe(_report(failures + [_fail(fw=fw, input="q", output="o", error="TypeError: bad")]), fw)
    assert other.returned is None


def test_a_failure_after_a_zero_still_counts():
    # the zero is skipped, not the end of the evidence: a later failure no slip explains still rules the slip out
    zero_then_other = _swap_qk() + [_fail(input="q", output="a", matches="0"), _fail(input="k", output="a")]
    assert observe(_report(zero_then_other), "torch").slips == ()


@pytest.mark.parametrize("failure", [
    _fail(input="q,k", matches="v"),                                   # one comparison of two gradients: whose?
    _fail(input="-", matches="v"),                                     # no input named
    _fail(input="q,k", error=TORCH_SHAPE.format(i=0, got="3, 4", want="3, 2")),
    _fail(input="-", error=TORCH_SHAPE.format(i=0, got="3, 4", want="3, 2")),
])
def test_a_slip_is_read_from_one_gradients_comparison_only(failure):
    assert observe(_report([failure]), "torch").slips == ()
    assert observe(_report(_swap_qk() + [failure]), "torch").slips == ()


def test_a_gradient_matching_several_inputs_names_them_all():
    both = (("q", ("k", "v"), "matches"),)
    assert observe(_report([_fail(input="q", matches="k,v")]), "torch").slips == both
    text = ("your backward returns the gradients in the wrong order: what you return as g_q matches G_K and G_V → "
            "return (G_Q, G_K, G_V), in the order of the inputs q, k, v; the gradients themselves agree with "
            "autodiff, as (9)–(13)")
    assert hint_text(_o(grads={"q"}, slips=both)) == text
    # a record whose words were read back (JSON, a child process) is compared by value, not identity
    assert hint_text(_o(grads={"q"}, slips=(("q", ("k", "v"), _s("matches")),))) == text


def test_no_gradient_returned_is_plural():
    assert hint_text(_o(returned=(0, 3))).startswith("your backward returns 0 gradients for 3 inputs → ")
    assert hint_text(_o(returned=(4, 3))).startswith("your backward returns 4 gradients for 3 inputs → ")
