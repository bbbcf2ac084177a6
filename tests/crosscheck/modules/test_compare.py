"""crosscheck's comparison core on its own, in seconds: ``crosscheck.metrics`` (the error measure, the dtype table,
the norm floor) and ``crosscheck.compare`` (the Collector, ``compare_case``'s oracle pairs, the rows and failures
they produce), fed fabricated numpy results instead of running PyTorch or JAX.

What is pinned is what a user reads: a comparison's verdict, each row's label / counts / worst errors / verdict,
each failure's fields (which gradient, which cotangent or tangent mode, which inputs required grad, the error of a
request that raised), the skipped rows and their reasons.  Only the float32 / complex64 ground truth needs torch
(``compare.truth`` computes it with torch.func); nothing here imports JAX.  ``tests/crosscheck/test_strictness.py``
pins the same pieces end to end, on planted solutions (slow: real runs); this file is the fast test command of
``python -m mutation metrics`` / ``compare``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from crosscheck import metrics
from crosscheck.cases import Case
from crosscheck.compare import Collector, compare_case, jacrev_size, second_order_skips, subset_oracle, truth
from crosscheck.metrics import DTYPES, NORM_FLOOR, TOLERANCES, Diff, diff
from crosscheck.oracles import Kind, Oracle, Party
from crosscheck.parts import CaseResults, Failed, Skip
from crosscheck.results import CaseInfo, Config, names
from crosscheck.specs import SPECS, Side

ATTN = SPECS["attn"]
SHAPE = (3, 2, 4)                                  # n, d, e all different and >= 2
DEFAULT_ROWS = ("torch impl vs torch reference", "torch hand VJP vs torch.func.vjp(ref)",
                "torch hand VJP (input subsets) vs torch.func.vjp(ref)", "torch hand VJP vs torch.func.jacrev(ref)",
                "torch hand JVP vs torch.func.jvp(ref)", "torch hand VJP of VJP vs torch.func.vjp(vjp(ref))",
                "torch hand HVP vs torch.func.jvp(vjp(ref))")


# --- metrics: the dtype table -------------------------------------------------------------------------------------

def test_dtype_table():
    """Per dtype: complex or not, its tolerance, its ground truth; a low-precision dtype is also compared with
    the ground truth, a double one is its own."""
    want = {"float32": (False, 1e-4, "float64", True), "complex64": (True, 1e-4, "complex128", True),
            "float64": (False, 1e-10, "float64", False), "complex128": (True, 1e-10, "complex128", False)}
    assert set(DTYPES) == set(want)
    for name, (is_complex, tol, wide, low) in want.items():
        d = metrics.dtype(name)
        assert (d.name, d.is_complex, d.tol, d.truth, d.low_precision) == (name, is_complex, tol, wide, low)
        assert d.low_precision is low
    assert TOLERANCES == {name: w[1] for name, w in want.items()}
    assert NORM_FLOOR == 1e-6


def test_low_precision_compares_names_by_value():
    """A DType built from names read at run time (not the table's literals): low precision is a question of
    equal names, not of the same string object."""
    wide = "".join(["float", "64"])
    assert not metrics.DType("".join(["float", "64"]), False, 1e-10, wide).low_precision
    assert metrics.DType("".join(["float", "32"]), False, 1e-4, wide).low_precision


def test_dtype_table_and_diffs_are_read_only():
    """A tolerance cannot be changed behind the table's back (nor a measured difference after the fact)."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.dtype("float64").tol = 1e-7
    with pytest.raises(dataclasses.FrozenInstanceError):
        diff(np.ones(2), np.ones(2)).rel_err = 5.0
    assert len({metrics.dtype("float32"), metrics.dtype("float32")}) == 1       # hashable values


# --- metrics: the error measure -----------------------------------------------------------------------------------

def test_diff_is_normwise_relative_and_max_abs_entrywise():
    expected = np.array([[3.0, 0.0], [0.0, 4.0]])                 # norm 5
    actual = expected + np.array([[0.0, -0.6], [0.8, 0.0]])       # difference of norm 1, largest entry 0.8
    d = diff(actual, expected)
    assert d.rel_err == pytest.approx(0.2, rel=1e-12) and d.max_abs == pytest.approx(0.8, rel=1e-12)
    assert d.note == ""
    assert diff(expected, expected) == Diff(0.0, 0.0)
    # the user's side is never the denominator by default: a doubled gradient is off by exactly 1
    assert diff(2 * expected, expected).rel_err == pytest.approx(1.0, rel=1e-12)
    assert diff(expected, 2 * expected).rel_err == pytest.approx(0.5, rel=1e-12)


def test_diff_symmetric_divides_by_the_larger_norm():
    e = np.array([1.0, -2.0, 2.0])
    assert diff(2 * e, e, symmetric=True).rel_err == pytest.approx(0.5, rel=1e-12)
    assert diff(e, 2 * e, symmetric=True).rel_err == pytest.approx(0.5, rel=1e-12)
    assert diff(2j * e, 1j * e, symmetric=True).rel_err == pytest.approx(0.5, rel=1e-12)   # complex norms


def test_diff_compares_imaginary_parts():
    z = np.array([1 + 2j, -1 + 0.5j, 0.25 - 1j])
    d = diff(z.conj(), z)                                         # real parts right, imaginary parts wrong
    assert d.rel_err == pytest.approx(np.linalg.norm(2 * z.imag) / np.linalg.norm(z), rel=1e-12)
    assert d.max_abs == pytest.approx(4.0, rel=1e-12)
    assert diff(2j * z.imag, 1j * z.imag).rel_err == pytest.approx(1.0, rel=1e-12)        # purely imaginary


def test_diff_of_a_real_and_a_complex_array_is_complex():
    """A real result against a complex reference (JAX's grad.real) and the other way round: the imaginary parts
    count, neither is cast to real."""
    z = np.array([3 + 4j, 0 + 1j])
    assert diff(z.real, z).rel_err == pytest.approx(np.linalg.norm(z.imag) / np.linalg.norm(z), rel=1e-12)
    assert diff(z, z.real).rel_err == pytest.approx(np.linalg.norm(z.imag) / np.linalg.norm(z.real), rel=1e-12)
    assert diff(z.real, z).max_abs == pytest.approx(4.0)


def test_diff_counts_a_missing_array_as_zeros():
    e = np.array([[1.0, -3.0], [0.5, 2.0]])
    assert diff(None, e) == Diff(pytest.approx(1.0, rel=1e-12), pytest.approx(3.0))
    d = diff(e, None)                                             # an exactly-zero reference: the norm floor
    assert d.rel_err == pytest.approx(np.linalg.norm(e) / NORM_FLOOR, rel=1e-12) and d.max_abs == 3.0
    assert diff(None, None) == Diff(0.0, 0.0)                     # two absent gradients agree


def test_norm_floor_judges_a_zero_reference_in_absolute_terms():
    d = diff(np.full(4, 1e-9), np.zeros(4))
    assert d.rel_err == pytest.approx(2e-9 / 1e-6, rel=1e-9)     # 2e-3: above every tolerance
    assert not d.rel_err <= TOLERANCES["float32"]
    d = diff(np.full(4, 1e-17), np.zeros(4))
    assert d.rel_err <= TOLERANCES["float64"]


@pytest.mark.parametrize("shapes", [((2, 3), (3, 2)), ((3, 2), (2, 3)), ((1, 3), (3,)), ((3,), (1, 3))])
def test_diff_flags_a_wrong_shape_whichever_is_larger(shapes):
    a, e = np.ones(shapes[0]), np.ones(shapes[1])
    d = diff(a, e)
    assert (d.rel_err, d.max_abs) == (math.inf, math.inf)
    assert d.note == f"shape {shapes[0]} but expected {shapes[1]}"


def test_diff_of_empty_and_single_element_arrays():
    assert diff(np.zeros((0, 3)), np.zeros((0, 3))) == Diff(0.0, 0.0)
    assert diff(np.zeros(0, complex), None) == Diff(0.0, 0.0)
    assert diff(np.array([2.0]), np.array([1.0])) == Diff(1.0, 1.0)
    assert diff(np.array([[-1.0]]), np.array([[1.0]])) == Diff(2.0, 2.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_diff_of_a_non_finite_result_is_infinite(bad):
    d = diff(np.array([1.0, bad]), np.array([1.0, 2.0]))
    assert (d.rel_err, d.max_abs, d.note) == (math.inf, math.inf, "NaN/Inf in result")
    assert diff(np.array([1.0, 2.0]), np.array([1.0, 2.0])).note == ""


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_diff_against_a_non_finite_expected_result_is_infinite_and_says_so(bad):
    d = diff(np.array([1.0, 2.0]), np.array([1.0, bad]))
    assert (d.rel_err, d.max_abs, d.note) == (math.inf, math.inf, "NaN/Inf in the expected result")


# --- fabricated results ------------------------------------------------------------------------------------------

def side(**kw) -> Side:
    kw.setdefault("forward_is_hand", True)
    return Side(forward=None, vjp=None, jvp=None, reference=None, source="test", **kw)


def draw(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def fabricate(spec, case, dtype, seed=1, jac=True, second=True):
    """Results of one framework that agree with its references everywhere: random reference values, the hand parts
    equal to them (``None`` for the inputs a request leaves out)."""
    rng = np.random.default_rng(seed)
    n, d, e = case.shape
    ins, outs = spec.input_shapes(n, d, e), spec.output_shapes(n, d, e)
    fwd = tuple(draw(rng, s, dtype) for s in outs)
    vjp_ref = [tuple(draw(rng, s, dtype) for s in ins) for _ in case.cot_modes]
    jvp_ref = [tuple(draw(rng, s, dtype) for s in outs) for _ in case.tan_modes]
    r = {"forward": fwd, "forward_ref": tuple(x.copy() for x in fwd), "vjp_ref": vjp_ref,
         "vjp": [tuple(g.copy() if name in wrt else None for g, name in zip(vjp_ref[m], spec.inputs))
                 for wrt, m in case.vjp_requests],
         "jvp_ref": jvp_ref, "jvp": [tuple(t.copy() for t in ts) for ts in jvp_ref]}
    if jac:
        r["vjp_jac"] = [tuple(g.copy() for g in gs) for gs in vjp_ref]
    if second and case.all_paths:
        vv = tuple(draw(rng, s, dtype) for s in ins + outs)
        hv = tuple(draw(rng, s, dtype) for s in ins)
        r.update(vjp_vjp=[tuple(x.copy() for x in vv)], vjp_vjp_ref=[vv], hvp=[tuple(x.copy() for x in hv)],
                 hvp_ref=[hv])
    return r


def reference_only(spec, case, dtype, seed=2):
    """A reference-only side's results (the project's JAX left out of a --torch-impl run): no hand parts."""
    r = fabricate(spec, case, dtype, seed, jac=False, second=False)
    del r["vjp"], r["forward_ref"]
    r["jvp"] = [Skip("no hand-written JVP")] * len(case.tan_modes)
    return r


def request(case, wrt, mode):
    return case.vjp_requests.index((tuple(wrt), mode))


def run_case(sides, results, dtype="float64", case=None, jac_elems=123, config=None, trial=0):
    """compare_case on one case (default: attn on SHAPE, every path) into a fresh Collector (``results``: per
    framework, the fields of a ``parts.CaseResults``)."""
    col = Collector(config or Config())
    case = case or Case(ATTN, dtype, SHAPE, trial, 0, True)
    compare_case(col, ATTN, sides, case, dtype, case.shape, trial,
                 {fw: CaseResults(**r) for fw, r in results.items()}, jac_elems)
    return col


def rows(col):
    return {r.label: (r.compared, r.failed, r.verdict) for r in col.rows.values()}


def row(col, label):
    [found] = [r for r in col.rows.values() if r.label == label]
    return found


def skipped(col):
    return [(s.op, s.label, s.dtype, s.reason) for s in col.skipped]


def failures(col):
    """The failures as the JSON writes them (labels, comma-joined names), with the other fields."""
    return [Seen(c) for c in col.failures]


class Seen:
    def __init__(self, c):
        self.c = c
        self.oracle, self.kind, self.input = c.label, c.kind.value, names(c.inputs) or "-"
        self.output, self.wrt, self.error = names(c.outputs), names(c.wrt), c.error.text if c.error else ""

    def __getattr__(self, name):
        return getattr(self.c, name)


def info(dtype="float64", shape=SHAPE, trial=0):
    return CaseInfo(dtype, shape, trial, ATTN.input_shapes(*shape), ATTN.inputs, ATTN.outputs)


def project(**kw):
    """The project's own side of a framework (its forward is under test too)."""
    return side(**kw)


# --- compare_case: which oracle pairs, how many comparisons ----------------------------------------------------------

def test_one_framework_every_path_rows_and_counts():
    """attn in float64 on a path shape: the forward, 3 cotangent modes x 3 gradients, the 6 smaller input subsets
    (only their own gradients compared), the Jacobian oracle, 7 tangent subsets x 2 outputs, the VJP of the VJP (3
    inputs and 2 cotangents) and the HVP (3 inputs)."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    col = run_case({"torch": project()}, {"torch": fabricate(ATTN, case, "float64")}, case=case)
    assert rows(col) == dict(zip(DEFAULT_ROWS, [(2, 0, "ok"), (9, 0, "ok"), (27, 0, "ok"), (9, 0, "ok"),
                                                (14, 0, "ok"), (5, 0, "ok"), (3, 0, "ok")]))
    assert not failures(col) and not col.skipped
    for (op, oracle, dt), r in col.rows.items():
        assert (op, dt, r.op, r.oracle, r.dtype, r.device, r.tol) == ("attn", "float64", "attn", oracle, "float64",
                                                                       "cpu", 1e-10)
        assert (r.framework, r.cross, r.rel_err, r.max_abs) == ("torch", False, 0.0, 0.0)
    assert [r.kind for r in col.rows.values()] == ["forward", "vjp", "vjp", "vjp", "jvp", "vjp_vjp", "hvp"]


def test_without_every_path_no_subsets_and_no_second_order():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    col = run_case({"torch": project(forward_is_hand=False)}, {"torch": fabricate(ATTN, case, "float64")},
                   case=case)
    assert rows(col) == {"torch hand VJP vs torch.func.vjp(ref)": (9, 0, "ok"),
                         "torch hand VJP vs torch.func.jacrev(ref)": (9, 0, "ok"),
                         "torch hand JVP vs torch.func.jvp(ref)": (8, 0, "ok")}   # all, then each alone


def test_a_large_jacobian_is_a_skipped_row_with_its_size():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    col = run_case({"torch": project()}, {"torch": fabricate(ATTN, case, "float64", jac=False)}, case=case,
                   jac_elems=4321)
    assert rows(col)["torch hand VJP vs torch.func.jacrev(ref)"] == (0, 0, "skip")
    assert skipped(col) == [("attn", "torch hand VJP vs torch.func.jacrev(ref)", "float64",
                                  "Jacobian of 4321 elements (empty, or above --jacrev-max-elements)")]


def test_two_frameworks_are_also_compared_with_each_other():
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    t = fabricate(ATTN, case, "float64", seed=1)
    j = fabricate(ATTN, case, "float64", seed=1)
    col = run_case({"torch": project(), "jax": project()}, {"torch": t, "jax": j}, case=case)
    got = rows(col)
    cross = {"torch vs jax": (2, 0, "ok"), "torch hand VJP vs jax hand VJP (eq. 17)": (9, 0, "ok"),
             "torch hand JVP vs jax hand JVP": (14, 0, "ok")}
    jax_rows = {"jax impl vs jax reference", "jax hand VJP vs jax.vjp(ref)",
                "jax hand VJP (input subsets) vs jax.vjp(ref)", "jax hand VJP vs jax.jacrev(ref)",
                "jax hand JVP vs jax.jvp(ref)", "jax hand VJP of VJP vs jax.vjp(vjp(ref))",
                "jax hand HVP vs jax.jvp(vjp(ref))"}
    assert set(got) == set(DEFAULT_ROWS) | jax_rows | set(cross)
    assert {k: got[k] for k in cross} == cross
    for r in col.rows.values():
        assert r.cross == (r.label in cross) and r.framework == ("jax" if r.label in jax_rows else "torch")
    assert not failures(col)


def test_cross_rows_judge_one_framework_against_the_other():
    """torch's G_V off when o alone has a cotangent: its own rows and the torch-vs-JAX row fail there, with the
    torch side named as the one measured."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    t = fabricate(ATTN, case, "float64", seed=1)
    j = fabricate(ATTN, case, "float64", seed=1)
    i = request(case, ("q", "k", "v"), 1)                         # cotangent on o only
    t["vjp"][i] = t["vjp"][i][:2] + (t["vjp"][i][2] * 1.5,)
    col = run_case({"torch": project(), "jax": project()}, {"torch": t, "jax": j}, case=case)
    by_oracle = {c.oracle: c for c in failures(col)}
    assert set(by_oracle) == {"torch hand VJP vs torch.func.vjp(ref)", "torch hand VJP vs torch.func.jacrev(ref)",
                              "torch hand VJP vs jax hand VJP (eq. 17)"}
    for c in failures(col):
        assert (c.kind, c.input, c.output, c.wrt, c.framework) == ("vjp", "v", "o", "", "torch")
        assert c.rel_err == pytest.approx(0.5, rel=1e-12) and c.cross == ("jax" in c.oracle)
    assert rows(col)["torch hand VJP vs jax hand VJP (eq. 17)"] == (9, 1, "FAIL")


def test_cross_rows_compare_with_the_other_frameworks_hand_results():
    """JAX's own hand VJP and JVP wrong, torch's right: the torch-vs-JAX rows see JAX's hand results (not its
    reference's), so they fail too, with torch as the measured side and JAX's error in the denominator."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    t = fabricate(ATTN, case, "float64", seed=1)
    j = fabricate(ATTN, case, "float64", seed=1)
    j["vjp"][2] = (j["vjp"][2][0], j["vjp"][2][1] * 2, j["vjp"][2][2])        # cotangent on a only: G_K doubled
    j["jvp"][2] = (j["jvp"][2][0], j["jvp"][2][1] * 2)                       # tangent on k only: tangent of a
    col = run_case({"torch": project(), "jax": project()}, {"torch": t, "jax": j}, case=case)
    got = {(c.oracle, c.kind, c.input, c.output, c.framework) for c in failures(col)}
    assert got == {("jax hand VJP vs jax.vjp(ref)", "vjp", "k", "a", "jax"),
                   ("jax hand VJP vs jax.jacrev(ref)", "vjp", "k", "a", "jax"),
                   ("jax hand JVP vs jax.jvp(ref)", "jvp", "k", "a", "jax"),
                   ("torch hand VJP vs jax hand VJP (eq. 17)", "vjp", "k", "a", "torch"),
                   ("torch hand JVP vs jax hand JVP", "jvp", "k", "a", "torch")}
    assert all(c.rel_err == pytest.approx(0.5 if c.cross else 1.0, rel=1e-12) for c in failures(col))


def test_a_user_side_against_the_reference_of_the_other_framework():
    """--torch-impl: JAX runs only its reference, so it has no rows of its own, and the torch-vs-JAX rows compare
    yours with jax.vjp / jax.jvp of the reference (the reference is the denominator)."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    j = reference_only(ATTN, case, "float64")
    t = fabricate(ATTN, case, "float64", seed=5)
    t["forward"] = tuple(x.copy() for x in j["forward"])
    t["vjp"] = [tuple(g.copy() for g in j["vjp_ref"][m]) for _, m in case.vjp_requests]
    t["jvp"] = [tuple(x.copy() for x in ts) for ts in j["jvp_ref"]]
    t["vjp"][0] = (2 * t["vjp"][0][0],) + t["vjp"][0][1:]                   # G_Q doubled, both cotangents
    sides = {"jax": side(reference_only=True, forward_is_hand=False), "torch": project(user=True)}
    col = run_case(sides, {"jax": j, "torch": t}, case=case)                  # the reference-only side first
    got = rows(col)
    assert not [k for k in got if k.startswith("jax")]
    assert got["torch (yours) vs jax reference"] == (2, 0, "ok")
    assert got["torch hand VJP (yours) vs jax.vjp(ref) (eq. 17)"] == (9, 1, "FAIL")
    assert got["torch hand JVP (yours) vs jax.jvp(ref)"] == (8, 0, "ok")
    assert got["torch hand VJP vs torch.func.vjp(ref)"][2] == "FAIL"
    cross = [c for c in failures(col) if c.cross]
    assert len(cross) == 1 and cross[0].rel_err == pytest.approx(1.0, rel=1e-12)
    assert (cross[0].framework, cross[0].input, cross[0].output) == ("torch", "q", "o,a")


def test_a_jax_user_side_is_the_measured_side_against_the_project_torch():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    t = fabricate(ATTN, case, "float64", seed=1)
    j = fabricate(ATTN, case, "float64", seed=1)
    j["vjp"][0] = (2 * j["vjp"][0][0],) + j["vjp"][0][1:]
    col = run_case({"torch": project(), "jax": project(user=True)}, {"torch": t, "jax": j}, case=case)
    got = rows(col)
    assert got["jax (yours) vs torch"] == (2, 0, "ok")
    assert got["jax hand VJP (yours) vs torch hand VJP (eq. 17)"] == (9, 1, "FAIL")
    assert got["jax hand JVP (yours) vs torch hand JVP"] == (8, 0, "ok")
    cross = [c for c in failures(col) if c.cross]
    assert len(cross) == 1 and cross[0].framework == "jax"
    assert cross[0].rel_err == pytest.approx(1.0, rel=1e-12)     # the project's torch side is the denominator


def test_two_user_sides_divide_by_the_larger_norm():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    t = fabricate(ATTN, case, "float64", seed=1)
    j = fabricate(ATTN, case, "float64", seed=1)
    t["vjp"][0] = (2 * t["vjp"][0][0],) + t["vjp"][0][1:]
    col = run_case({"torch": project(user=True), "jax": project(user=True)}, {"torch": t, "jax": j}, case=case)
    got = rows(col)
    assert got["torch (yours) vs jax (yours)"] == (2, 0, "ok")
    assert got["torch hand VJP (yours) vs jax hand VJP (yours) (eq. 17)"] == (9, 1, "FAIL")
    assert got["torch hand JVP (yours) vs jax hand JVP (yours)"] == (8, 0, "ok")
    cross = [c for c in failures(col) if c.cross]
    assert len(cross) == 1 and cross[0].rel_err == pytest.approx(0.5, rel=1e-12)


def test_a_candidate_is_named_in_its_rows_and_failures():
    """A sharded entry (crosscheck.shards): its own name in every label, the framework's autodiff as oracle."""
    name = "torch sharded ring on 2 ranks"
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    i = request(case, ("k",), 0)
    r["vjp"][i] = (None, -r["vjp"][i][1], None)
    col = run_case({"torch": side(candidate=name)}, {"torch": r}, case=case)
    assert set(rows(col)) == {label.replace("torch impl", f"{name} impl").replace("torch hand", f"{name} hand")
                              for label in DEFAULT_ROWS}
    assert subset_oracle("torch", name).label() == f"{name} hand VJP (input subsets) vs torch.func.vjp(ref)"
    assert subset_oracle("jax").label() == "jax hand VJP (input subsets) vs jax.vjp(ref)"
    [c] = failures(col)
    assert (c.candidate, c.framework, c.c.oracle) == (name, "torch", subset_oracle("torch", name))
    assert (c.kind, c.input, c.output, c.wrt) == ("vjp", "k", "o,a", "k")
    assert c.rel_err == pytest.approx(2.0, rel=1e-12)


# --- compare_case: where a disagreement is reported ------------------------------------------------------------------

def test_a_forward_disagreement_names_the_output():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    r["forward"] = (r["forward"][0], r["forward"][1] + 1e-6)
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    [c] = failures(col)
    assert (c.oracle, c.kind, c.input, c.output, c.wrt, c.error) == ("torch impl vs torch reference", "forward", "-",
                                                                      "a", "", "")
    assert (c.shape, c.trial, c.dtype, c.device, c.tol) == (SHAPE, 0, "float64", "cpu", 1e-10)
    assert c.input_shapes == ((3, 2), (3, 2), (3, 4)) and c.op == "attn"
    assert 1e-10 < c.rel_err < 1e-4 and c.max_abs == pytest.approx(1e-6)
    assert not c.ok


def test_a_jvp_disagreement_names_the_tangent_subset_and_the_output():
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    i = case.tan_modes.index(("q", "v"))
    r["jvp"][i] = (r["jvp"][i][0] * 1.1, r["jvp"][i][1])
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    [c] = failures(col)
    assert (c.oracle, c.kind, c.input, c.output, c.wrt) == ("torch hand JVP vs torch.func.jvp(ref)", "jvp", "q,v",
                                                             "o", "")
    assert c.rel_err == pytest.approx(0.1, rel=1e-9)


def test_a_vjp_disagreement_in_an_input_subset_names_the_subset():
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    i = request(case, ("q", "v"), 2)                              # q and v require grad, cotangent on a only
    r["vjp"][i] = (r["vjp"][i][0] + 1, None, r["vjp"][i][2])
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    [c] = failures(col)
    assert (c.oracle, c.kind, c.input, c.output, c.wrt) == (
        "torch hand VJP (input subsets) vs torch.func.vjp(ref)", "vjp", "q", "a", "q,v")
    assert rows(col)["torch hand VJP (input subsets) vs torch.func.vjp(ref)"] == (27, 1, "FAIL")


def test_a_gradient_not_asked_for_fails_and_an_absent_one_is_not_compared():
    """With only k and v requiring grad a G_Q is a mistake (torch: None); the absent G_Q of the other requests is
    right, and the gradients after it are still compared."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    i = request(case, ("k", "v"), 0)
    r["vjp"][i] = (np.zeros((3, 2)),) + r["vjp"][i][1:]
    j = request(case, ("v",), 1)
    r["vjp"][j] = (None, None, r["vjp"][j][2] * 3)
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    q, v = sorted(failures(col), key=lambda c: c.input)
    assert (q.input, q.output, q.wrt, q.rel_err, q.max_abs) == ("q", "o,a", "k,v", math.inf, math.inf)
    assert q.note == "a gradient not asked for was computed (expected None)"
    assert (v.input, v.output, v.wrt) == ("v", "o", "v") and v.rel_err == pytest.approx(2.0)
    assert rows(col)["torch hand VJP (input subsets) vs torch.func.vjp(ref)"] == (28, 2, "FAIL")


def test_a_subset_request_with_every_input_is_the_default_path():
    """Collector.compare with ``wrt`` naming every input: no path label (as with ``wrt=None``)."""
    col = Collector(Config())
    g = (np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 4)))
    oracle = Oracle(Kind.VJP, "torch", Party("o"))
    col.compare(ATTN, info(), oracle, (2 * g[0],) + g[1:], g, ("o", "a"), ATTN.inputs, wrt=("q", "k", "v"))
    col.compare(ATTN, info(), oracle, (None, 2 * g[1], g[2]), g, ("o",), ATTN.inputs, wrt=("k", "v"))
    first, second = failures(col)
    assert (first.input, first.wrt, second.input, second.wrt) == ("q", "", "k", "k,v")
    assert rows(col)["o"] == (5, 2, "FAIL")


@pytest.mark.parametrize("which", range(5))
def test_a_second_order_disagreement_names_the_gradient(which):
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    vv = list(r["vjp_vjp"][0])
    vv[which] = vv[which] - 1
    r["vjp_vjp"] = [tuple(vv)]
    if which < 3:
        hv = list(r["hvp"][0])
        hv[which] = -hv[which]
        r["hvp"] = [tuple(hv)]
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    labels = ("q", "k", "v", "g_o", "g_a")
    by_kind = {c.kind: c for c in failures(col)}
    assert (by_kind["vjp_vjp"].input, by_kind["vjp_vjp"].output) == (labels[which], "o,a")
    assert by_kind["vjp_vjp"].oracle == "torch hand VJP of VJP vs torch.func.vjp(vjp(ref))"
    if which < 3:
        assert (by_kind["hvp"].input, by_kind["hvp"].output) == (labels[which], "o,a")
        assert by_kind["hvp"].rel_err == pytest.approx(2.0, rel=1e-12)
    assert len(failures(col)) == 1 + (which < 3)


def test_the_worst_errors_of_a_row_are_its_maxima():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    r["jvp"][0] = (r["jvp"][0][0] + 0.25, r["jvp"][0][1] + 1e-12)
    r["jvp"][1] = (r["jvp"][1][0] - 2.0, r["jvp"][1][1])
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    jvp_row = row(col, "torch hand JVP vs torch.func.jvp(ref)")
    assert jvp_row.max_abs == pytest.approx(2.0) and (jvp_row.compared, jvp_row.failed) == (8, 2)   # 1e-12 passes
    assert jvp_row.rel_err == max(c.rel_err for c in failures(col))
    assert jvp_row.rel_err == pytest.approx(2.0 * math.sqrt(12) / np.linalg.norm(r["jvp_ref"][1][0]), rel=1e-12)


def test_a_nan_in_a_reference_fails_the_row_with_an_infinite_error():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    bad = r["forward_ref"][0].copy()
    bad[0, 0] = np.nan
    r["forward_ref"] = (bad, r["forward_ref"][1])
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    forward = row(col, "torch impl vs torch reference")
    assert (forward.rel_err, forward.max_abs, forward.failed, forward.verdict) == (math.inf, math.inf, 1, "FAIL")
    [c] = failures(col)
    assert (c.output, c.rel_err, c.note) == ("o", math.inf, "NaN/Inf in the expected result")


def test_rows_use_the_configured_tolerance():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    r["forward"] = (r["forward"][0] * (1 + 1e-6), r["forward"][1])
    loose = Config(tolerances=dict(TOLERANCES, float64=1e-3), device="cuda")
    col = run_case({"torch": project()}, {"torch": r}, case=case, config=loose)
    assert not failures(col)
    assert all(r.tol == 1e-3 and r.device == "cuda" for r in col.rows.values())
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    assert [c.output for c in failures(col)] == ["o"]


# --- requests that raised and skipped parts -------------------------------------------------------------------------

def failed(msg="unsupported operand", inputs=("q", "k", "v")):
    return Failed(TypeError(msg), inputs)


def test_a_raised_vjp_request_is_one_failure_for_the_gradients_it_asked_for():
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    i = request(case, ("q", "v"), 1)
    r["vjp"][i] = failed()
    r["vjp"][0] = failed("backward returned an invalid gradient at index 1 - got [2, 3]")
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    subset, full = sorted(failures(col), key=lambda c: c.wrt == "")
    assert (subset.input, subset.output, subset.wrt, subset.error) == ("q,v", "o", "q,v",
                                                                        "TypeError: unsupported operand")
    assert subset.note == "hand-written VJP raised TypeError: unsupported operand"
    assert (subset.rel_err, subset.max_abs) == (math.inf, math.inf)
    assert (full.input, full.output, full.wrt) == ("k", "o,a", "")             # the gradient the error names
    assert rows(col)["torch hand VJP (input subsets) vs torch.func.vjp(ref)"] == (26, 1, "FAIL")
    assert rows(col)["torch hand VJP vs torch.func.vjp(ref)"] == (7, 1, "FAIL")
    # the Jacobian oracle's row skips the raised request (reported once, in the first row)
    assert rows(col)["torch hand VJP vs torch.func.jacrev(ref)"] == (6, 0, "ok")
    assert ("attn", "torch hand VJP vs torch.func.jacrev(ref)", "float64",
            "the torch hand VJP raised (reported in its own rows)") in skipped(col)


def test_a_raised_jvp_and_second_order_request_name_their_mode():
    case = Case(ATTN, "float64", SHAPE, 0, 0, True)
    r = fabricate(ATTN, case, "float64")
    r["jvp"][case.tan_modes.index(("k",))] = failed()
    r["hvp"] = [failed("no jvp")]
    r["vjp_vjp"] = [failed("no double backward")]
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    got = {c.kind: (c.input, c.output, c.note) for c in failures(col)}
    assert got == {"jvp": ("k", "o,a", "hand-written JVP raised TypeError: unsupported operand"),
                   "hvp": ("q,k,v", "o,a", "hand-written HVP raised TypeError: no jvp"),
                   "vjp_vjp": ("q,k,v,g_o,g_a", "o,a", "hand-written VJP of VJP raised TypeError: no double backward")}


def test_a_raised_forward_names_every_output():
    """As crosscheck.shards records a sharded case that could not run at all."""
    col = Collector(Config())
    oracle = Oracle(Kind.FORWARD, "torch", Party("x", "impl"), Party("torch", "reference"), candidate="x")
    col.compare(ATTN, info(trial=1), oracle, failed("boom"), None, (), ATTN.outputs)
    [c] = failures(col)
    assert (c.input, c.output, c.trial, c.candidate, c.error) == ("o,a", "", 1, "x", "TypeError: boom")
    assert rows(col) == {"x impl vs torch reference": (1, 1, "FAIL")}


@pytest.mark.parametrize("where", ["actual", "expected"])
def test_a_skipped_part_skips_its_row_with_the_reason(where):
    col = Collector(Config())
    g = (np.ones((3, 4)), np.ones((3, 3)))
    args = {"actual": g, "expected": g, where: Skip("no forward-mode rule")}
    col.compare(ATTN, info(), Oracle(Kind.JVP, "jax", Party("jvp row")), args["actual"], args["expected"], ("q",),
                ATTN.outputs)
    assert rows(col) == {"jvp row": (0, 0, "skip")}
    assert skipped(col) == [("attn", "jvp row", "float64", "no forward-mode rule")]
    assert not failures(col)


def test_cross_rows_skip_a_request_that_raised_on_either_side():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    t = fabricate(ATTN, case, "float64", seed=1)
    j = fabricate(ATTN, case, "float64", seed=1)
    t["vjp"][1] = failed()
    j["jvp"][2] = failed()
    col = run_case({"torch": project(), "jax": project()}, {"torch": t, "jax": j}, case=case)
    reasons = {(label, reason) for _, label, _, reason in skipped(col)}
    assert ("torch hand VJP vs jax hand VJP (eq. 17)",
            "the torch hand VJP raised (reported in its own rows)") in reasons
    assert ("torch hand JVP vs jax hand JVP", "the JAX hand JVP raised (reported in its own rows)") in reasons
    assert rows(col)["torch hand VJP vs jax hand VJP (eq. 17)"] == (6, 0, "ok")
    assert rows(col)["torch hand JVP vs jax hand JVP"] == (6, 0, "ok")
    assert {c.oracle for c in failures(col)} == {"torch hand VJP vs torch.func.vjp(ref)",
                                                "jax hand JVP vs jax.jvp(ref)"}


def test_a_missing_hand_jvp_skips_the_jvp_rows():
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    r["jvp"] = [Skip("an autograd.Function without jvp")] * len(case.tan_modes)
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    assert rows(col)["torch hand JVP vs torch.func.jvp(ref)"] == (0, 0, "skip")
    assert ("attn", "torch hand JVP vs torch.func.jvp(ref)", "float64",
            "an autograd.Function without jvp") in skipped(col)


# --- the Jacobian's size --------------------------------------------------------------------------------------------

def test_jacrev_size_counts_real_elements():
    """inputs 2·3 + 2·3 + 2·4 = 20 numbers, outputs 2·4 + 2·2 = 12: 240 real entries; complex: 4 real per entry."""
    shape = (2, 3, 4)
    for dtype, want in (("float64", 240), ("float32", 240), ("complex128", 960), ("complex64", 960)):
        case = Case(ATTN, dtype, shape, 0, 0, False)
        size = jacrev_size(ATTN, case, shape, dtype)
        assert size == want and isinstance(size, int)
    case = Case(SPECS["tanh"], "float64", (5, 1, 1), 0, 0, False)
    assert jacrev_size(SPECS["tanh"], case, (5, 1, 1), "float64") == 625
    case = Case(ATTN, "float64", (0, 3, 4), 0, 0, False)
    assert jacrev_size(ATTN, case, (0, 3, 4), "float64") == 0


# --- low precision: the float64 ground truth (torch) -----------------------------------------------------------------

def exact_attn(case):
    """(1)-(3) and their first derivatives in float64 numpy (real): the forward, one VJP per cotangent mode, one
    JVP per tangent subset."""
    q, k, v = (x.astype(np.float64) for x in case.inputs)
    a = np.tanh(q @ k.T)
    fwd = (a @ v, a)
    vjps = []
    for go, ga in case.cots:
        go = np.zeros_like(fwd[0]) if go is None else go.astype(np.float64)
        ga = np.zeros_like(a) if ga is None else ga.astype(np.float64)
        gx = (go @ v.T + ga) * (1 - a * a)
        vjps.append((gx @ k, gx.T @ q, a.T @ go))
    jvps = []
    for tq, tk, tv in case.tans:
        tq = np.zeros_like(q) if tq is None else tq.astype(np.float64)
        tk = np.zeros_like(k) if tk is None else tk.astype(np.float64)
        tv = np.zeros_like(v) if tv is None else tv.astype(np.float64)
        da = (1 - a * a) * (tq @ k.T + q @ tk.T)
        jvps.append((da @ v + a @ tv, da))
    return fwd, vjps, jvps


def low_precision_results(case, exact, dtype="float32"):
    fwd, vjps, jvps = exact
    cast = lambda t: tuple(None if x is None else x.astype(dtype) for x in t)
    return {"forward": cast(fwd), "forward_ref": cast(fwd), "vjp_ref": [cast(g) for g in vjps],
            "vjp": [cast(tuple(g if name in wrt else None for g, name in zip(vjps[m], ("q", "k", "v"))))
                    for wrt, m in case.vjp_requests],
            "vjp_jac": [cast(g) for g in vjps], "jvp_ref": [cast(t) for t in jvps], "jvp": [cast(t) for t in jvps]}


def test_low_precision_is_also_compared_with_the_float64_truth():
    pytest.importorskip("torch")
    case = Case(ATTN, "float32", SHAPE, 0, 0, False)
    exact = exact_attn(case)
    t = low_precision_results(case, exact)
    j = reference_only(ATTN, case, "float32")
    col = run_case({"jax": side(reference_only=True, forward_is_hand=False), "torch": project()},
                   {"jax": j, "torch": t}, dtype="float32", case=case)
    got = rows(col)
    assert got["torch vs float64 truth"] == (2, 0, "ok")
    assert got["torch hand VJP vs float64 truth"] == (9, 0, "ok")
    assert got["torch hand JVP vs float64 truth"] == (8, 0, "ok")
    assert not [k for k in got if k.startswith("jax")]
    assert all(r.tol == 1e-4 for r in col.rows.values())
    # a backward wrong by 1e-3 in G_K: its own float32 reference rows agree (the reference is wrong the same way
    # here), the truth does not
    t["vjp"][0] = (t["vjp"][0][0], t["vjp"][0][1] * np.float32(1.001), t["vjp"][0][2])
    t["jvp"][0] = (t["jvp"][0][0], t["jvp"][0][1] * np.float32(0.999))
    t["forward"] = (t["forward"][0] * np.float32(1.001), t["forward"][1])
    col = run_case({"torch": project()}, {"torch": t}, dtype="float32", case=case)
    got = {(c.oracle, c.kind, c.input, c.output) for c in failures(col)}
    assert {("torch hand VJP vs float64 truth", "vjp", "k", "o,a"), ("torch hand JVP vs float64 truth", "jvp",
            "q,k,v", "a"), ("torch vs float64 truth", "forward", "-", "o")} <= got
    assert all(c.rel_err == pytest.approx(1e-3, rel=1e-2) for c in failures(col) if "truth" in c.oracle)


def test_low_precision_truth_skips_a_request_that_raised():
    pytest.importorskip("torch")
    case = Case(ATTN, "complex64", (2, 2, 2), 0, 0, False)
    r = fabricate(ATTN, case, "complex64")
    r["vjp"] = [failed()] * len(case.vjp_requests)
    r["jvp"] = [failed()] * len(case.tan_modes)
    col = run_case({"torch": project(forward_is_hand=False)}, {"torch": r}, dtype="complex64", case=case)
    assert rows(col)["torch hand VJP vs complex128 truth"] == (0, 0, "skip")
    assert rows(col)["torch hand JVP vs complex128 truth"] == (0, 0, "skip")
    assert rows(col)["torch vs complex128 truth"] == (2, 2, "FAIL")    # random numbers, not attn's
    assert ("attn", "torch hand JVP vs complex128 truth", "complex64",
            "the torch hand JVP raised (reported in its own rows)") in skipped(col)


def test_truth_of_a_building_block_is_its_own_reference():
    """scores x = q kᵀ (1): the float64 truth is the block's, not attn's."""
    pytest.importorskip("torch")
    spec = SPECS["scores"]
    case = Case(spec, "float32", SHAPE, 0, 0, False)
    q, k = (x.astype(np.float64) for x in case.inputs)
    t = truth(spec, case, "float32")
    np.testing.assert_allclose(t.forward[0], q @ k.T, rtol=1e-12)
    assert t.forward[0].dtype == np.float64
    [(g,)] = [c for c in case.cots]
    np.testing.assert_allclose(t.vjp[0][0], g.astype(np.float64) @ k, rtol=1e-12)
    np.testing.assert_allclose(t.vjp[0][1], g.astype(np.float64).T @ q, rtol=1e-12)
    assert len(t.jvp) == len(case.tan_modes)
    for (tq, tk), (want,) in zip(case.tans, t.jvp):
        tq = np.zeros_like(q) if tq is None else tq.astype(np.float64)
        tk = np.zeros_like(k) if tk is None else tk.astype(np.float64)
        np.testing.assert_allclose(want, tq @ k.T + q @ tk.T, rtol=1e-12)


def test_truth_of_attn_with_unused_outputs():
    pytest.importorskip("torch")
    case = Case(ATTN, "float32", SHAPE, 1, 0, False)
    fwd, vjps, jvps = exact_attn(case)
    t = truth(ATTN, case, "float32")
    for got, want in zip(t.forward, fwd):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert len(t.vjp) == 3 and len(t.jvp) == len(case.tan_modes)
    for got, want in zip(t.vjp + t.jvp, vjps + jvps):
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-14)


def test_default_run_bounds_are_tighter_than_the_tolerances():
    """The bounds --help states for the default run are advice on how close to roundoff a run is: each must be
    positive and below its dtype's tolerance (a bound at or above the tolerance says nothing the verdict does not;
    a bound of zero or below fails every run).  The rows themselves are checked against the bounds by the slow
    tests/crosscheck/test_run.py::test_default_run_agrees_everywhere."""
    assert set(metrics.DEFAULT_RUN_BOUNDS) == {"float32", "float64", "complex128"}
    for name, bound in metrics.DEFAULT_RUN_BOUNDS.items():
        assert 0 < bound < TOLERANCES[name] / 2, (name, bound, TOLERANCES[name])


def test_x_limit_keeps_two_sides_tanh_terms_within_half_the_tolerance():
    """metrics.x_limit: 2·(2·C_TANH + 1)·u·sinh²(limit) is half the dtype's tolerance; the figures the docs and
    --help state (2.44, 5.57); C_TANH covers the worst tanh measured within them (XLA: 4.9 float32, 5.1 float64)."""
    assert metrics.C_TANH == 6.0
    assert (DTYPES["float32"].u, DTYPES["complex64"].u) == (2.0 ** -24, 2.0 ** -24)
    assert (DTYPES["float64"].u, DTYPES["complex128"].u) == (2.0 ** -53, 2.0 ** -53)
    for name, d in DTYPES.items():
        limit = metrics.x_limit(name)
        assert 2 * (2 * 6.0 + 1) * d.u * math.sinh(limit) ** 2 == pytest.approx(d.tol / 2, rel=1e-12), name
    assert round(metrics.x_limit("float32"), 2) == round(metrics.x_limit("complex64"), 2) == 2.44
    assert round(metrics.x_limit("float64"), 2) == round(metrics.x_limit("complex128"), 2) == 5.57


def test_an_own_oracle_is_the_users_only_when_said():
    """The kernel and sharded candidates build their oracles without ``yours``: their console labels carry no
    "(yours)" (a default of True would mark every candidate row of a plain run as the user's)."""
    from crosscheck.compare import own_oracle
    against = Party("torch", "reference")
    plain = own_oracle("torch", Kind.FORWARD, "impl", against, "torch sharded ring on 2 ranks")
    assert plain.label(console=True) == "torch sharded ring on 2 ranks impl vs torch reference"
    mine = own_oracle("torch", Kind.FORWARD, "impl", against, yours=True)
    assert mine.label(console=True) == "torch impl (yours) vs torch reference"


# --- the return-order slip: Comparison.matches ----------------------------------------------------------------------

def grads(seed=3):
    """G_Q, G_K (both n x d: one shape) and G_V (n x e) on SHAPE, random and nonzero."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in ATTN.input_shapes(*SHAPE))


def matches(actual, expected, kind=Kind.VJP, labels=ATTN.inputs, tol=None):
    """Collector.compare of one request: each failure's ``matches``, by the gradient (output) it is of."""
    col = Collector(Config() if tol is None else Config(tolerances=dict(TOLERANCES, float64=tol)))
    col.compare(ATTN, info(), Oracle(kind, "torch", Party("row")), actual, expected, ("o", "a"), labels)
    return {(c.output if kind.of_outputs else c.input): c.matches for c in failures(col)}


def test_a_return_order_slip_names_the_input_each_gradient_matches():
    """A backward returning (g_k, g_q, g_v) for (g_q, g_k, g_v): G_Q and G_K fail, each agreeing with the other's
    expected gradient (in the autodiff and the Jacobian rows alike); G_V, right, is no failure."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    gq, gk, gv = r["vjp"][0]
    r["vjp"][0] = (gk, gq, gv)
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    got = {(c.oracle, c.input, c.output): c.matches for c in failures(col)}
    assert got == {("torch hand VJP vs torch.func.vjp(ref)", "q", "o,a"): ("k",),
                   ("torch hand VJP vs torch.func.vjp(ref)", "k", "o,a"): ("q",),
                   ("torch hand VJP vs torch.func.jacrev(ref)", "q", "o,a"): ("k",),
                   ("torch hand VJP vs torch.func.jacrev(ref)", "k", "o,a"): ("q",)}


def test_a_wrong_gradient_agreeing_with_no_other_input_matches_nothing():
    """Same shape as G_K but not G_K's numbers: no slip; a G_V off (no other input of its shape): none either;
    an absent G_Q where no other expected gradient is zero: none."""
    gq, gk, gv = grads()
    assert matches((-gq, gk, gv), (gq, gk, gv)) == {"q": ()}
    assert matches((gq, gk, 2 * gv), (gq, gk, gv)) == {"v": ()}
    assert matches((None, gk, gv), (gq, gk, gv)) == {"q": ()}


def test_matches_hold_another_gradient_to_the_tolerance_inclusively():
    """G_Q returned as G_K within the tolerance, exactly at it: a match; a hair (one ulp of the tolerance) over
    it: none."""
    gq, gk, gv = grads()
    near = gk * (1 + 1e-9)
    tol = diff(near, gk).rel_err
    assert 0 < tol < 1e-8
    assert matches((near, gk, gv), (gq, gk, gv), tol=tol) == {"q": ("k",)}
    assert matches((near, gk, gv), (gq, gk, gv), tol=float(np.nextafter(tol, 0))) == {"q": ()}


def test_a_gradient_matching_only_zero_gradients_is_zero_not_a_slip():
    """Cotangent on a only, so G_V = aᵀ·0 is zero: an absent G_Q (zero) agrees with it, which proves no slip
    ("0"); so does an absent G_V where G_Q is zero, and a returned zero G_Q where G_K (its shape) is zero."""
    case = Case(ATTN, "float64", SHAPE, 0, 0, False)
    r = fabricate(ATTN, case, "float64")
    m = case.cot_modes.index(("a",))
    gq, gk, _ = r["vjp_ref"][m]
    zero_v = np.zeros(ATTN.input_shapes(*SHAPE)[2])
    r["vjp_ref"][m] = r["vjp_jac"][m] = (gq, gk, zero_v)
    r["vjp"][request(case, ("q", "k", "v"), m)] = (None, gk.copy(), zero_v.copy())
    col = run_case({"torch": project()}, {"torch": r}, case=case)
    got = {(c.oracle, c.input, c.output): c.matches for c in failures(col)}
    assert got == {("torch hand VJP vs torch.func.vjp(ref)", "q", "a"): ("0",),
                   ("torch hand VJP vs torch.func.jacrev(ref)", "q", "a"): ("0",)}
    gq, gk, gv = grads()
    zero_q = np.zeros_like(gq)
    assert matches((zero_q, gk, None), (zero_q, gk, gv)) == {"v": ("0",)}           # the zero one before it
    assert matches((zero_q, zero_q, gv), (gq, zero_q, gv)) == {"q": ("0",)}          # returned, not absent


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_slip_onto_a_gradient_of_one_sign_names_it(sign):
    """Whatever the signs of the matched gradient's entries, it is nonzero: named, not "0"."""
    gq, gk, gv = grads()
    gk = sign * (np.abs(gk) + 1)
    assert matches((gk, gk, gv), (gq, gk, gv)) == {"q": ("k",)}


def test_an_absent_expected_gradient_is_never_named_as_matched():
    """The other side's G_K absent (a cross row against a user's hand VJP): a zero G_Q agrees with no nonzero
    gradient, so no input is named (an absent gradient has no shape to compare)."""
    gq, gk, gv = grads()
    got = matches((np.zeros_like(gq), None, gv), (gq, None, gv))
    assert set(got) == {"q"} and got["q"] in ((), ("0",))


@pytest.mark.parametrize("kind", list(Kind))
def test_matches_are_only_for_first_order_vjps(kind):
    """A failing forward output, JVP tangent, VJP-of-VJP or HVP gradient equal to another entry's expected value
    is not a return-order slip: () for every kind but Kind.VJP."""
    gq, gk, gv = grads()
    if kind.of_outputs:
        rng = np.random.default_rng(4)
        x, y = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
        actual, expected, labels = (y, y), (x, y), ATTN.outputs
    else:
        extra = tuple(np.ones(s) for s in ATTN.output_shapes(*SHAPE)) if kind is Kind.VJP_VJP else ()
        labels = ATTN.inputs + (("g_o", "g_a") if kind is Kind.VJP_VJP else ())
        actual, expected = (gk, gk, gv) + extra, (gq, gk, gv) + extra
    want = ("a",) if kind.of_outputs else ("k",)
    assert matches(actual, expected, kind, labels) == {labels[0]: want if kind is Kind.VJP else ()}


# --- second_order_skips -------------------------------------------------------------------------------------------

SECOND_ORDER_ROWS = ("torch hand VJP of VJP vs torch.func.vjp(vjp(ref))", "torch hand HVP vs torch.func.jvp(vjp(ref))")


def test_a_side_without_second_order_skips_its_second_order_rows_on_path_shapes():
    refusal = "an autograd.Function without double backward"
    col = Collector(Config())
    second_order_skips(col, ATTN, side(second_order_missing=refusal), Case(ATTN, "float64", SHAPE, 0, 0, True),
                       "float64", "torch")
    assert skipped(col) == [("attn", label, "float64", refusal) for label in SECOND_ORDER_ROWS]
    assert rows(col) == {label: (0, 0, "skip") for label in SECOND_ORDER_ROWS}
    name = "torch sharded ring on 2 ranks"
    col = Collector(Config())
    second_order_skips(col, ATTN, side(second_order_missing=refusal, candidate=name),
                       Case(ATTN, "float64", SHAPE, 0, 0, True), "float64", "torch")
    assert [label for _, label, _, _ in skipped(col)] == [label.replace("torch hand", f"{name} hand")
                                                          for label in SECOND_ORDER_ROWS]


@pytest.mark.parametrize("missing, all_paths", [("no double backward", False), ("", True), ("", False)])
def test_second_order_skips_nothing_off_path_shapes_or_with_second_order(missing, all_paths):
    """Off the path shapes second order is not checked at all (no row); a side with second order has its rows."""
    col = Collector(Config())
    second_order_skips(col, ATTN, side(second_order_missing=missing), Case(ATTN, "float64", SHAPE, 0, 0, all_paths),
                       "float64", "torch")
    assert not col.skipped and not col.rows
