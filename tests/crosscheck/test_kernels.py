"""crosscheck --kernels: the fused Triton / Pallas kernels as candidates, on every path, through the interpreters.

The runs are kept small: one kernel shape (n = 17: two tiles of 16, the second with one row; d ≠ e), one trial,
float32, and a tiny main loop.  Planted wrong kernels (tests/support/planted_kernels.py) must fail their rows.
The runs that start the torch subprocess (a Triton interpreter each) are marked ``kernels``.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from crosscheck import Config, UsageError, kernels, run
from crosscheck.cli import main
from crosscheck.kernels import candidates as kernel_candidates
from crosscheck.specs import KERNEL_OPS, SPECS
from tests.conftest import require_jax

require_jax()
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
_UNAVAILABLE = "; ".join(why for fw in ("torch", "jax") for why in [kernels.unavailable(fw, "cpu")] if why)
if _UNAVAILABLE:                # --kernels refuses then (test_kernels_refused_where_they_cannot_run)
    pytestmark = pytest.mark.skipif(True, reason=f"the kernels cannot be checked here: {_UNAVAILABLE}")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # tests/
TINY = dict(dtypes=("float32",), trials=1, random_shapes=0, shapes=((2, 2, 3),), path_shapes=0)
SHAPE = (17, 3, 2)                                   # not a multiple of the tile; d ≠ e


@pytest.fixture
def one_shape(monkeypatch):
    """The kernel candidates on SHAPE alone, every path (set where the run reads them: ``kernels.candidates``)."""
    monkeypatch.setattr(kernel_candidates, "KERNEL_SHAPES", (SHAPE,))
    monkeypatch.setattr(kernel_candidates, "PATH_SHAPES", 1)


def _rows(report, candidate):
    return [r for r in report.rows if r.label.startswith(candidate + " ")]


def test_kernel_ops_are_left_out_without_kernels(capsys):
    """The default run checks no kernel: the ops attn_o, attn_o_causal are dropped from the config, no row names a
    kernel candidate, and the CLI says in one line that they were not checked and how to check them."""
    assert set(KERNEL_OPS) == {"attn_o", "attn_o_causal"} and all(SPECS[op].kernel for op in KERNEL_OPS)
    report = run(Config(ops=("attn",) + KERNEL_OPS, frameworks=("torch",), **TINY))
    assert report.config.ops == ("attn",)
    assert not any("triton" in r.label or "pallas" in r.label for r in report.rows)
    assert main(["--op", "attn", "--frameworks", "torch", "-q", "--dtype", "float32", "--trials", "1",
                 "--random-shapes", "0", "--shapes", "2x2x3"]) == 0
    out = capsys.readouterr().out
    assert "kernels: not checked" in out and "--kernels" in out
    with pytest.raises(UsageError, match="--kernels"):
        run(Config(ops=("attn_o",), **TINY))
    with pytest.raises(UsageError, match="cannot be combined with --torch-impl"):   # the project's kernels only
        run(Config(ops=("attn",), torch_impl_name="my_attn.py:attn", **TINY), kernels=True)


@pytest.fixture(scope="module")
def every_path():
    """One run of every candidate on SHAPE, every path (shared: each run costs an interpreter start)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel_candidates, "KERNEL_SHAPES", (SHAPE,))
        mp.setattr(kernel_candidates, "PATH_SHAPES", 1)
        return run(Config(ops=("attn", "attn_o_causal"), **TINY), kernels=True)


@needs_triton
@pytest.mark.kernels
def test_every_kernel_candidate_agrees_on_every_path(every_path):
    """Both frameworks' fused candidates on attn and o-only candidates on attn_o_causal, interpreted: forward, VJP
    on every input subset and cotangent mode, jacrev, JVP, and second order where offered; a missing rule is a
    skip with its reason, never a silent absence."""
    report = every_path
    assert not report.failures, [f.message() for f in report.failures[:5]]
    for cand in ("torch triton fused (interpreted)", "torch triton o-only (interpreted)",
                 "jax pallas fused (interpreted)", "jax pallas o-only (interpreted)"):
        rows = _rows(report, cand)
        kinds = {r.kind for r in rows if r.compared}
        assert {"forward", "vjp"} <= kinds, (cand, kinds)
        assert any("input subsets" in r.label and r.compared for r in rows), cand
        assert "vjp_vjp" in kinds, (cand, kinds)     # first order by kernels, second order as the entry does
        if cand.startswith("torch"):
            assert "jvp" in kinds, (cand, kinds)
    reasons = " ".join(s.reason for s in report.skipped)
    assert "attn_fused is a jax.custom_vjp: no forward-mode rule" in reasons
    assert kernels.describe(report.config, True).startswith("kernels: checked torch triton fused (interpreted)")


