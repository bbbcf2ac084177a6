"""crosscheck's strictness, pinned: for each piece that decides a verdict — each dtype's tolerance, each path
family (VJP input subsets, cotangent modes, JVP tangent subsets, second order), the imaginary parts, distinct
``--trials`` draws, the norm floor, the review's detection routes — a planted solution
(``tests/support/planted_solutions/strictness.py``) that only that piece catches, in torch and in JAX.  Weakening the
piece (a looser tolerance, paths left out, ``.real`` compared, one draw reused, a larger floor, a route
disabled) turns that solution's FAIL into OK, and the test here red; each was checked that way.

Only crosscheck's public surface is used: ``run(Config)``, ``Report`` / ``Comparison`` fields,
``TOLERANCES``, ``NORM_FLOOR`` and the CLI's ``--json`` document.  Runs are kept small (one shape, one trial,
the dtypes and frameworks a pin needs): a pin is about one piece, not about coverage.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

import crosscheck
from crosscheck import NORM_FLOOR, TOLERANCES, Config, run
from crosscheck.cli import main

from tests.conftest import SUPPORT, require_jax
from tests.support.planted_solutions import strictness as planted

PLANTED = SUPPORT / "planted_solutions"
SOLUTIONS = str(PLANTED / "strictness.py")
SHAPE = (4, 2, 3)                     # n, d, e all different and >= 2: every path is checked on it
FRAMEWORKS = ["torch", "jax"]


def _needs(fw):
    if fw == "jax":
        require_jax()


def check(fw: str, name: str, dtypes=("float64",), paths: int = 1, **options) -> crosscheck.Report:
    """One small run of the planted solution ``name`` (torch: the Function ``name``; JAX: ``jax_<snake>``)."""
    _needs(fw)
    impl = {"torch_impl": getattr(planted, name).apply} if fw == "torch" else {"jax_impl": getattr(planted, name)}
    config = dict(ops=("attn",), frameworks=(fw,), dtypes=tuple(dtypes), shapes=(SHAPE,), random_shapes=0,
                  trials=1, path_shapes=paths, review=False, **impl)
    config.update(options)
    return run(Config(**config))


JAX_NAMES = {"SavesALower": "jax_saves_a_lower", "ConjugatedGradients": "jax_conjugated_gradients",
             "RealPartGradients": "jax_real_part_gradients",
             "WrongWhenVNotRequired": "jax_wrong_when_v_not_differentiated",
             "WrongWhenOUnused": "jax_wrong_when_o_unused",
             "JvpWrongWithoutK": "jax_jvp_wrong_without_k", "FirstOrderOnly": "jax_first_order_only",
             "WrongWhenQ00Large": "jax_wrong_when_q00_large", "SavesXRecomputesTanh": "jax_saves_x_recomputes_tanh"}


def solution(fw: str, name: str) -> str:
    return name if fw == "torch" else JAX_NAMES[name]


# --- tolerances -------------------------------------------------------------------------------------------------------

def test_tolerance_table_is_the_documented_one_and_every_row_uses_it():
    """The table itself (crosscheck/metrics.py's docstring says why these values), and that a run's rows judge
    with it: a dtype's tolerance cannot drift without this test saying so."""
    assert TOLERANCES == {"float32": 1e-4, "complex64": 1e-4, "float64": 1e-10, "complex128": 1e-10}
    assert NORM_FLOOR == 1e-6
    assert Config().tolerances == TOLERANCES
    report = check("torch", "SavesALower", dtypes=("float32", "float64", "complex64", "complex128"), paths=0)
    assert {r.dtype for r in report.rows} == set(TOLERANCES)
    assert all(r.tol == TOLERANCES[r.dtype] for r in report.rows)
    assert all(c.tol == TOLERANCES[c.dtype] for c in report.failures)


# the next lower precision's roundoff: float32 ~6e-8, float16 ~5e-4 (unit roundoff), complex: the same per part
LOWER_ROUNDOFF = {"float64": 6e-8, "complex128": 6e-8, "float32": 5e-4, "complex64": 5e-4}


@pytest.mark.parametrize("dtype", sorted(TOLERANCES))
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_each_tolerance_catches_a_backward_in_the_next_lower_precision(fw, dtype):
    """a saved in the next lower precision: errors of that precision's roundoff, above the dtype's tolerance and
    never above it by much (measured on this shape: float64 6e-9..5e-8, complex128 4e-8..1.1e-7 against 1e-10;
    float32 1.05e-4..2.6e-4, complex64 2.5e-4 against 1e-4), so a tolerance loosened to the lower precision's
    roundoff (float64 → 1e-7, complex128 → 2e-7, float32 / complex64 → 3e-4) lets this solution pass."""
    report = check(fw, solution(fw, "SavesALower"), dtypes=(dtype,), paths=0)
    errors = [c.rel_err for c in report.failures]
    assert errors, f"{dtype}: a backward from a in the next lower precision passed"
    assert all(c.kind == "vjp" and not c.error for c in report.failures)
    assert max(errors) < 2 * LOWER_ROUNDOFF[dtype]            # a precision bug, not a formula bug
    worst = max(r.rel_err for r in report.rows)
    assert worst == max(errors)


# --- complex: imaginary parts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_imaginary_parts_are_compared(fw):
    """grad.conj(): real parts right, so it passes in float64 and fails in complex128 on the imaginary parts."""
    name = solution(fw, "ConjugatedGradients")
    assert check(fw, name, dtypes=("float64",), paths=0).ok
    report = check(fw, name, dtypes=("complex128",), paths=0)
    assert report.failures and {c.kind for c in report.failures} == {"vjp"}
    assert all(c.max_abs > 0 for c in report.failures)        # the difference is purely imaginary


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_imaginary_parts_missing_from_a_result_are_compared(fw):
    """grad.real: in JAX a real array against the complex reference, compared as complex (not cast to real)."""
    report = check(fw, solution(fw, "RealPartGradients"), dtypes=("complex128",), paths=0)
    assert report.failures and {c.kind for c in report.failures} == {"vjp"}


# --- path families ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_vjp_input_subsets_are_checked(fw):
    report = check(fw, solution(fw, "WrongWhenVNotRequired"))
    assert report.failures
    for c in report.failures:                        # only subsets without v: checked nowhere else
        assert c.kind == "vjp" and c.wrt and "v" not in c.wrt, c.message()
    assert check(fw, solution(fw, "WrongWhenVNotRequired"), paths=0).ok


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_cotangent_modes_are_checked(fw):
    report = check(fw, solution(fw, "WrongWhenOUnused"), paths=0)
    assert report.failures
    assert all(c.kind == "vjp" and c.outputs == ("a",) for c in report.failures)   # the cotangent on a alone


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_jvp_tangent_subsets_are_checked(fw):
    report = check(fw, solution(fw, "JvpWrongWithoutK"))
    jvp = [c for c in report.failures if c.kind == "jvp"]
    assert jvp and all(c.inputs == ("q", "v") for c in jvp)
    # JAX transposes a custom_jvp rule into its VJP, so there the same branch also fails the VJP of the subset
    # (q, v); torch's Function.jvp is used for forward mode only
    others = [c for c in report.failures if c.kind != "jvp"]
    assert all(c.kind == "vjp" and c.wrt == ("q", "v") for c in others) if fw == "jax" else not others
    assert check(fw, solution(fw, "JvpWrongWithoutK"), paths=0).ok   # all tangents, or one: right


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_second_order_is_checked_both_ways(fw):
    report = check(fw, solution(fw, "FirstOrderOnly"))
    assert {c.kind for c in report.failures} == {"vjp_vjp", "hvp"}   # VJP of the VJP and forward-over-reverse


# --- distinct draws per trial -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_trials_draw_distinct_inputs(fw):
    """Wrong only when q[0, 0] > 0.5: for a seed whose first draw is clean, more trials must find a draw that is
    not (if every trial drew the first trial's numbers, no seed would)."""
    name = solution(fw, "WrongWhenQ00Large")
    for seed in range(12):
        if check(fw, name, paths=0, seed=seed).failures:
            continue                                   # the first draw already has q[0, 0] > 0.5
        report = check(fw, name, paths=0, seed=seed, trials=6)
        if report.failures:
            assert {c.trial for c in report.failures} - {0} and all(c.trial != 0 for c in report.failures)
            return
    pytest.fail("no seed whose later trials catch what its first trial cannot: do --trials draw new inputs?")


# --- the norm floor ---------------------------------------------------------------------------------------------------

def test_norm_floor_judges_an_exactly_zero_gradient_in_absolute_terms():
    """G_V is exactly zero when o is unused; 1e-15 noise there is an error of ~4e-15 / NORM_FLOOR ≈ 4e-9 > 1e-10.
    With a floor of 1e-4 or more it would pass."""
    report = check("torch", "NoiseOnZeroGradient", paths=0)
    assert report.failures
    for c in report.failures:
        assert (c.kind, c.inputs, c.outputs) == ("vjp", ("v",), ("a",))
        assert c.rel_err == pytest.approx(1e-15 * (SHAPE[0] * SHAPE[2]) ** 0.5 / NORM_FLOOR, rel=1e-6)


# --- the metric -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_metric_relative_error_is_normwise_against_the_reference(dtype):
    """rel err = ‖actual − expected‖ / ‖expected‖ over the whole complex array: a doubled G_Q is off by
    exactly 1 (not 0.5: the user's side is never the denominator), and max_abs is the largest entry of the
    difference."""
    report = check("torch", "DoubledGradQ", dtypes=(dtype,), paths=0)
    assert report.failures and all(c.inputs == ("q",) for c in report.failures)
    for c in report.failures:
        assert c.rel_err == pytest.approx(1.0, rel=1e-9) and 0 < c.max_abs < 10
    right = [r for r in report.rows if not r.failed]
    assert right and all(r.compared and r.rel_err <= r.tol and r.max_abs < 1e-12 for r in right)


def test_metric_compares_a_missing_gradient_as_zeros():
    """None is torch's zero gradient: compared as zeros, so a None where G_V is not zero fails (and only there:
    with o unused G_V is zero and None is right)."""
    report = check("torch", "NoneForGradV", paths=0)
    assert report.failures
    assert all(c.inputs == ("v",) and "o" in c.outputs and c.rel_err == pytest.approx(1.0)
               for c in report.failures)


def test_metric_between_two_user_implementations_divides_by_the_larger_norm():
    """torch (yours) with G_Q doubled against JAX (yours), right: neither is trusted, so rel err is
    ‖2g − g‖ / max(‖2g‖, ‖g‖) = 0.5, not 1."""
    _needs("jax")
    report = run(Config(ops=("attn",), dtypes=("float64", "complex128"), shapes=(SHAPE,), random_shapes=0, trials=1,
                        path_shapes=0, review=False, torch_impl=planted.DoubledGradQ.apply,
                        jax_impl=planted.jax_saves_x_recomputes_tanh))
    cross = [c for c in report.failures if c.cross and c.kind == "vjp"]
    assert cross and all(c.rel_err == pytest.approx(0.5, rel=1e-9) for c in cross)


def test_metric_compares_a_missing_reference_gradient_as_zeros():
    """Against the project's torch VJP, which returns None for G_V when o is unused, a JAX G_V of ones there
    fails the torch-vs-JAX row too (None is a zero on either side of a comparison)."""
    _needs("jax")
    report = run(Config(ops=("attn",), dtypes=("float64",), shapes=(SHAPE,), random_shapes=0, trials=1,
                        path_shapes=0, review=False, jax_impl=planted.jax_grad_v_when_o_unused))
    cross = [c for c in report.failures if c.cross]
    assert cross and all((c.inputs, c.outputs) == (("v",), ("a",)) for c in cross)


@pytest.mark.parametrize("shape", [(4, 2, 3), (2, 4, 3), (1, 1, 1)])
def test_metric_flags_a_wrong_shape_at_any_size(shape):
    """(d, n) for (n, d) whichever is larger (a shape check by ordering would miss one of the two)."""
    report = check("torch", "GradKTransposed", paths=0, shapes=(shape,))
    if shape[0] == shape[1]:
        assert report.ok                               # (1, 1) transposed is the same array
    else:
        assert report.failures and all(c.inputs == ("k",) and c.rel_err == float("inf") and "shape" in c.note
                                       for c in report.failures)


def test_metric_judges_single_elements_and_passes_empty_sizes():
    """A one-element gradient is compared like any other (only empty arrays are 0 by definition), and empty
    sizes compare as agreeing without an error."""
    report = check("torch", "ConjugatedGradients", dtypes=("complex128",), paths=0, shapes=((1, 1, 1),))
    assert report.failures
    report = check("torch", "DoubledGradQ", paths=1, shapes=((0, 2, 3), (2, 0, 3)))     # G_Q is empty
    assert report.ok and all(r.rel_err == 0 and r.max_abs == 0 for r in report.rows)


# --- the review's detection routes ------------------------------------------------------------------------------------

def cli_json(*args):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"crosscheck-strictness-{os.getpid()}.json")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(list(args) + ["--json", path])
    with open(path) as f:
        doc = json.load(f)
    os.remove(path)
    return doc


