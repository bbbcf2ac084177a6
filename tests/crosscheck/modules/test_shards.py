"""crosscheck.shards.payload and crosscheck.shards.rows, the run's side of ``--shards`` (``python -m mutation
shards_payload`` / ``shards_rows`` run this file on each mutant): the shapes, names and payload a child gets, the
child's environment, and the rows ``check`` makes of what the children send back.  The children are not spawned:
``run_layouts`` is replaced by one that returns outcomes made in this process (the project's single-device
``torch_impl.attn`` run as a candidate would be, or a planted error, in-place probe, rank disagreement), so the
verdicts are checked on known outcomes in a few seconds.  The real multi-rank runs: tests/crosscheck/test_shards.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from crosscheck.compare import Collector
from crosscheck.errors import Raised
from crosscheck.parts import Outcome
from crosscheck.results import Config
from crosscheck.shards import payload as P
from crosscheck.shards import rows as R
from crosscheck.specs import SPECS

ATTN = SPECS["attn"]


# --- payload -------------------------------------------------------------------------------------------------------

def test_sharded_shapes_uneven_even_fewer_rows_and_empty():
    assert P.sharded_shapes(2) == ([(3, 3, 2), (4, 2, 3), (1, 2, 2), (0, 2, 3)], [(3, 3, 2)])
    shapes, paths = P.sharded_shapes(3)
    assert shapes == [(4, 3, 2), (6, 2, 3), (1, 2, 2), (0, 2, 3)] and paths == [(4, 3, 2)]


def test_candidate_names_its_framework_layout_and_world():
    assert P.candidate("torch", "rows", 2) == "torch sharded rows on 2 ranks"
    assert P.candidate("jax", "ring@explicit", 4) == "jax sharded ring@explicit on 4 devices"
    assert P.TIMEOUT_S == 600 and P.STUCK_S == 30


def test_payload_job_rebuilds_the_runs_case():
    pl = P.Payload(seed=5, world=2, cases=(("float64", (3, 3, 2), 1, True, False),), timeout=9.0)
    job = pl.job("SIDE", pl.cases[0])
    assert (job.side, job.spec, job.dtype, job.do_jacrev) == ("SIDE", ATTN, "float64", False)
    from crosscheck.cases import Case
    want = Case(ATTN, "float64", (3, 3, 2), 1, 5, True)
    assert job.case.shape == (3, 3, 2) and job.case.all_paths
    for a, b in zip(job.case.inputs, want.inputs):
        np.testing.assert_array_equal(a, b)
    other = pl.job("SIDE", ("complex128", [4, 2, 3], 0, False, True))
    assert other.case.shape == (4, 2, 3) and not other.case.all_paths and other.do_jacrev
    assert other.case.inputs[0].dtype == np.complex128
    with pytest.raises(dataclasses.FrozenInstanceError):
        pl.world = 3


def test_payload_named_layouts():
    assert P.Payload(0, 2, (), 1.0).named_layouts("--torch-layouts") is None
    named = P.Payload(0, 2, (), 1.0, layouts="crosscheck.specs:SPECS").named_layouts("--torch-layouts")
    assert named == dict(SPECS)


@pytest.mark.parametrize("outcome, is_raised", [
    (("raised", "RuntimeError: modified"), True), (("raised", "x", "y"), False), (("computed", "x"), False),
    ((1, "x"), False), (["raised", "x"], False), ("raised", False), (None, False), ((np.ones(2), np.ones(2)), False),
    (("raised",), False), (("zzz", "x"), False), (("".join(["rai", "sed"]), "x"), True),   # built at run time
])
def test_raised_is_the_in_place_probes_refusal(outcome, is_raised):
    assert P.raised(outcome) is is_raised


def test_rank_outcome_is_how_it_broke_and_which_writes_raised():
    grads = (np.zeros(2),)
    assert P.rank_outcome(None, None) == (None, None)                              # no probe ran
    assert P.rank_outcome("RuntimeError", {"error": "boom"}) == ("RuntimeError", ("error", "boom"))
    probe = {"o": ("raised", "modified by an inplace operation"), "a": grads}
    assert P.rank_outcome(None, probe) == (None, (("a", "gradients"), ("o", "modified by an inplace operation")))


def test_disagreement_names_the_first_rank_unlike_rank_0():
    # every rank's outcome arrives unpickled (all_gather_object): equal values, never the same objects
    def rank(broken, inplace=None):
        return tuple([None if broken is None else "".join(broken), inplace and tuple(inplace)])
    grads, wrote = [("a", "gradients")], [("a", "modified by an inplace operation")]
    assert P.disagreement([rank(None), rank(None), rank(None)]) == ""
    assert P.disagreement([rank(["Value", "Error"]), rank(["Value", "Error"])]) == ""
    assert P.disagreement([rank(None, grads), rank(None, grads)]) == ""
    assert P.disagreement([rank(None), rank(["Value", "Error"]), rank(["Type", "Error"])]) == \
        "rank 1 raised ValueError while rank 0 did not"
    assert P.disagreement([rank(["Value", "Error"]), rank(None)]) == "rank 1 raised None while rank 0 raised ValueError"
    assert P.disagreement([rank(["Value", "Error"]), rank(["Type", "Error"])]) == \
        "rank 1 raised TypeError while rank 0 raised ValueError"
    assert P.disagreement([rank(None, grads), rank(None, wrote), rank(None, grads)]) == (
        "the in-place probe ended differently on rank 1 ((('a', 'modified by an inplace operation'),)) and rank 0 "
        "((('a', 'gradients'),))")
    assert P.disagreement([rank(None, grads), rank(None, wrote), rank(None, wrote)]).endswith(
        "and rank 0 ((('a', 'gradients'),))")                           # rank 0's own, not the last rank's
    assert P.disagreement([rank(["Value", "Error"], grads), rank(["Value", "Error"], wrote)]).startswith(
        "the in-place probe ended differently on rank 1")                # both raised alike: the probe differs


# --- run_layouts: the child's payload and environment ------------------------------------------------------------------

# the child's entry point (run_child takes the function: the child imports it by its module and name)
_MAIN = {"torch": ("crosscheck.drivers", "torch_shards_child"), "jax": ("crosscheck.drivers", "jax_shards_child")}


def _entry(fn) -> tuple:
    return fn.__module__, fn.__name__


def test_run_layouts_sends_the_payload_and_sets_jaxs_device_count(monkeypatch):
    calls = []
    monkeypatch.setattr(R, "run_child", lambda *args: calls.append(args) or {"rows": []})
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_a=1 --xla_force_host_platform_device_count=8 --xla_cpu_b=2")
    assert R.run_layouts("jax", 3, 7, [("float64", (4, 3, 2), 0, True, True)], timeout=100, layouts="m:L") == \
        {"rows": []}
    (main, argv, payload, what, timeout, env), = calls
    assert _entry(main) == _MAIN["jax"] and argv == [] and timeout == 130
    assert payload == P.Payload(seed=7, world=3, cases=(("float64", (4, 3, 2), 0, True, True),), timeout=100,
                                layouts="m:L")
    assert what == "--shards 3: the jax subprocess"
    assert env["XLA_FLAGS"] == "--xla_cpu_a=1 --xla_cpu_b=2 --xla_force_host_platform_device_count=3"
    calls.clear()
    monkeypatch.delenv("XLA_FLAGS")
    R.run_layouts("jax", 2, 0, [])
    assert calls[0][5]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    assert calls[0][2].timeout == P.TIMEOUT_S and calls[0][4] == P.TIMEOUT_S + 30


def test_run_layouts_leaves_torchs_environment_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(R, "run_child", lambda *args: calls.append(args) or {})
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    R.run_layouts("torch", 2, 0, [])
    assert _entry(calls[0][0]) == _MAIN["torch"] and calls[0][3] == "--shards 2: the torch subprocess"
    assert calls[0][5]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"


# --- check: the rows of known outcomes -----------------------------------------------------------------------------------

def _candidate_results(payload_cases, seed, world, layout="rows"):
    """What a torch layout sends back when it computes what the single-device entry computes."""
    import torch_impl
    from crosscheck import torch_oracles as T
    from crosscheck.parts import EagerExecutor
    from crosscheck.specs import Side
    name = P.candidate("torch", layout, world)
    side = Side(forward=torch_impl.attn, vjp=T.hand_vjp(torch_impl.attn), jvp=None,
                reference=torch_impl.attn_reference, source="test", forward_is_hand=True, jvp_missing="no rule",
                candidate=name, vjp_vjp=T.hand_vjp_vjp(torch_impl.attn))
    pl = P.Payload(seed=seed, world=world, cases=tuple(payload_cases), timeout=1.0)
    ex = EagerExecutor("torch", "cpu")
    return [Outcome(results=ex.run(pl.job(side, cs))) for cs in payload_cases]


def _reference_grads(case, out_index):
    """The gradients of the reference with output ``out_index`` scaled by 0.5 out of place (what the in-place
    probe's reference computes when autograd does not refuse)."""
    import torch

    import torch_impl
    leaves = tuple(torch.from_numpy(x).requires_grad_() for x in case.inputs)
    outs = list(torch_impl.attn_reference(*leaves))
    outs[out_index] = outs[out_index] * 0.5
    grads = torch.autograd.grad(outs, leaves, tuple(torch.from_numpy(c) for c in case.second[0]))
    return tuple(g.numpy() for g in grads)


CONFIG = dict(shards=2, dtypes=("float64",), trials=1, frameworks=("torch",), seed=3)


def _check(monkeypatch, edit=None, **config):
    """``rows.check`` with the torch child replaced: every case computed by the project's entry, then
    ``edit(cases, outcomes)`` plants what a layout got wrong; the collector's rows by label, failures, skips."""
    config = Config(**{**CONFIG, **config})
    sent = {}

    def run_layouts(fw, world, seed, cases, timeout=P.TIMEOUT_S, layouts=""):
        sent.update(fw=fw, world=world, seed=seed, cases=list(cases), layouts=layouts)
        outcomes = _candidate_results(cases, seed, world)
        if edit is not None:
            edit(cases, outcomes)
        return {"rows": outcomes}
    monkeypatch.setattr(R, "run_layouts", run_layouts)
    col = Collector(config)
    progress = []
    R.check(config, col, lambda done, total, label: progress.append((done, total, label)))
    rows = {}
    for row in col.rows.values():
        rows.setdefault(row.label, []).append(row)
    return sent, rows, col, progress


def test_check_sends_every_case_and_a_layout_that_agrees_passes(monkeypatch):
    sent, rows, col, progress = _check(monkeypatch)
    assert progress == [(0, 1, "sharded torch on 2 ranks")]
    assert sent["fw"] == "torch" and sent["world"] == 2 and sent["seed"] == 3 and sent["layouts"] == ""
    # every sharded shape, the first on every path; the materialised Jacobian where it is small enough
    assert [(cs[0], cs[1], cs[2], cs[3]) for cs in sent["cases"]] == [
        ("float64", (3, 3, 2), 0, True), ("float64", (4, 2, 3), 0, False), ("float64", (1, 2, 2), 0, False),
        ("float64", (0, 2, 3), 0, False)]
    assert [cs[4] for cs in sent["cases"]] == [True, True, True, False]       # n = 0: an empty Jacobian
    assert col.failures == []
    name = "torch sharded rows on 2 ranks"
    assert all(label.startswith(name) for label in rows), list(rows)
    assert all(not r.failed for rs in rows.values() for r in rs), rows
    # no forward-mode rule: the JVP and HVP rows compare nothing
    assert sorted(label for label, rs in rows.items() if not any(r.compared for r in rs)) == [
        f"{name} hand HVP vs torch.func.jvp(vjp(ref))", f"{name} hand JVP vs torch.func.jvp(ref)"]
    # the candidate has no forward-mode rule: its HVP row is skipped on the path shape, with the reason
    (skip,) = [s for s in col.skipped if s.oracle.kind.value == "hvp"]
    assert skip.reason == f"{name}: no forward-mode rule, which the forward-over-reverse HVP needs"
    assert skip.oracle.label() == f"{name} hand HVP vs torch.func.jvp(vjp(ref))"


def test_check_with_the_jacobian_limit_and_trials(monkeypatch):
    # (1, 2, 2) float64: (2 + 2 + 2) input x (2 + 1) output elements = 18, at the limit: materialised
    sent, rows, col, _ = _check(monkeypatch, jacrev_max_elements=18, trials=2, torch_layouts="m:X")
    assert sent["layouts"] == "m:X" and len(sent["cases"]) == 8
    sizes = {cs[1]: cs[4] for cs in sent["cases"]}
    assert sizes == {(3, 3, 2): False, (4, 2, 3): False, (1, 2, 2): True, (0, 2, 3): False}
    assert {cs[2] for cs in sent["cases"]} == {0, 1}


def test_a_case_that_raised_is_one_failure_naming_the_error(monkeypatch):
    def edit(cases, outcomes):
        outcomes[1] = Outcome(error=Raised("RuntimeError", "gloo timed out"))
    sent, rows, col, _ = _check(monkeypatch, edit)
    (failure,) = col.failures
    assert failure.trial == 0
    assert failure.oracle.label() == "torch sharded rows on 2 ranks impl vs torch reference"
    assert failure.kind.value == "forward" and failure.shape == (4, 2, 3)
    assert failure.error == Raised("RuntimeError", "gloo timed out")


def test_a_case_that_raised_on_every_path_adds_no_other_row(monkeypatch):
    """A case the child could not run (here the path case, whose ranks also reported how they ended) is its one
    failing row: no in-place, rank or HVP row is made of an outcome that has no results."""
    def edit(cases, outcomes):
        outcomes[0] = Outcome(error=Raised("RuntimeError", "gloo timed out"), ranks="", inplace={"o": ("raised", "x")})
    sent, rows, col, _ = _check(monkeypatch, edit)
    (failure,) = col.failures
    assert failure.shape == (3, 3, 2) and failure.error == Raised("RuntimeError", "gloo timed out")
    assert not [label for label in rows if "ends alike" in label or "in-place" in label], sorted(rows)
    assert not [s for s in col.skipped if "forward-over-reverse" in str(s)]


def test_a_wrong_gradient_of_a_layout_fails(monkeypatch):
    def edit(cases, outcomes):
        r = outcomes[0].results
        vjp = list(r.vjp)
        vjp[0] = tuple(None if g is None else g * 1.01 for g in vjp[0])
        outcomes[0] = Outcome(results=dataclasses.replace(r, vjp=vjp))
    sent, rows, col, _ = _check(monkeypatch, edit)
    assert col.failures and {f.kind.value for f in col.failures} == {"vjp"}
    assert {f.shape for f in col.failures} == {(3, 3, 2)}


def test_every_rank_ends_alike_row(monkeypatch):
    def edit(cases, outcomes):
        for i, o in enumerate(outcomes):
            outcomes[i] = dataclasses.replace(o, ranks="rank 1 raised TypeError: bad" if i == 2 else "")
    sent, rows, col, _ = _check(monkeypatch, edit)
    (row,) = rows["torch sharded rows on 2 ranks every rank ends alike"]
    assert row.compared == 4 and row.failed == 1
    (failure,) = col.failures
    assert failure.shape == (1, 2, 2) and failure.error == Raised("", "rank 1 raised TypeError: bad")
    assert failure.note == "rank 1 raised TypeError: bad" and failure.inputs == ()


def test_no_ranks_row_when_the_child_does_not_say(monkeypatch):
    sent, rows, col, _ = _check(monkeypatch)
    assert not any("every rank ends alike" in label for label in rows)
    assert not any("in-place" in label for label in rows)


def _with_inplace(make):
    """An edit giving each case the in-place probe's outcome ``make(case_spec, seed)``."""
    def edit(cases, outcomes):
        for i, (cs, o) in enumerate(zip(cases, outcomes)):
            outcomes[i] = dataclasses.replace(o, inplace=make(cs))
    return edit


def _case_of(cs):
    from crosscheck.cases import Case
    return Case(ATTN, cs[0], tuple(cs[1]), cs[2], CONFIG["seed"], cs[3])


INPLACE = "torch sharded rows on 2 ranks backward after an in-place write vs torch reference"


def test_in_place_probe_as_the_reference_passes(monkeypatch):
    # the reference: o.mul_(0.5) is allowed (o is saved by no backward), a.mul_(0.5) refused (tanh and the product
    # saved a): a layout gives the out-of-place gradients for o and raises for a
    ok = _with_inplace(lambda cs: {"o": _reference_grads(_case_of(cs), 0), "a": ("raised", "RuntimeError: modified")})
    sent, rows, col, _ = _check(monkeypatch, ok)
    (row,) = rows[INPLACE]
    assert col.failures == [] and row.compared == 4 * 4          # o: one per input; a: one for all, per case
    assert row.max_abs < 1e-12 and row.rel_err < 1e-12


def test_in_place_probe_gradients_where_the_reference_raises_are_checked(monkeypatch):
    ok = _with_inplace(lambda cs: {"o": _reference_grads(_case_of(cs), 0), "a": _reference_grads(_case_of(cs), 1)})
    sent, rows, col, _ = _check(monkeypatch, ok)
    assert col.failures == [] and rows[INPLACE][0].compared == 4 * 6


def test_in_place_probe_raising_where_the_reference_computes_fails(monkeypatch):
    bad = _with_inplace(lambda cs: {"o": ("raised", "RuntimeError: saved o modified"), "a": ("raised", "x")})
    sent, rows, col, _ = _check(monkeypatch, bad)
    assert len(col.failures) == 4 and rows[INPLACE][0].failed == 4
    f = col.failures[0]
    assert f.note == "o.mul_(0.5) before the backward: raised RuntimeError: saved o modified; the reference " \
                     "computes the gradients"
    assert f.inputs == ("q", "k", "v") and f.outputs == ("o", "a") and f.kind.value == "vjp"


def test_in_place_probe_wrong_gradients_fail_per_input(monkeypatch):
    def make(cs):
        q, k, v = _reference_grads(_case_of(cs), 0)
        return {"o": (q, k, v * 2 + 1), "a": ("raised", "x")}
    sent, rows, col, _ = _check(monkeypatch, _with_inplace(make))
    assert {f.inputs for f in col.failures} == {("v",)}
    assert all(f.note.startswith("o.mul_(0.5) before the backward") for f in col.failures)


def test_in_place_probe_that_raised_itself_fails_both_outputs(monkeypatch):
    sent, rows, col, _ = _check(monkeypatch, _with_inplace(lambda cs: {"error": "TypeError: probe broke"}))
    assert len(col.failures) == 8
    notes = {f.note for f in col.failures}
    assert notes == {"o.mul_(0.5) before the backward: the in-place probe raised TypeError: probe broke",
                     "a.mul_(0.5) before the backward: the in-place probe raised TypeError: probe broke"}


def test_a_failure_names_its_trial(monkeypatch):
    def edit(cases, outcomes):
        outcomes[3] = Outcome(error=Raised("RuntimeError", "x"))      # (4, 2, 3), trial 1 (off the path shapes)
    sent, rows, col, _ = _check(monkeypatch, edit, trials=2)
    (failure,) = col.failures
    assert (failure.shape, failure.trial) == ((4, 2, 3), 1)


def test_ranks_that_ended_alike_measure_nothing(monkeypatch):
    def edit(cases, outcomes):
        for i, o in enumerate(outcomes):
            outcomes[i] = dataclasses.replace(o, ranks="")
    sent, rows, col, _ = _check(monkeypatch, edit)
    (row,) = rows["torch sharded rows on 2 ranks every rank ends alike"]
    assert row.compared == 4 and row.failed == 0 and row.max_abs == 0.0 and row.rel_err == 0.0


def test_a_candidate_with_an_hvp_has_no_hvp_skip(monkeypatch):
    from crosscheck import torch_oracles as T
    import torch_impl

    def edit(cases, outcomes):                        # the path case's HVP, as a candidate with a rule gives it
        case = _case_of(cases[0])
        conv = lambda xs: tuple(None if x is None else T.to_native(x, "cpu") for x in xs)   # noqa: E731
        args = (conv(case.inputs), conv(case.second[0]), conv(case.second[2]))
        hvp = T.hand_hvp(torch_impl.attn)(*args)
        ref = T.ref_hvp(torch_impl.attn_reference, *args)
        res = outcomes[0].results
        outcomes[0] = Outcome(results=dataclasses.replace(res, hvp=[tuple(T.to_numpy(h) for h in hvp)],
                                                          hvp_ref=[tuple(T.to_numpy(h) for h in ref)]))
    sent, rows, col, _ = _check(monkeypatch, edit)
    assert not [s for s in col.skipped if s.oracle.kind.value == "hvp"]
    assert col.failures == []