@needs_triton
@pytest.mark.kernels
def test_torch_kernel_hvp_forward_over_reverse(every_path):
    """A backward on dual tensors (forward-over-reverse HVP) runs the ATen formulas (kernels.differentiated): the
    Triton kernels would drop the tangents, which this row caught (rel err 1.0 on the HVP rows)."""
    hvp = [f for f in every_path.failures if f.kind == "hvp"]
    assert not hvp, [f.message() for f in hvp[:3]]


def _dropped_ga_failures(report, candidate):
    return [f for f in report.failures if f.candidate == candidate and f.kind == "vjp"]


@needs_triton
@pytest.mark.kernels
def test_planted_torch_kernel_without_ga_is_caught(one_shape, monkeypatch):
    """The fused backward without its G_A term, planted in the torch subprocess: the candidate's VJP rows with a
    cotangent on a fail, those with the cotangent on o alone agree."""
    monkeypatch.setenv(kernels.SETUP_ENV, os.path.join(HERE, "support", "planted_kernels.py") + ":torch_drop_ga")
    monkeypatch.setattr(kernel_candidates, "PATH_SHAPES", 0)
    report = run(Config(ops=("attn",), frameworks=("torch",), **TINY), kernels=True)
    failed = _dropped_ga_failures(report, "torch triton fused (interpreted)")
    assert failed and {f.outputs for f in failed} == {("o", "a"), ("a",)}
    assert all(f.op == "attn" and f.framework == "torch" for f in report.failures if f.candidate)


def test_planted_pallas_kernel_without_ga_is_caught(one_shape, monkeypatch):
    from jax_impl.kernels import pallas_attn

    from tests.support.planted_kernels import jax_fused_backward_drop_ga
    monkeypatch.setattr(pallas_attn, "fused_backward", jax_fused_backward_drop_ga(pallas_attn.fused_backward))
    monkeypatch.setattr(kernel_candidates, "PATH_SHAPES", 0)
    report = run(Config(ops=("attn",), frameworks=("jax",), **TINY), kernels=True)
    failed = _dropped_ga_failures(report, "jax pallas fused (interpreted)")
    assert failed and {f.outputs for f in failed} == {("o", "a"), ("a",)}


def test_describe_names_the_candidates_and_how():
    c = Config(ops=("attn", "attn_o"), dtypes=("float32", "float64"))
    line = kernels.describe(c, True)
    assert "torch triton fused (interpreted) [float32; attn]" in line
    assert "jax pallas o-only (interpreted) [float32, float64; attn_o]" in line
    assert "(compiled)" in kernels.describe(Config(ops=("attn",), dtypes=("float32",), device="cuda"), True)
    assert kernels.describe(Config(ops=("attn",), dtypes=("complex128",)), True).startswith("kernels: none checked")


def test_kernels_refused_where_they_cannot_run(monkeypatch):
    """Where a framework's kernels cannot run (an old JAX, an interpreter that cannot run the loops), --kernels
    refuses before any work, in one line naming why, instead of failing row by row."""
    monkeypatch.setattr(kernels, "unavailable", lambda fw, device: "planted: no kernels" if fw == "jax" else "")
    from crosscheck import runner
    monkeypatch.setattr(runner, "kernels_unavailable", kernels.unavailable)
    with pytest.raises(UsageError, match="--kernels: planted: no kernels"):
        run(Config(ops=("attn",), dtypes=("float32",), shapes=((2, 2, 2),), random_shapes=0), kernels=True)
