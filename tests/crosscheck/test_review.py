"""crosscheck as the lab's reviewer (issue 18): a backward that raises is reported per request, on its own path;
a user's implementation is checked in the lab's real dtypes with complex probed apart; the review of what the
lab asks beyond right numbers (validation, what is saved, recomputation, zeros, unrequested gradients,
differentiability) flags each planted flaw and nothing on the project's own implementations.

Runs go through ``test_crosscheck.cli`` (in-process, cached); the review and probe items are called directly
where the CLI adds nothing.
"""

from __future__ import annotations

import os

import pytest
import torch

from crosscheck import Config, run
from crosscheck.errors import ImplError
from crosscheck.probe import probe_complex
from crosscheck.review import review

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # tests/
from tests.conftest import require_jax  # noqa: E402
from tests.support import planted_bugs  # noqa: E402
from tests.support.planted_solutions import findings as planted  # noqa: E402
from tests.crosscheck.test_run import BUGS, SMALL, cli, rows  # noqa: E402

SOLUTIONS = os.path.join(HERE, "support", "planted_solutions", "findings.py")


def _closing(out: str) -> str:
    return out[out.index("crosscheck: FAIL"):]


# --- a backward that raises: one failure per request, on its own path ---------------------------------------------

@pytest.mark.jax
def test_crash_when_o_unused_names_that_path_and_no_other():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:CrashWhenOUnused")          # the default run
    assert code == 1
    first_order = [f for f in doc["failures"] if f["kind"] == "vjp"]
    assert first_order and all(f["error"].startswith("TypeError") for f in doc["failures"])
    assert {f["output"] for f in first_order} == {"a"}             # only o unused; (o,a) and (o) work
    # one failure per request (not per gradient, not per oracle): 3 + 6 input subsets... on the path shapes
    assert len(first_order) == len({(f["dtype"], tuple(f["shape"]), f["trial"], f["wrt"]) for f in first_order})
    closing = _closing(out)
    assert ("failing (with cotangent on (a); agrees with cotangent on (o,a), (o)): attn: backward raises TypeError "
            "[float32, float64]") in closing
    assert "raises TypeError only when o is unused" in closing
    # the exception once (its group header and its first message), not once per request
    raised = out[out.index("RAISED ("):out.index("review (torch")]
    assert raised.count("unsupported operand type(s) for @: 'NoneType' and 'Tensor'") == 2


@pytest.mark.jax
def test_crash_only_when_an_input_does_not_require_grad_keeps_the_paths_that_work():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:UnboundWhenNotAllRequireGrad")
    assert code == 1
    assert doc["failures"] and all(f["wrt"] and f["error"].startswith("UnboundLocalError") for f in doc["failures"])
    for oracle in ("torch hand VJP vs torch.func.vjp(ref)", "torch hand VJP vs torch.func.jacrev(ref)"):
        assert all(r["verdict"] == "ok" and r["compared"] for r in rows(doc, oracle=oracle)), oracle
    assert "raises UnboundLocalError only whenever some input does not require grad" in _closing(out)
    # the request that raised is one failure naming the gradients it was asked for, no "gradient not asked for"
    assert not any("not asked for" in f["note"] for f in doc["failures"])


@pytest.mark.jax
def test_crash_when_either_output_is_unused_is_summarised_without_a_subset_line():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:CrashWhenEitherUnused", *SMALL)
    closing = _closing(out)
    assert "failing (with cotangent on (o), (a); agrees with cotangent on (o,a)): attn: backward raises" in closing
    assert "fails whenever one output is unused" in closing
    assert "failing only" not in closing                     # the default path fails: no "only when" claims
    assert "failing in second order too (torch; first order fails too): attn: second order (VJP of the VJP) " \
           "raises TypeError" in closing


