"""What a first user meets: the benchmark commands the docs cite leave the committed results alone, a benchmark on
a loaded machine says so, a numpy array handed to the operator gets the answer the docs promise, and the README's
set-up says what the test run costs and how to get the CPU wheel."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex

import pytest

from tests.conftest import ROOT

PAGES = ["README.md"] + sorted(f"docs/{p}" for p in os.listdir(ROOT / "docs") if p.endswith(".md"))


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


# --- 1. benchmark commands write to the scratch folder unless asked ------------------------------------------
def documented_benchmark_commands():
    """(page, module, argv) of each ``python -m benchmarks[.x]`` command in README.md and docs/: in an inline code
    span (which may wrap a line) or on a line of an indented code block, up to a comment."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        spans = [s.replace("\n", " ") for s in re.findall(r"`(python -m benchmarks[^`]*)`", text)]
        spans += re.findall(r"^ {4,}(python -m benchmarks[^#\n]*)", text, flags=re.M)
        for span in spans:
            module, *argv = shlex.split(span)[2:]
            found.append((page, module, argv))
    return found


def _output(module: str, argv: list) -> str:
    """Where ``python -m module argv`` writes, as its own argument parser decides."""
    if module == "benchmarks":
        from benchmarks import run
        return run.parse_args(argv).out
    if module == "benchmarks.distributed":
        from benchmarks import distributed
        return distributed.parse_args(argv).out
    if module == "benchmarks.distributed_jax":
        from benchmarks import distributed_jax
        return distributed_jax.parse(argv).out
    if module == "benchmarks.ab":
        from benchmarks import ab
        return ab.parse_args([a if a != "REV" else "HEAD" for a in argv]).out
    if module == "benchmarks.gpu_kernels":
        from benchmarks import gpu_kernels
        return gpu_kernels.parse_args(argv).out
    if module == "benchmarks.gpu_static":
        from benchmarks.gpu_static import __main__ as gpu_static
        out = gpu_static.parse_args(argv)[1].out
        return out if out is not None else os.path.join(ROOT, "benchmarks", "scratch", "nowhere")   # --check
    if module == "benchmarks.gpu_static.pallas_side":      # prints its rows; writes only a --json PATH it is given
        assert "--json" not in argv, argv
        return os.path.join(ROOT, "benchmarks", "scratch", "nowhere")
    raise AssertionError(f"a benchmark entry this test does not know: {module}")


def test_the_docs_cite_benchmark_commands():
    modules = {m for _, m, _ in documented_benchmark_commands()}
    assert {"benchmarks", "benchmarks.distributed", "benchmarks.distributed_jax"} <= modules, modules


def test_documented_benchmark_commands_leave_the_committed_results_alone():
    """Trying a command the docs cite (the counts-only run of docs/distributed-jax.md, a quick run, a full run)
    must not overwrite benchmarks/results/: only --update-results (or an --out naming it) writes there."""
    results = os.path.realpath(ROOT / "benchmarks" / "results")
    scratch = os.path.realpath(ROOT / "benchmarks" / "scratch")
    for page, module, argv in documented_benchmark_commands():
        out = os.path.realpath(_output(module, argv))
        if "--update-results" in argv:
            assert out.startswith(results), (page, module, argv, out)
        elif "--out" not in argv:
            assert out.startswith(scratch + os.sep), (page, module, argv, out)


@pytest.mark.parametrize("module, argv", [
    ("benchmarks", []), ("benchmarks", ["--threads", "1"]),
    ("benchmarks.distributed", []), ("benchmarks.distributed_jax", ["--devices", "8", "--counts-only"]),
])
def test_every_benchmark_entry_defaults_to_scratch_and_updates_only_when_asked(module, argv):
    scratch = os.path.join(ROOT, "benchmarks", "scratch")
    results = os.path.join(ROOT, "benchmarks", "results")
    assert _output(module, argv).startswith(scratch + os.sep)
    assert _output(module, argv + ["--update-results"]).startswith(results)


# --- 2. a loaded or oversubscribed machine is reported --------------------------------------------------------
@pytest.mark.parametrize("cores, threads, load, own, expect", [
    (2, 2, 0.0, 0.0, []),
    (2, 2, 0.6, 0.0, []),                      # a quiet machine (the committed run started at 0.6)
    (2, 2, 1.8, 2.0, []),                      # at the end: the load is this run's own threads
    (2, 2, 3.0, 0.0, ["loaded"]),              # other agents at work: torch's 2 threads miss cores
    (2, 1, 1.5, 0.0, ["loaded"]),
    (16, 2, 3.0, 0.0, []),                     # load, but cores to spare
    (2, 4, 0.0, 0.0, ["oversubscribed"]),
    (2, 4, 5.0, 0.0, ["oversubscribed", "loaded"]),
])
def test_load_warnings(cores, threads, load, own, expect):
    from benchmarks import run
    found = run.load_warnings(cores, threads, load, own=own)
    assert len(found) == len(expect) and all(w in f for w, f in zip(expect, found)), found


def test_a_run_on_a_loaded_machine_warns_on_stderr_and_in_the_report(tmp_path, monkeypatch):
    """The figures of a loaded machine are not hidden: a warning on stderr (at the start and again at the end)
    and in report.md, naming the load, the cores and torch's threads and the way out."""
    torch = pytest.importorskip("torch")
    from benchmarks import run
    monkeypatch.setattr(run.os, "getloadavg", lambda: (7.5, 7.0, 6.0))
    monkeypatch.setattr(run.os, "cpu_count", lambda: 2)
    threads = torch.get_num_threads()
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = run.main(["--sizes", "2x3x4", "--dtypes", "float32", "--budget", "0.01", "--no-plot", "--no-jax",
                         "--no-compile", "--batched", "none", "--out", str(tmp_path)])
    assert code == 0
    stderr = err.getvalue()
    assert stderr.count("WARNING: at the start, the machine is loaded: 1-minute load average 7.5 on 2 cores") == 2
    assert f"torch on {threads} threads" in stderr and "--threads 1" in stderr
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "**Warning**: at the start, the machine is loaded: 1-minute load average 7.5 on 2 cores" in report
    assert "**Warning**: at the end, the machine is loaded" in report


# --- 4. a numpy array handed to the operators -----------------------------------------------------------------
def test_numpy_input_torch_impl_gives_the_contracts_line_the_operator_the_dispatchers_message():
    """``torch_impl.attn`` checks the contract itself; ``torch.ops.attn_lab.attn`` is parsed against its schema
    by the dispatcher before any kernel of ours runs, and PyTorch has no per-operator public hook ahead of that
    parse (a TorchFunctionMode sees it only while active around the whole program), so it answers with the
    dispatcher's multi-line RuntimeError.  docs/operators.md says both."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    import attn_contract
    import torch_impl
    x, t = np.zeros((2, 3), dtype=np.float32), torch.zeros(2, 3)
    contract = attn_contract.message("type", name="q", accepted="torch.Tensor", type="numpy.ndarray")
    with pytest.raises(TypeError) as info:
        torch_impl.attn(x, t, t)
    assert str(info.value) == contract
    for op in (torch.ops.attn_lab.attn, torch.ops.attn_lab.attn_composite):
        with pytest.raises(RuntimeError) as info:
            op(x, t, t)
        first = str(info.value).splitlines()[0]
        assert first.endswith("Expected a value of type 'Tensor' for argument 'q' but instead found type "
                              "'ndarray'."), first
    paragraph = [p for p in (ROOT / "docs/operators.md").read_text(encoding="utf-8").split("\n* ")
                 if "checked against the schema" in p]
    assert len(paragraph) == 1
    text = " ".join(paragraph[0].split())
    for said in ("numpy array", "Expected a value of type 'Tensor' for argument 'q'", "no per-operator public hook",
                 f"`{contract}`", "`torch_impl.attn`"):
        assert said in text, said


# --- 5. the README's set-up: what the test run costs, and the CPU wheel --------------------------------------
def test_setup_says_what_the_test_run_costs_and_how_to_get_the_cpu_wheel():
    setup = " ".join(_section((ROOT / "README.md").read_text(encoding="utf-8"), "Set-up").split())
    assert re.search(r"about \d+ min(utes)? of wall time", setup), setup
    assert re.search(r"\d+(\.\d+)? GB (of memory )?per (xdist )?worker", setup), setup
    # the CPU index in the command a Linux user pastes (the default index gives Linux x86-64 the CUDA build),
    # and the prose says why and what happens where the index is out of reach
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && " in setup
    assert "CPU wheel index" in setup and "install selector" in setup and "CUDA build" in setup
    assert "out of reach" in setup and "local wheels" in setup
