"""``scripts/gpu_check.py``, the one command that runs every GPU check: on this GPU-less machine it must say what
it would skip and why (exit 2), and every command it plans must be accepted by the tool it calls, so the script
cannot drift from the CLIs it drives before anyone with a GPU runs it."""

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

from benchmarks import gpu_kernels as bench_kernels  # noqa: E402
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
    assert len(steps) == 5
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
        elif module == "benchmarks.gpu_kernels":
            parsed = bench_kernels.parse_args(args)        # default device: cuda where torch has it
            assert not parsed.quick and not parsed.update_results and "scratch" in parsed.out
            assert parsed.budget_s <= 8 * 60               # issue 30: the full run within 8 minutes
            assert not (parsed.no_jax or parsed.no_compile)
            assert step.note if not jax_gpu else not step.note
        else:
            assert module == "pytest"
            assert all((ROOT / a).exists() for a in args if a.startswith("tests/"))
            if "tests/" in args:                           # the kernels' superseded timing report is left out
                assert args[args.index("-k") + 1] == "cuda"
            if jax_gpu and "tests/impl/test_jax_impl.py" in args:
                assert "tests/kernels/test_pallas.py" in args
    ran = {s.name for s in steps if s.argv}
    assert any("crosscheck" in n for n in ran) == (torch_gpu or jax_gpu)
    assert any("benchmark" in n for n in ran) == torch_gpu
    assert any("kernel benchmark" in n for n in ran) == torch_gpu
    assert any("JAX + Pallas tests" in n for n in ran) == jax_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_a_gpu_it_says_what_it_skipped_and_exits_2(capsys):
    assert gpu_check.main(["--dry-run"]) == 2
    out = capsys.readouterr().out
    assert "GPU check summary" in out
    assert out.count("SKIP") >= 4 and "torch.cuda.is_available() is False" in out
    assert "kernel benchmark" in out