@pytest.mark.jax
def test_jax_rule_that_raises_on_a_symbolic_zero_fails_only_there():
    code, out, err, doc = cli("--jax-impl", f"{BUGS}:jax_crash_when_o_unused", *SMALL)
    assert code == 1
    vjp = [f for f in doc["failures"] if f["kind"] == "vjp"]
    assert vjp and all(f["error"].startswith("TypeError") for f in vjp)
    assert {f["output"] for f in vjp} == {"o", "a"}                # with both cotangents present it works
    assert rows(doc, oracle="jax hand VJP vs jax.vjp(ref)")[0]["failed"] < rows(
        doc, oracle="jax hand VJP vs jax.vjp(ref)")[0]["compared"]


# --- dtypes: the lab's contract is real; complex is probed apart ---------------------------------------------------

@pytest.mark.jax
def test_real_only_solution_passes_by_default_with_a_note_on_complex():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:RealOnly", "--shapes", "5x2x3", "--random-shapes", "0")
    assert code == 0, out
    assert doc["dtypes"] == ["float32", "float64"]
    assert doc["complex"]["torch"]["status"] == "unsupported"
    assert f"complex (torch, {BUGS}:RealOnly): not supported: the forward raises TypeError" in out


def test_a_dtype_the_forward_rejects_is_named_before_any_work(monkeypatch):
    from crosscheck.parts import EagerExecutor
    monkeypatch.setattr(EagerExecutor, "run", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ImplError, match=r"raises on complex128 inputs \(TypeError.*--dtype float64"):
        run(Config(ops=("attn",), frameworks=("torch",), dtypes=("float64", "complex128"),
                   torch_impl=planted_bugs.RealOnly.apply, torch_impl_name="RealOnly"))


@pytest.mark.parametrize("fn, status, text", [
    (torch.ops.attn_lab.attn, "right", ""),
    (planted_bugs.JaxConventionInTorch.apply, "wrong", "a missing conjugate"),
    (planted_bugs.NoConj.apply, "wrong", "the gradient of q, k disagrees"),      # partly conjugated: no match
    (planted_bugs.RealOnly.apply, "unsupported", "complex inputs are not supported"),
])
def test_complex_probe(fn, status, text):
    import torch_impl
    result = probe_complex("torch", fn, torch_impl.attn_reference)
    assert result.status == status and text in result.detail, result


# --- the review ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(planted.FINDINGS))
def test_review_flags_each_planted_flaw(name):
    from crosscheck.review import KEYS
    found = review("torch", getattr(planted, name).apply, name)
    assert planted.FINDINGS[name] in {f.key for f in found.findings}, found
    assert {f.key for f in found.findings} <= set(KEYS["torch"])
    assert all(f.title and f.evidence for f in found.findings)


def test_every_finding_has_a_planted_solution():
    from crosscheck.review import KEYS
    assert set(planted.FINDINGS.values()) == set(KEYS["torch"])
    assert set(planted.JAX_FINDINGS.values()) == set(KEYS["jax"])


@pytest.mark.parametrize("name", sorted(planted.JAX_FINDINGS))
@pytest.mark.jax
def test_jax_review_flags_each_planted_flaw(name):
    found = review("jax", getattr(planted, f"jax_{name}"), name)
    assert planted.JAX_FINDINGS[name] in {f.key for f in found.findings}, found


def test_review_keeps_the_solutions_warnings_on_bad_inputs_to_itself():
    import warnings

    def transposes(q, k, v):                      # q.T on the 3-D bad input: torch warns (deprecated)
        a = torch.tanh((k @ q.T).T)
        return a @ v, a

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        review("torch", transposes, "transposes")
    assert not caught, [str(w.message) for w in caught]


@pytest.mark.jax
def test_projects_own_implementations_get_a_clean_review():
    import torch_impl
    for fn, name in ((torch_impl.attn, "torch_impl.attn"), (torch.ops.attn_lab.attn, "attn_lab.attn"),
                     (planted.Lean.apply, "Lean")):
        result = review("torch", fn, name)
        assert result.findings == [] and result.unavailable == [], result
    import jax_impl
    for fn in (jax_impl.attn, jax_impl.attn_jvp, planted.jax_lean):
        result = review("jax", fn, "jax")
        assert result.findings == [] and result.unavailable == [], result


