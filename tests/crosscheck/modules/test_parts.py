"""crosscheck.parts, what one framework computes for a case and how a failing part is recorded (``python -m mutation
parts`` runs this file on each mutant), through ``EagerExecutor.run`` (the same parts the JAX executor compiles) and
``to_numpy_results``: which parts a side gets, a request that raises failing alone (with the input a wrong-shaped
gradient names), a missing forward-mode rule as a skip, a forward that raises or returns the wrong shapes as one
clear error, and the complex convention of each framework's VJPs (eq. (17)).  torch on the CPU, a few seconds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from crosscheck.cases import Case, Job
from crosscheck.errors import ImplError, Raised
from crosscheck.parts import (CaseResults, EagerExecutor, Failed, Outcome, Skip, evaluate, np_tuple, outputs, parts,
                              to_numpy_results)
from crosscheck.specs import SPECS, Side

ATTN = SPECS["attn"]
SHAPE = (4, 2, 3)


def _side(**changes) -> Side:
    import torch_impl
    from crosscheck import torch_oracles as T
    side = Side(forward=torch_impl.attn, vjp=T.hand_vjp(torch_impl.attn), jvp=T.hand_jvp(torch_impl.attn),
                reference=torch_impl.attn_reference, source="torch_impl.attn",
                vjp_vjp=T.hand_vjp_vjp(torch_impl.attn), hvp=T.hand_hvp(torch_impl.attn))
    return dataclasses.replace(side, **changes)


def _run(side=None, dtype="float64", shape=SHAPE, all_paths=True, do_jacrev=True) -> CaseResults:
    case = Case(ATTN, dtype, shape, 0, 0, all_paths)
    return EagerExecutor("torch", "cpu").run(Job(side or _side(), ATTN, case, dtype, do_jacrev))


def _agree(a, b, rtol=1e-10):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-12)


# --- the parts of a side ---------------------------------------------------------------------------------------------

def test_every_part_of_the_projects_side_on_a_path_shape():
    r = _run()
    case = Case(ATTN, "float64", SHAPE, 0, 0)
    assert len(r.forward) == 2 and r.forward[0].shape == (4, 3) and r.forward[1].shape == (4, 4)
    assert r.forward_ref is None                       # the forward is not under test
    assert len(r.vjp) == len(case.vjp_requests) == 21 and len(r.vjp_ref) == len(r.vjp_jac) == 3
    assert len(r.jvp) == len(r.jvp_ref) == len(case.tan_modes) == 7
    assert len(r.vjp_vjp) == len(r.vjp_vjp_ref) == len(r.hvp) == len(r.hvp_ref) == 1
    # the hand-written parts agree with the oracles: request i has mode i % 3 (all inputs first)
    for (wrt, m), got in zip(case.vjp_requests, r.vjp):
        want = r.vjp_ref[m]
        # a gradient no cotangent reaches (v with o unused) is None from autograd, zeros from the oracle
        got = tuple(np.zeros_like(w) if g is None and n in wrt and not w.any() else g
                    for g, w, n in zip(got, want, ATTN.inputs))
        _agree([g for g, n in zip(got, ATTN.inputs) if n in wrt], [w for w, n in zip(want, ATTN.inputs) if n in wrt])
        assert all(g is None for g, n in zip(got, ATTN.inputs) if n not in wrt)
    for got, ref, jac in zip(r.vjp_ref, r.vjp_ref, r.vjp_jac):
        _agree(got, jac)
    for got, want in zip(r.jvp, r.jvp_ref):
        _agree(got, want)
    _agree(r.vjp_vjp[0], r.vjp_vjp_ref[0])
    _agree(r.hvp[0], r.hvp_ref[0])
    # tangent i is the case's: the first is on every input
    _agree(r.jvp_ref[0], r.jvp[0])


def test_off_the_path_shapes_no_second_order_and_every_input_requires_grad():
    r = _run(all_paths=False, do_jacrev=False)
    assert r.vjp_vjp is r.vjp_vjp_ref is r.hvp is r.hvp_ref is r.vjp_jac is None
    assert len(r.vjp) == 3 and len(r.jvp) == 4


def test_a_forward_under_test_gets_its_reference_forward():
    r = _run(_side(forward_is_hand=True))
    _agree(r.forward, r.forward_ref)


def test_a_reference_only_side_has_no_hand_written_vjp_nor_jacobian():
    r = _run(_side(reference_only=True))
    assert r.vjp is None and r.vjp_jac is None and len(r.vjp_ref) == 3


def test_no_jvp_is_one_skip_per_tangent_with_the_reason():
    r = _run(_side(jvp=None, jvp_missing="no JVP here"))
    assert len(r.jvp) == 7 and all(isinstance(s, Skip) and s.reason == "no JVP here" for s in r.jvp)


def test_no_second_order_functions_no_second_order_parts():
    r = _run(_side(vjp_vjp=None, hvp=None))
    assert r.vjp_vjp is r.vjp_vjp_ref is r.hvp is r.hvp_ref is None
    r = _run(_side(hvp=None))
    assert r.hvp is r.hvp_ref is None and len(r.vjp_vjp) == 1


def test_parts_names_in_order():
    case = Case(ATTN, "float64", SHAPE, 0, 0)
    assert list(parts("torch", _side(forward_is_hand=True), case, ATTN, True)) == [
        "forward", "forward_ref", "vjp", "vjp_ref", "vjp_jac", "jvp", "jvp_ref", "vjp_vjp", "vjp_vjp_ref", "hvp",
        "hvp_ref"]
    assert list(parts("torch", _side(reference_only=True, jvp=None, vjp_vjp=None, hvp=None), case, ATTN, True)) == [
        "forward", "vjp_ref", "jvp_ref"]


# --- failures --------------------------------------------------------------------------------------------------------

def test_a_request_that_raises_fails_alone():
    import torch_impl
    from crosscheck import torch_oracles as T
    hand = T.hand_vjp(torch_impl.attn)

    def vjp(inputs, requests):
        (wrt, cots), = requests
        if cots[0] is None:                            # o unused
            raise TypeError("unsupported operand type(s) for @: 'NoneType' and 'Tensor'\nmore")
        return hand(inputs, requests)

    r = _run(_side(vjp=vjp))
    failed = [i for i, g in enumerate(r.vjp) if isinstance(g, Failed)]
    assert failed == list(range(2, 21, 3))              # mode 2 (a alone) of each of the 7 subsets
    f = r.vjp[2]
    assert f.error == Raised("TypeError", "unsupported operand type(s) for @: 'NoneType' and 'Tensor'")
    assert f.text == "raised TypeError: unsupported operand type(s) for @: 'NoneType' and 'Tensor'"
    assert f.index is None
    assert all(isinstance(g, tuple) for i, g in enumerate(r.vjp) if i not in failed)


@pytest.mark.parametrize("message, index", [
    ("Function AttnBackward returned an invalid gradient at index 1 - got [2, 5] but expected shape [4, 2]", 1),
    ("returned an invalid gradient at index 0 - got [1]", 0),
    ("returned an invalid gradient at index 3 - got [1]", None),        # no such input: not singled out
    ("returned an invalid gradient at index 4 - got [1]", None),
    ("Custom VJP bwd rule must produce an output with the same shape at output[2] the bwd rule ...", 2),
    ("at output[3] the bwd rule", None), ("shapes cannot be multiplied", None),
])
def test_a_wrong_shaped_gradient_names_its_input(message, index):
    assert Failed(RuntimeError(message), ("q", "k", "v")).index == index


def test_a_failure_from_another_process():
    f = Failed.from_error(Raised("RuntimeError", "rank 1 timed out"))
    assert f.error == Raised("RuntimeError", "rank 1 timed out") and f.index is None
    assert f.text == "raised RuntimeError: rank 1 timed out"


def test_a_missing_forward_mode_rule_is_a_skip_naming_the_side():
    from tests.support.planted_solutions import findings as planted
    from crosscheck import torch_oracles as T
    fn = planted.Lean.apply
    r = _run(_side(forward=fn, vjp=T.hand_vjp(fn), jvp=T.hand_jvp(fn), hvp=T.hand_hvp(fn), vjp_vjp=None,
                   source="Lean"))
    assert all(isinstance(s, Skip) for s in r.jvp) and len(r.jvp) == 7
    assert r.jvp[0].reason.startswith("Lean has no forward-mode (JVP) rule: ")
    (h,) = r.hvp
    assert isinstance(h, Skip) and h.reason.startswith(
        "Lean has no forward-mode (JVP) rule, which the forward-over-reverse HVP needs: ")


@pytest.mark.parametrize("message, why", [("no jvp for Lean\nsee the docs", "no jvp for Lean"), ("", "")])
def test_a_skip_gives_the_first_line_of_the_reason(message, why):
    from crosscheck.torch_oracles import JvpUnsupported

    def unsupported(*args):
        raise JvpUnsupported(message)
    r = _run(_side(jvp=unsupported, hvp=unsupported, source="S"))
    assert [s.reason for s in r.jvp] == [f"S has no forward-mode (JVP) rule: {why}"] * 7
    assert [s.reason for s in r.hvp] == [f"S has no forward-mode (JVP) rule, which the forward-over-reverse HVP needs: "
                                         f"{why}"]


def test_an_oracle_that_raises_is_crosschecks_own_bug():
    def broken_reference(q, k, v):
        raise ArithmeticError("oracle bug")
    with pytest.raises(ArithmeticError, match="oracle bug"):
        _run(_side(reference=broken_reference))


def test_a_forward_that_raises_is_one_clear_error():
    def forward(q, k, v):
        raise ValueError("bad d")
    with pytest.raises(ImplError) as info:
        _run(_side(forward=forward, source="my.py:Attn"))
    assert str(info.value) == ("my.py:Attn raised ValueError: bad d — when called as attn(q, k, v) on float64 "
                               "inputs of shapes (4, 2), (4, 2), (4, 3) (to check only some dtypes or shapes, use "
                               "--dtype / --shapes)")


def test_a_users_forward_for_the_other_framework_is_named_the_projects_is_not():
    from tests.conftest import require_jax
    require_jax()
    import jax_impl
    with pytest.raises(ImplError) as info:
        _run(_side(forward=jax_impl.attn, source="mine", user=True))
    assert str(info.value) == ("mine looks like a JAX implementation (given JAX arrays it returns JAX arrays, while "
                               "--torch-impl calls it with torch tensors): use --jax-impl mine")
    with pytest.raises(ImplError) as info:                 # the project's own side: the error as it is
        _run(_side(forward=jax_impl.attn, source="jax_impl.attn"))
    assert str(info.value).startswith("jax_impl.attn raised TypeError: attn(): argument 'q' must be a jax.Array")


@pytest.mark.parametrize("forward, text", [
    (lambda q, k, v: q @ k.mT, "got 1 output of shape (4, 4) (return the pair (o, a), not one tensor)"),
    (lambda q, k, v: (), "got no outputs (an empty sequence)"),
    (lambda q, k, v: (q, k, v), "got 3 outputs of shapes (4, 2), (4, 2), (4, 3)"),
    (lambda q, k, v: ((q @ k.mT) @ v, (q @ k.mT)[:, :3]), "got 2 outputs of shapes (4, 3), (4, 3)"),
])
def test_a_forward_with_wrong_shapes_is_one_clear_error(forward, text):
    with pytest.raises(ImplError) as info:
        _run(_side(forward=forward, source="mine"))
    assert str(info.value) == ("mine returns wrong shapes: expected 2 outputs (o, a) of shapes (4, 3), (4, 4) for "
                               "inputs of shapes (4, 2), (4, 2), (4, 3), " + text)


def test_a_one_output_op_with_a_wrong_shape_gets_no_pair_hint():
    import torch
    spec = SPECS["attn_o"]
    with pytest.raises(ImplError) as info:
        to_numpy_results("torch", _side(source="mine"), spec, {"forward": (torch.zeros(4, 4),)}, SHAPE, "float64")
    assert str(info.value) == ("mine returns wrong shapes: expected 1 output (o) of shape (4, 3) for inputs of shapes "
                               "(4, 2), (4, 2), (4, 3), got 1 output of shape (4, 4)")


@pytest.mark.parametrize("arrays, named", [(np.zeros, "numpy.ndarray"), (np.ma.zeros, "numpy.MaskedArray")])
def test_a_forward_returning_other_arrays_is_named(arrays, named):
    with pytest.raises(ImplError, match=rf"mine raised TypeError: returned {named}, not torch tensors"):
        _run(_side(forward=lambda q, k, v: (arrays((4, 3)), arrays((4, 4))), source="mine"))


def test_outputs_keeps_one_array_as_one_output():
    a = np.zeros((2, 3))
    assert outputs(a) == (a,) and outputs([a, a]) == (a, a) and outputs((a,)) == (a,)
    assert np_tuple([1, 2], str) == ("1", "2")


def test_an_outcome_from_another_process_compares_by_what_it_holds():
    assert Outcome(error=Raised("RuntimeError", "x")) == Outcome(error=Raised("RuntimeError", "x"))
    assert Outcome(error=Raised("RuntimeError", "x")) != Outcome(error=Raised("RuntimeError", "y"))
    o = Outcome(results="r")
    assert (o.results, o.error, o.inplace, o.ranks) == ("r", None, None, None)


def test_evaluate_records_per_request_and_raises_for_the_forward():
    side = _side(source="S")
    todo = {"forward": lambda *a: (1, 2), "vjp": [lambda *a: (1,), lambda *a: 1 / 0], "vjp_ref": lambda *a: [(3,)]}
    raw = evaluate("torch", side, ATTN, todo, lambda name, i: (todo[name] if i is None else todo[name][i])(),
                   SHAPE, "float64")
    assert raw["forward"] == (1, 2) and raw["vjp_ref"] == [(3,)]
    ok, failed = raw["vjp"]
    assert ok == (1,) and isinstance(failed, Failed) and failed.error.type == "ZeroDivisionError"


# --- the complex convention (eq. (17)) --------------------------------------------------------------------------------

def _raw(values, native=lambda x: x):
    """A raw result dict, as an executor's parts return them (``native``: numpy to the framework's arrays)."""
    values = tuple(None if v is None else native(v) for v in values)
    f = (native(np.zeros((4, 3))), native(np.zeros((4, 4))))
    return {"forward": f, "vjp": [values], "vjp_ref": [values], "vjp_jac": [values], "jvp_ref": [values],
            "jvp": [values], "vjp_vjp": [values], "vjp_vjp_ref": [values], "hvp": [values], "hvp_ref": [values]}


@pytest.mark.parametrize("dtype, flipped", [("complex128", True), ("float64", False)])
def test_jax_first_order_vjps_come_back_in_torchs_convention(dtype, flipped):
    from tests.conftest import require_jax
    require_jax()
    z = (np.array([1 + 2j]), None, np.array([3 - 1j]))
    r = to_numpy_results("jax", _side(), ATTN, _raw(z), SHAPE, dtype)
    conj = (np.array([1 - 2j]), None, np.array([3 + 1j]))
    for name in ("vjp", "vjp_ref", "vjp_jac"):
        _agree(getattr(r, name)[0], conj if flipped else z)
    for name in ("jvp", "jvp_ref", "vjp_vjp", "vjp_vjp_ref", "hvp", "hvp_ref"):   # compared within JAX
        _agree(getattr(r, name)[0], z)


def test_torch_results_are_never_conjugated():
    z = (np.array([1 + 2j]), None, np.array([3 - 1j]))
    import torch
    r = to_numpy_results("torch", _side(), ATTN, _raw(z, torch.from_numpy), SHAPE, "complex128")
    for name in ("vjp", "vjp_ref", "vjp_jac", "jvp", "hvp"):
        _agree(getattr(r, name)[0], z)
    assert r.forward_ref is None


def test_failures_and_skips_pass_through_the_conversion():
    import torch
    raw = _raw((np.ones(1), None, None), torch.from_numpy)
    raw["vjp"] = [Failed(RuntimeError("x"), ATTN.inputs), (torch.ones(1), None, None)]
    raw.pop("jvp")
    r = to_numpy_results("torch", _side(jvp_missing="why"), ATTN, raw, SHAPE, "float64")
    assert isinstance(r.vjp[0], Failed) and isinstance(r.vjp[1], tuple)
    assert len(r.jvp) == 1 and isinstance(r.jvp[0], Skip) and r.jvp[0].reason == "why"