def review_titles(fw: str, impl: str):
    _needs(fw)
    doc = cli_json(f"--{fw}-impl", impl, "--frameworks", fw, "--dtype", "float64", "--trials", "1",
                   "--random-shapes", "0", "--shapes", "1x1x1", "--path-shapes", "0")
    return {(f["key"], f["title"].split(" in ")[0]) for f in doc["review"][fw]["findings"]}


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_review_sees_tanh_recomputed_from_a_saved_x(fw):
    """Saves x and recomputes tanh(x): the backward has no product of class x, so only the tanh route of the
    `recomputes` finding sees it (issue 24: disabling JAX's went unnoticed)."""
    titles = review_titles(fw, f"{SOLUTIONS}:{solution(fw, 'SavesXRecomputesTanh')}")
    assert ("recomputes", "recomputes tanh") in titles
    assert ("recomputes", "recomputes x = q kᵀ") not in titles


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_review_sees_x_recomputed(fw):
    """Recomputes x = q kᵀ (and tanh of it): the product route names it, apart from the tanh."""
    findings = PLANTED / "findings.py"
    titles = review_titles(fw, f"{findings}:{'RecomputesTanh' if fw == 'torch' else 'jax_recomputes_tanh'}")
    assert {("recomputes", "recomputes tanh"), ("recomputes", "recomputes x = q kᵀ")} <= titles