@pytest.mark.jax
def test_review_is_advice_unless_strict():
    args = ("--torch-impl", f"{SOLUTIONS}:RecomputesTanh", *SMALL)
    code, out, err, doc = cli(*args)
    assert code == 0 and doc["failures"] == []                        # the numbers are right
    assert f"review (torch, {SOLUTIONS}:RecomputesTanh):" in out and "recomputes tanh in backward" in out
    assert "aten::tanh" in out and doc["review"]["torch"]["findings"]
    code, out, err, doc = cli(*args, "--strict")
    assert code == 1 and doc["summary"].startswith("crosscheck: FAIL:") and "under --strict" in doc["summary"]
    code, out, err, doc = cli("--torch-impl", f"{SOLUTIONS}:Lean", *SMALL, "--strict")
    assert code == 0 and f"review (torch, {SOLUTIONS}:Lean): clean" in out


def test_review_runs_in_a_dtype_the_solution_accepts():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:Float32Only", "--dtype", "float32", "--frameworks", "torch",
                              "--trials", "1", "--random-shapes", "0", "--shapes", "5x2x3")
    assert code == 0, out
    assert doc["review"]["torch"]["unavailable"] == []
    assert {f["key"] for f in doc["review"]["torch"]["findings"]} >= {"saves_unneeded", "returns_unrequested"}


@pytest.mark.jax
def test_non_differentiable_a_gets_its_cause_and_second_order_summarised():
    code, out, err, doc = cli("--torch-impl", f"{SOLUTIONS}:NonDifferentiableA", *SMALL)
    assert code == 1
    closing = _closing(out)
    assert "a is returned non-differentiable" in closing and "G_A term of" not in closing
    assert "failing in second order too (torch; first order fails too)" in closing


@pytest.mark.jax
def test_once_differentiable_second_order_names_the_cause():
    code, out, err, doc = cli("--torch-impl", f"{SOLUTIONS}:OnceDifferentiable", *SMALL)
    assert code == 1
    closing = _closing(out)
    assert "failing in second order only (torch; first order agrees): attn: VJP of the VJP" in closing
    assert "the backward cannot be differentiated (@once_differentiable" in closing


# --- smaller items ----------------------------------------------------------------------------------------------------

def test_forward_returning_one_tensor_is_described_as_one():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:torch_one_output", "--frameworks", "torch", *SMALL,
                              json_doc=False)
    assert code == 2
    assert "got 1 output of shape (5, 3) (return the pair (o, a), not one tensor)" in err


@pytest.mark.jax
def test_torch_impl_alone_leaves_the_projects_jax_implementation_out():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:Correct", *SMALL)
    assert code == 0
    oracles = {r["oracle"] for r in doc["rows"]}
    assert not any(o.startswith("jax") for o in oracles), oracles
    assert {"torch (yours) vs jax reference", "torch hand VJP (yours) vs jax.vjp(ref) (eq. 17)",
            "torch hand JVP (yours) vs jax.jvp(ref)"} <= oracles
    # the student's own rows are marked as theirs in the table
    assert "torch hand VJP (yours) vs torch.func.vjp(ref)" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_device_cuda_message_is_one_line_per_framework():
    code, out, err, doc = cli("--device", "cuda", "--frameworks", "torch", json_doc=False)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) >= 3 and all(len(line) <= 200 for line in lines), lines


def test_jax_matmul_precision_spelling_is_full_precision():
    jax = require_jax()
    import jax.numpy as jnp
    from crosscheck.jax_oracles import MATMUL_PRECISION, context
    # the names JAX 0.4.30 accepts (it rejects "highest"); newer versions accept these too
    assert MATMUL_PRECISION in ("bfloat16", "tensorfloat32", "float32")
    with context("cpu"):
        text = jax.jit(lambda a, b: a @ b).lower(jnp.ones((2, 2), jnp.float32), jnp.ones((2, 2), jnp.float32)).as_text()
    assert "HIGHEST" in text
