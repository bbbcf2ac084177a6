"""``scripts/gpu_check.py``, the one command that runs every GPU check: on this GPU-less machine it must say what
it would skip and why (exit 2), and every command it plans must be accepted by the tool it calls, so the script
cannot drift from the CLIs it drives before anyone with a GPU runs it."""

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

from benchmarks import run as bench_run  # noqa: E402
from crosscheck import cli as cross_cli  # noqa: E402

from tests.conftest import ROOT  # noqa: E402

_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check      # dataclasses look their module up there
_spec.loader.exec_module(gpu_check)


@pytest.mark.parametrize("torch_gpu, jax_gpu", [(True, True), (True, False), (False, True), (False, False)])
def test_every_planned_command_is_accepted_by_its_tool(torch_gpu, jax_gpu):
    steps = gpu_check.plan({"torch_gpu": torch_gpu, "jax_gpu": jax_gpu, "torch": "x", "jax": "y"})
    assert len(steps) == 4
    for step in steps:
        if step.argv is None:
            assert step.why_skipped
            continue
        module, args = step.argv[2], step.argv[3:]
        if module == "crosscheck":
            parsed = cross_cli.build_parser().parse_args(args)
            assert parsed.device == "cuda"
            assert "--frameworks" not in args if (torch_gpu and jax_gpu) else step.note
        elif module == "benchmarks":
            parsed = bench_run.parse_args(args)
            assert (parsed.device, parsed.quick) == ("cuda", True)
            assert "scratch" in parsed.out                 # never the committed results
        else:
            assert module == "pytest"
            assert all((ROOT / a).exists() for a in args if a.startswith("tests/"))
    ran = {s.name for s in steps if s.argv}
    assert any("crosscheck" in n for n in ran) == (torch_gpu or jax_gpu)
    assert any("benchmark" in n for n in ran) == torch_gpu
    assert any("JAX tests" in n for n in ran) == jax_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_a_gpu_it_says_what_it_skipped_and_exits_2(capsys):
    assert gpu_check.main(["--dry-run"]) == 2
    out = capsys.readouterr().out
    assert "GPU check summary" in out
    assert out.count("SKIP") >= 3 and "torch.cuda.is_available() is False" in out
