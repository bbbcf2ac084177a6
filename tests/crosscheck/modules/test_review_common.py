"""crosscheck.review.common, what both frameworks' reviews share, through its public functions (``python -m
mutation review_common`` runs this file on each mutant): the review's shape, the contract's bad inputs and the
validation verdict, the classes of matrix products, running every request and gathering the evidence.  Fed
plain Python callables and numpy arrays: no torch or JAX import, well under a second."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from crosscheck.review.common import (BAD_INPUTS, KEYS, MODES, SHAPE, SUBSETS, Finding, Review, Unavailable,
                                      evidence, inputs, label, per_request, product_class, unrequested_products,
                                      validation)
from crosscheck.sampling import sample_inputs
from crosscheck.specs import SPECS

N, D, E = 5, 2, 3
DOCS = Path(__file__).resolve().parents[3] / "docs" / "crosscheck.md"


# --- the shape and the inputs ------------------------------------------------------------------------------------------

def test_review_shape_is_the_documented_one_with_n_d_e_all_different():
    assert SHAPE == (N, D, E) and len(set(SHAPE)) == 3
    assert f"n = {N}, d = {D}, e = {E}" in " ".join(DOCS.read_text().split())


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_inputs_are_drawn_as_the_correctness_checks_draw_them(dtype):
    q, k, v = inputs(dtype)
    ref = sample_inputs(SPECS["attn"], np.random.default_rng(0), SHAPE, dtype)
    assert (q.shape, k.shape, v.shape) == ((N, D), (N, D), (N, E)) and q.dtype == np.dtype(dtype)
    for a, b in zip((q, k, v), ref):
        np.testing.assert_array_equal(a, b)


# --- the contract's bad inputs ---------------------------------------------------------------------------------------

def _bad(dtype="float64"):
    q, k, v = inputs(dtype)
    return {what: make(q, k, v, np.asarray) for what, make in BAD_INPUTS}, (q, k, v)


def test_each_bad_input_is_what_its_description_says():
    bad, (q, k, v) = _bad()
    assert len(bad) == len(BAD_INPUTS) == 7
    nested = bad["q is not a tensor (a nested list)"]
    assert type(nested[0]) is list and nested[0] == q.tolist()
    np.testing.assert_array_equal(nested[1], k)
    three_d = bad["q is 3-D (2, n, d)"]
    assert three_d[0].shape == (2, N, D)
    np.testing.assert_array_equal(three_d[0][0], q)
    np.testing.assert_array_equal(three_d[0][1], q)
    one_d = bad["v is 1-D"][2]
    assert one_d.shape == (N,)
    np.testing.assert_array_equal(one_d, v[:, 0])
    wide_k = bad["k has d + 1 columns (q is (n, d))"][1]
    assert wide_k.shape == (N, D + 1)
    np.testing.assert_array_equal(wide_k, np.hstack([k, k[:, :1]]))
    long_v = bad["v has n + 1 rows"]
    assert long_v[2].shape == (N + 1, E) and long_v[1].shape == (N, D)
    np.testing.assert_array_equal(long_v[2][-1], v[0])
    kv = bad["k and v have n + 1 rows, q has n"]
    assert (kv[0].shape, kv[1].shape, kv[2].shape) == ((N, D), (N + 1, D), (N + 1, E))
    np.testing.assert_array_equal(kv[1][-1], k[0])
    np.testing.assert_array_equal(kv[2][-1], v[0])
    mixed = bad["k has another float dtype than q and v"]
    assert (mixed[0].dtype, mixed[1].dtype, mixed[2].dtype) == (np.float64, np.float32, np.float64)


def test_the_mixed_dtype_bad_input_of_float32_is_float64():
    bad, _ = _bad("float32")
    mixed = bad["k has another float dtype than q and v"]
    assert (mixed[0].dtype, mixed[1].dtype) == (np.float32, np.float64)


def _checked(fn):
    """A call that validates like the contract asks: shapes and dtypes first, the argument named."""
    def call(q, k, v):
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, np.ndarray) or x.ndim != 2:
                raise ValueError(f"{name} must be a 2-D array")
        if k.shape != q.shape or v.shape[0] != q.shape[0] or k.dtype != q.dtype:
            raise ValueError("k must match q, v must have q's rows")
        return fn(q, k, v)
    return call


def _attn(q, k, v):
    a = np.tanh(q @ k.T)
    return a @ v, a


def _no_ops(call):
    try:
        call()
    except Exception as e:                             # noqa: BLE001
        return e, []
    return None, []


def test_a_validating_call_has_no_finding():
    assert validation(_checked(_attn), np.asarray, _no_ops, "float64") == []


def test_no_validation_at_all_is_one_finding_listing_every_bad_input():
    def returns(q, k, v):
        return None
    (finding,) = validation(returns, np.asarray, _no_ops, "float64")
    assert finding.key == "validation"
    assert finding.title == ("no input validation: none of the contract's 7 bad inputs gets a clear error naming "
                             "the argument before compute")
    assert finding.evidence == "; ".join(f"{what}: returned normally" for what, _ in BAD_INPUTS)


def test_some_inputs_unchecked_gives_one_finding_each():
    def checks_q_only(q, k, v):
        if not isinstance(q, np.ndarray) or q.ndim != 2:
            raise ValueError("q must be a 2-D array")
    found = validation(checks_q_only, np.asarray, _no_ops, "float64")
    assert [f.title for f in found] == [f"no error for bad input: {what}" for what, _ in BAD_INPUTS[2:]]
    assert all(f.key == "validation" and f.evidence == "returned normally" for f in found)


def test_all_but_one_unchecked_is_still_one_finding_each():
    def checks_mixed_dtype_only(q, k, v):
        if getattr(k, "dtype", None) is not None and getattr(q, "dtype", None) is not None and k.dtype != q.dtype:
            raise TypeError("k must have q's dtype")
    found = validation(checks_mixed_dtype_only, np.asarray, _no_ops, "float64")
    assert len(found) == len(BAD_INPUTS) - 1 and all(f.title.startswith("no error for bad input") for f in found)


def test_compute_before_the_error_is_named_with_the_ops():
    def compute_log(call):                              # the bad inputs reach a product before the error
        exc, _ = _no_ops(call)
        return exc, ["mm", "tanh"]
    found = validation(_checked(_attn), np.asarray, compute_log, "float64")
    (summary,) = found                                  # every bad input computed first: one summary finding
    assert summary.title.startswith("no input validation")
    assert "raised from inside the computation (after mm, tanh): ValueError: q must be a 2-D array" in summary.evidence


def test_compute_before_is_reported_per_input_when_some_are_clean():
    def compute_log(call):
        exc, _ = _no_ops(call)
        return exc, (["mm"] if "v" in str(exc) else [])
    def call(q, k, v):
        for name, x in (("q", q), ("k", k)):
            if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != D or x.dtype != np.float64:
                raise ValueError(f"{name} is wrong")
        raise ValueError("v is wrong")
    found = validation(call, np.asarray, compute_log, "float64")
    titles = [f.title for f in found]
    assert "no clear error before compute for bad input: v is 1-D" in titles
    assert all(t.startswith("no clear error before compute") for t in titles)
    (one_d,) = [f for f in found if f.title.endswith("v is 1-D")]
    assert one_d.evidence == "raised from inside the computation (after mm): ValueError: v is wrong"


def test_returned_normally_after_computing_names_the_ops():
    def compute_log(call):
        exc, _ = _no_ops(call)
        return exc, ["mm", "tanh"] if exc is None else []
    def lax(q, k, v):
        if not isinstance(q, np.ndarray):
            raise TypeError("q must be an array")
        return None
    found = validation(lax, np.asarray, compute_log, "float64")
    assert found[0].evidence == "returned normally after computing (mm, tanh)"


@pytest.mark.parametrize("message, named", [
    ("q must be 2-D", True), ("expected k of shape (5, 2)", True), ("bad value: v", True),
    ("query has 3 dims", True), ("the key's rows", True), ("value is 1-D", True), ("'q' has dtype float32", True),
    ("expected a 2-D tensor", False), ("mat1 and mat2 shapes cannot be multiplied", False),
    ("x.q is wrong", False), ("kv mismatch", False), ("q(x) failed", False), ("bad vk", False),
])
def test_the_error_must_name_the_argument_as_a_word(message, named):
    def call(q, k, v):
        raise ValueError(message)
    found = validation(call, np.asarray, _no_ops, "float64")
    if named:
        assert found == []
    else:
        (summary,) = found
        assert summary.title.startswith("no input validation")
        assert summary.evidence.startswith(f"{BAD_INPUTS[0][0]}: ValueError: {message}")


def test_an_unnamed_error_on_some_inputs_names_the_bad_input():
    def call(q, k, v):
        if not isinstance(q, np.ndarray):
            raise TypeError("expected an array")            # names no argument
        raise ValueError("q, k and v must agree")
    (finding,) = validation(call, np.asarray, _no_ops, "float64")
    assert finding.title == ("the error for bad input (q is not a tensor (a nested list)) does not name the "
                             "argument")
    assert finding.evidence == "TypeError: expected an array"


def test_the_solutions_warnings_on_bad_inputs_stay_inside():
    import warnings

    def call(q, k, v):
        warnings.warn("deprecated .T on a 3-D tensor")
        raise ValueError("q is bad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert validation(call, np.asarray, _no_ops, "float64") == []
    assert not caught


# --- subsets, labels, products ---------------------------------------------------------------------------------------

def test_subsets_are_every_proper_request_q_k_v_then_pairs():
    assert SUBSETS == [(True, False, False), (False, True, False), (False, False, True), (True, True, False),
                       (True, False, True), (False, True, True)]
    assert MODES == {(True, True): "o and a used", (True, False): "a unused", (False, True): "o unused"}


def test_label_names_the_inputs_requested():
    assert label((True, False, True)) == "q, v requiring grad"
    assert label((False, True, False), "differentiated") == "k differentiated"


@pytest.mark.parametrize("shapes, cls", [
    ([[N, D], [D, N]], "x"),
    ([[N, N], [N, D]], "qk"), ([[D, N], [N, N]], "qk"), ([[N, N], [N, N], [N, D]], "qk"),
    ([[N, N], [N, E]], "v"), ([[E, N], [N, N]], "v"),
    ([[N, E], [E, N]], "ghat"),
    ([[3, N, D], [3, D, N]], "x"),                                  # batched: the last two dims
    ([[N], [N, D], [D, N]], "x"), ([[N, D], [D, N], [N]], "x"),    # 1-D operands are not matrices
    ([[N, D]], None), ([], None), ([[N, D], [D, E]], None), ([[N, N], [N, N]], None),
    ([[D, D], [D, N]], None), ([[N, D], [D, D]], None), ([[E, N], [N, E]], None), ([[N, E], [E, E]], None),
    ([[D, N], [N, E]], None), ([[N, N], [N, 4]], None), ([[4, N], [N, D]], None),
    ([[N, 7], [7, D]], None), ([[E, 7], [7, N]], None),          # an inner size other than n: no gradient product
])
def test_product_class_at_the_review_shape(shapes, cls):
    assert product_class(shapes) == cls


@pytest.mark.parametrize("products, requires, extra", [
    (["qk", "qk", "v", "ghat"], (True, True, True), []),
    (["qk", "qk"], (True, False, False), ["2 products of the q/k-gradient shape for 1 requested"]),
    (["qk"], (True, False, False), []),
    (["qk", "qk", "qk"], (True, True, False), ["3 products of the q/k-gradient shape for 2 requested"]),
    (["qk"], (False, False, True), ["1 products of the q/k-gradient shape for 0 requested"]),
    (["v"], (True, False, False), ["G_V = Aᴴ G_O"]), (["v"], (False, False, True), []),
    (["ghat"], (False, False, True), ["G_O Vᴴ (read only by the q and k gradients)"]),
    (["ghat"], (False, True, False), []), (["ghat", None, "x"], (True, False, False), []),
    (["qk", "qk", "v", "ghat"], (False, False, True),
     ["2 products of the q/k-gradient shape for 0 requested", "G_O Vᴴ (read only by the q and k gradients)"]),
    (["qk", "v"], (False, True, False), ["G_V = Aᴴ G_O"]),
])
def test_unrequested_products(products, requires, extra):
    assert unrequested_products(products, requires) == extra


# --- every request, and the evidence ----------------------------------------------------------------------------------

def test_per_request_runs_every_request_with_its_words():
    seen = []

    def log(requires, mode):
        return (requires, mode)

    def analyse(record, requires, mode, where, note):
        assert record == (requires, mode)
        seen.append((requires, mode, where))

    assert per_request(log, analyse, "differentiated") == []
    assert [(r, m) for r, m, _ in seen] == [(r, m) for r in [(True, True, True)] + SUBSETS for m in MODES]
    assert seen[0][2] == "o and a used, q, k, v differentiated"
    assert seen[-1][2] == "o unused, k, v differentiated"


def test_per_request_gathers_each_findings_evidence_in_order():
    def analyse(record, requires, mode, where, note):
        if not requires[2]:
            note("computes_unrequested", "computes G_V", where)
        if mode == (True, False):
            note("zeros", "zero fill", f"zeros ({where})")

    found = per_request(lambda r, m: None, analyse, "requiring grad")
    assert [(f.key, f.title) for f in found] == [("zeros", "zero fill"), ("computes_unrequested", "computes G_V")]
    zeros, unreq = found
    assert zeros.evidence == ("zeros (a unused, q, k, v requiring grad); zeros (a unused, q requiring grad); zeros "
                              "(a unused, k requiring grad); ... (7 paths in all)")
    assert unreq.evidence.startswith("o and a used, q requiring grad; a unused, q requiring grad; o unused, q "
                                     "requiring grad; ... (9 paths in all)")


def test_per_request_skips_requests_that_raise():
    calls = []

    def log(requires, mode):
        if mode != (True, True):
            raise RuntimeError("backward raised")
        return "ok"

    per_request(log, lambda record, requires, mode, where, note: calls.append(record), "requiring grad")
    assert calls == ["ok"] * 7


def test_per_request_is_unavailable_when_every_request_raises():
    def log(requires, mode):
        raise RuntimeError("no backward")
    with pytest.raises(Unavailable, match="the backward raised on every path"):
        per_request(log, lambda *a: None, "requiring grad")


def test_evidence_shows_the_first_distinct_items():
    assert evidence(["a", "b", "a", "c"]) == "a; b; c"
    assert evidence(["a", "b", "c", "d"]) == "a; b; c; ... (4 paths in all)"
    assert evidence(["a", "b", "c", "d", "d"], shown=2) == "a; b; ... (4 paths in all)"
    assert evidence([]) == ""


# --- the records ---------------------------------------------------------------------------------------------------

def test_review_record_and_keys():
    r = Review("torch", "X")
    assert r.findings == [] and r.unavailable == [] and not r.has("zeros")
    r.findings.append(Finding("zeros", "t"))
    assert r.has("zeros") and not r.has("recomputes") and Finding("zeros", "t").evidence == ""
    assert r.has("".join(["ze", "ros"]))                          # a key built at run time: compared by value
    before = Review("torch", "X", [Finding("recomputes", "t")])
    assert not before.has("zeros") and not before.has("saves_nxn")   # keys sorting after the one found
    assert Review("jax", "Y").findings == []                      # a fresh list per review
    assert set(KEYS["jax"]) < set(KEYS["torch"]) and len(set(KEYS["torch"])) == len(KEYS["torch"]) == 11
    with pytest.raises(Exception):
        Finding("a", "b").key = "c"
    assert re.fullmatch(r"[a-z_]+", "".join(KEYS["torch"]))
