"""crosscheck.cases, the case generator, through its public entry points (``python -m mutation cases`` runs this
file on each mutant): which shapes a run checks, which cotangent / tangent modes and VJP requests a case holds,
and that every draw is keyed by the case.  Pure numpy: no torch or JAX import, well under a second."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from crosscheck.cases import EDGE_SHAPES, Case, Job, modes, path_shapes, resolve_shapes, subsets
from crosscheck.metrics import x_limit
from crosscheck.sampling import qk_std, sample_inputs, sample_like, scores, x_std
from crosscheck.specs import SPECS

ATTN, MIX, TANH = SPECS["attn"], SPECS["mix"], SPECS["tanh"]


def _config(shapes=(), random_shapes=0, seed=0, ranges=((1, 8), (1, 8), (1, 8))):
    n, d, e = ranges
    return SimpleNamespace(seed=seed, shapes=shapes, random_shapes=random_shapes, n_range=n, d_range=d, e_range=e)


# --- the default shapes ---------------------------------------------------------------------------------------------

def test_edge_shapes_are_the_documented_default_set():
    # The default shapes are part of the run's contract (the README's and docs' comparison counts and timings, a
    # user's saved --json compared across versions): a change must be deliberate, so the set is pinned here.
    assert EDGE_SHAPES == ((1, 1, 1), (1, 3, 2), (4, 1, 3), (5, 2, 3), (2, 5, 4), (3, 3, 3))


def test_edge_shapes_cover_each_edge_they_are_there_for():
    ones, n1, d1, tall_d_ne_e, wide, square = EDGE_SHAPES
    assert ones == (1, 1, 1)                                           # 1×1 everything
    assert n1[0] == 1 and min(n1[1:]) > 1 and n1[1] != n1[2]           # n = 1 only, d ≠ e
    assert d1[1] == 1 and d1[0] > 1 and d1[2] > 1                      # d = 1 only
    assert tall_d_ne_e[0] > tall_d_ne_e[1] > 1 and tall_d_ne_e[1] != tall_d_ne_e[2]   # tall q, k (n > d)
    assert 1 < wide[0] < wide[1]                                       # wide q, k (n < d)
    assert len(set(square)) == 1 and square[0] > 1                     # n = d = e
    assert len(set(EDGE_SHAPES)) == len(EDGE_SHAPES)


# --- resolve_shapes --------------------------------------------------------------------------------------------------

def test_fixed_shapes_come_first_as_int_tuples_then_the_random_ones():
    shapes = resolve_shapes(_config(shapes=[[2, 3, 4], (np.int64(5), 1, 2)], random_shapes=3))
    assert shapes[:2] == [(2, 3, 4), (5, 1, 2)]
    assert all(type(s) is tuple and all(type(x) is int for x in s) for s in shapes)
    assert len(shapes) == 5


def test_random_shapes_are_drawn_from_the_inclusive_ranges():
    shapes = resolve_shapes(_config(random_shapes=200, ranges=((2, 3), (4, 4), (1, 2))))
    assert {s[0] for s in shapes} == {2, 3} and {s[1] for s in shapes} == {4} and {s[2] for s in shapes} == {1, 2}


def test_a_one_value_range_gives_that_value():
    assert resolve_shapes(_config(random_shapes=1, ranges=((3, 3), (1, 1), (7, 7)))) == [(3, 1, 7)]


def test_random_shapes_are_seeded_by_the_config():
    a = resolve_shapes(_config(random_shapes=6, seed=1))
    assert a == resolve_shapes(_config(random_shapes=6, seed=1))
    assert a != resolve_shapes(_config(random_shapes=6, seed=2))


def test_duplicate_shapes_are_dropped_keeping_the_first_order():
    assert resolve_shapes(_config(shapes=[(2, 2, 2), (1, 1, 1), (2, 2, 2)])) == [(2, 2, 2), (1, 1, 1)]
    drawn = resolve_shapes(_config(shapes=[(1, 1, 1)], random_shapes=5, ranges=((1, 1), (1, 1), (1, 1))))
    assert drawn == [(1, 1, 1)]


# --- modes, subsets, path_shapes ---------------------------------------------------------------------------------

def test_modes_all_together_then_each_alone():
    assert modes(("o", "a")) == [("o", "a"), ("o",), ("a",)]
    assert modes(("q", "k", "v")) == [("q", "k", "v"), ("q",), ("k",), ("v",)]
    assert modes(("o",)) == [("o",)]                                  # one name: no "each alone" repeat


def test_subsets_all_first_then_by_size_in_spec_order():
    assert subsets(("q", "k", "v")) == [("q", "k", "v"), ("q",), ("k",), ("v",), ("q", "k"), ("q", "v"),
                                        ("k", "v")]
    assert subsets(("a", "v")) == [("a", "v"), ("a",), ("v",)]
    assert subsets(("x",)) == [("x",)]


def test_path_shapes_prefer_shapes_without_a_trivial_dimension():
    shapes = [(1, 1, 1), (2, 2, 2), (4, 1, 3), (3, 5, 2), (2, 3, 4), (1, 3, 2), (3, 3, 3)]
    assert path_shapes(shapes, 3) == [(2, 2, 2), (3, 5, 2), (2, 3, 4)]
    assert path_shapes(shapes, 5) == [(2, 2, 2), (3, 5, 2), (2, 3, 4), (3, 3, 3), (1, 1, 1)]
    assert path_shapes(shapes, 99) == [(2, 2, 2), (3, 5, 2), (2, 3, 4), (3, 3, 3), (1, 1, 1), (4, 1, 3),
                                       (1, 3, 2)]
    assert path_shapes(shapes, 0) == []


# --- Case ------------------------------------------------------------------------------------------------------------

def test_case_inputs_and_draws_have_the_ops_shapes_and_dtype():
    case = Case(ATTN, "complex64", (5, 2, 3), 0, 0)
    assert case.shape == (5, 2, 3)
    assert [x.shape for x in case.inputs] == [(5, 2), (5, 2), (5, 3)]
    assert all(x.dtype == np.complex64 for x in case.inputs)
    g, w, t = case.second
    assert [x.shape for x in g] == [(5, 3), (5, 5)]
    assert [x.shape for x in w] == [(5, 2), (5, 2), (5, 3)] == [x.shape for x in t]


def test_cotangent_modes_leave_the_other_output_unused():
    case = Case(ATTN, "float64", (3, 2, 4), 0, 0)
    g = case.second[0]
    assert case.cot_modes == [("o", "a"), ("o",), ("a",)]
    assert [tuple(x is None for x in c) for c in case.cots] == [(False, False), (False, True), (True, False)]
    assert case.cots[0][0] is g[0] and case.cots[0][1] is g[1] and case.cots[1][0] is g[0] and case.cots[2][1] is g[1]


def test_all_paths_cross_every_input_subset_with_every_cotangent_mode():
    case = Case(ATTN, "float64", (3, 2, 4), 0, 0)
    assert case.all_paths is True                                    # the default
    assert case.vjp_requests == [(wrt, m) for wrt in subsets(("q", "k", "v")) for m in range(3)]
    assert case.tan_modes == subsets(("q", "k", "v"))
    t = case.second[2]
    for mode, tans in zip(case.tan_modes, case.tans):
        assert [x is not None for x in tans] == [n in mode for n in ("q", "k", "v")]
        assert all(x is ti for x, ti in zip(tans, t) if x is not None)


def test_without_all_paths_every_input_requires_grad_and_tangents_go_all_then_each():
    case = Case(ATTN, "float64", (3, 2, 4), 0, 0, all_paths=False)
    assert case.all_paths is False
    assert case.vjp_requests == [(("q", "k", "v"), 0), (("q", "k", "v"), 1), (("q", "k", "v"), 2)]
    assert case.tan_modes == [("q", "k", "v"), ("q",), ("k",), ("v",)]
    assert [[x is not None for x in tans] for tans in case.tans] == [[True] * 3, [True, False, False],
                                                                     [False, True, False], [False, False, True]]


def test_request_masks_follow_vjp_requests():
    case = Case(ATTN, "float64", (2, 2, 2), 0, 0)
    masks = case.request_masks(ATTN)
    assert len(masks) == len(case.vjp_requests) == 21
    assert masks[:3] == [((True, True, True), 0), ((True, True, True), 1), ((True, True, True), 2)]
    assert masks[3] == ((True, False, False), 0) and masks[-1] == ((False, True, True), 2)


def test_one_output_op_has_one_cotangent_mode():
    case = Case(MIX, "float32", (2, 3, 4), 1, 0)
    assert case.cot_modes == [("o",)] and len(case.cots) == 1 and case.cots[0][0] is not None
    assert [x.shape for x in case.inputs] == [(2, 2), (2, 4)]


def test_draws_are_keyed_by_the_case_itself():
    def draw(spec=ATTN, dtype="float64", shape=(3, 2, 4), trial=0, seed=0):
        c = Case(spec, dtype, shape, trial, seed)
        return np.concatenate([x.ravel() for x in (*c.inputs, *c.second[0], *c.second[1], *c.second[2])])

    base = draw()
    np.testing.assert_array_equal(base, draw())                      # same case, same numbers
    for other in (draw(trial=1), draw(seed=1), draw(dtype="float32"), draw(shape=(3, 2, 5))):
        assert other.shape != base.shape or not np.allclose(other, base, rtol=1e-3)
    # the op's name keys the draw: tanh's x and mix's a are both (n, n), drawn from different streams
    x = Case(TANH, "float64", (3, 2, 4), 0, 0).inputs[0] / 0.8
    a = Case(MIX, "float64", (3, 2, 4), 0, 0).inputs[0] / 0.6
    assert not np.allclose(x, a)


def test_cotangents_and_tangents_are_independent_draws():
    g, w, t = Case(ATTN, "float64", (3, 3, 3), 0, 0).second
    assert not np.allclose(w[0], t[0]) and not np.allclose(w[2], t[2]) and not np.allclose(g[0], t[2])


# --- Job -------------------------------------------------------------------------------------------------------------

def test_job_is_a_frozen_record_compared_by_identity():
    case = Case(ATTN, "float64", (2, 2, 2), 0, 0)
    job = Job(side=None, spec=ATTN, case=case, dtype="float64", do_jacrev=True)
    twin = Job(side=None, spec=ATTN, case=case, dtype="float64", do_jacrev=True)
    assert (job.spec, job.case, job.dtype, job.do_jacrev) == (ATTN, case, "float64", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.dtype = "float32"
    assert job != twin and job == job                               # each job is its own (eq=False)
    assert len({job, twin}) == 2                                     # hashable by identity


# --- the inputs' tanh arguments held to metrics.x_limit ---------------------------------------------------------------

def _loud(name, std=6.0):
    """The spec of ``name`` drawing its tanh factors with a large ``std`` (so that a draw passes the limit), and
    the same spec without the limit (``tanh_argument=None``)."""
    spec = SPECS[name]
    stds = lambda n, d, e, c: tuple(std if i in spec.tanh_factors else 1.0 for i in range(len(spec.inputs)))
    loud = dataclasses.replace(spec, input_std=stds)
    return loud, dataclasses.replace(loud, tanh_argument=None)


@pytest.mark.parametrize("name, dtype", [("attn", "float32"), ("attn", "complex128"), ("attn_o", "float64"),
                                         ("tanh", "float32"), ("tanh", "complex64")])
def test_a_draw_past_the_limit_is_scaled_down_to_it(name, dtype):
    """The factors of tanh's argument are scaled by one factor each (q and k by √(limit / max|x|), the tanh block's
    x by limit / max|x|), the other inputs kept: max |x| is the limit, to rounding."""
    loud, raw = _loud(name)
    got = sample_inputs(loud, np.random.default_rng(5), (4, 3, 2), dtype)
    drawn = sample_inputs(raw, np.random.default_rng(5), (4, 3, 2), dtype)
    peak = float(np.max(np.abs(loud.tanh_argument(*drawn))))
    assert peak > 2 * x_limit(dtype)
    assert float(np.max(np.abs(loud.tanh_argument(*got)))) == pytest.approx(x_limit(dtype), rel=1e-6)
    share = (x_limit(dtype) / peak) ** (1 / len(loud.tanh_factors))
    for i, (g, d) in enumerate(zip(got, drawn)):
        assert g.dtype == d.dtype and g.shape == d.shape
        np.testing.assert_allclose(g, d * share if i in loud.tanh_factors else d, rtol=1e-6)


def test_the_causal_limit_counts_only_the_entries_the_mask_keeps():
    loud, raw = _loud("attn_o_causal")
    got = sample_inputs(loud, np.random.default_rng(1), (6, 2, 3), "float32")
    x = got[0].astype(np.float64) @ got[1].astype(np.float64).T
    assert np.max(np.abs(np.tril(x))) == pytest.approx(x_limit("float32"), rel=1e-6)
    assert np.max(np.abs(x)) > 1.5 * x_limit("float32")      # an entry above the diagonal, masked: not held to it


def test_draws_within_the_limit_and_ops_without_tanh_are_untouched():
    for name in ("scores", "mix"):                           # no tanh: whatever the draw
        loud = dataclasses.replace(SPECS[name], input_std=lambda n, d, e, c: (6.0, 6.0))
        assert SPECS[name].tanh_argument is None
        a, b = (sample_inputs(loud, np.random.default_rng(2), (3, 2, 2), "float32") for _ in range(2))
        assert all(np.array_equal(x, y) for x, y in zip(a, b)) and np.max(np.abs(a[0])) > 5
    spec = SPECS["attn"]
    got = sample_inputs(spec, np.random.default_rng(6), (3, 2, 2), "float32")
    drawn = sample_inputs(dataclasses.replace(spec, tanh_argument=None), np.random.default_rng(6), (3, 2, 2),
                          "float32")
    assert np.max(np.abs(spec.tanh_argument(*got))) < x_limit("float32")
    assert all(np.array_equal(x, y) for x, y in zip(got, drawn))
    empty = sample_inputs(spec, np.random.default_rng(3), (0, 2, 2), "float32")       # n = 0: nothing to scale
    assert [x.shape for x in empty] == [(0, 2), (0, 2), (0, 2)]


def test_seed_840s_float32_attn_case_is_held_to_the_limit():
    """The draw that failed a correct float32 implementation (|x| = 6.8 in a 1×1 case, trial 1)."""
    case = Case(SPECS["attn"], "float32", (1, 1, 1), 1, 840, True)
    q, k, _ = case.inputs
    assert abs(float(q[0, 0]) * float(k[0, 0])) == pytest.approx(x_limit("float32"), rel=1e-6)


# --- the draws themselves ---------------------------------------------------------------------------------------------

def test_sample_like_is_the_documented_draw():
    """Real: standard normals times std; complex: real parts drawn first, then imaginary parts, each times
    std / √2 (so E|z|² = std²); drawn in float64, rounded once to the dtype; std 1 by default."""
    def rng():
        return np.random.default_rng(11)
    got = sample_like(rng(), (3, 4), "float32", 2.5)
    assert got.dtype == np.float32 and np.array_equal(got, (rng().standard_normal((3, 4)) * 2.5).astype(np.float32))
    r = rng()
    re, im = r.standard_normal((3, 4)), r.standard_normal((3, 4))
    got = sample_like(rng(), (3, 4), "complex128", 2.5)
    assert got.dtype == np.complex128 and np.array_equal(got, (re + 1j * im) * (2.5 / np.sqrt(2.0)))
    assert np.array_equal(sample_like(rng(), (3, 4), "complex64"),
                          ((re + 1j * im) * (1 / np.sqrt(2.0))).astype(np.complex64))
    assert np.array_equal(sample_like(rng(), (5,), "float64"), rng().standard_normal(5))


def test_x_std_and_qk_std_give_tanhs_argument_its_target_spread():
    """x = q kᵀ sums d products of entries of std σ: variance d·σ⁴ = x_std², so σ = (x_std² / d)^(1/4); d = 0
    (no products) as d = 1."""
    assert (x_std(False), x_std(True)) == (0.8, 0.5)
    for d in (1, 2, 5):
        for c in (False, True):
            assert d * qk_std(d, c) ** 4 == pytest.approx(x_std(c) ** 2, rel=1e-12)
    assert qk_std(0, False) == qk_std(1, False) == pytest.approx(0.8 ** 0.5, rel=1e-12)


def test_scores_is_q_k_transposed_in_double_precision():
    q = np.array([[1, 2j], [3, 1]], np.complex64)
    k = np.array([[1j, 1], [2, 0]], np.complex64)
    want = q.astype(np.complex128) @ k.astype(np.complex128).T          # no conjugate: x = q kᵀ (1)
    assert scores(q, k).dtype == np.complex128 and np.array_equal(scores(q, k), want)
    assert np.array_equal(scores(q, k, causal=True), np.tril(want)) and want[0, 1] != 0
    real = scores(q.real.astype(np.float32), k.real.astype(np.float32), np.ones(3))      # extra inputs ignored
    assert real.dtype == np.float64 and np.array_equal(real, q.real.astype(np.float64) @ k.real.T.astype(np.float64))
