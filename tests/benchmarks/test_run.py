"""The benchmarks as a program: a tiny CPU run of every contender kind and what its report says, the output
directory rules, the dependency checks, and the device plumbing a CUDA run depends on (tested here without a
GPU: a stand-in tensor that reports ``cuda:0``, a recorded ``jax.device_put``, a recorded
``torch.cuda.synchronize``).

No timing is asserted (the machine is shared): only that every figure exists, where it was measured, at
which precision, and that every contender's gradients agree with the reference.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks import contenders as C  # noqa: E402
from benchmarks import measure as M  # noqa: E402
from benchmarks import report as R  # noqa: E402
from benchmarks import run  # noqa: E402
import torch_impl  # noqa: E402

from tests.conftest import ROOT, optional_jax  # noqa: E402

jax = optional_jax()          # the torch-only install: JAX contenders are checked where JAX exists

# The tiny run: the lab size only, float32, a token budget.  ~5 s on 2 cores.
TINY = ["--sizes", "2x3x4", "--dtypes", "float32", "--budget", "0.02", "--no-plot"]


class _StandInCuda(torch.Tensor):
    """Real CPU data behind a tensor that reports ``device='cuda:0'``, as a CUDA tensor would: ``.numpy()``
    refuses it, and only a copy to the CPU (``aten._to_copy`` with ``device=cpu``) gives a plain tensor back."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device="cuda:0",
                                                   strides=data.stride())

    def __init__(self, data):
        self.payload = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            kwargs.pop("device")
            return func(args[0].payload, *args[1:], **kwargs)
        unwrap = lambda x: x.payload if isinstance(x, _StandInCuda) else x   # noqa: E731
        out = func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs))
        return torch.utils._pytree.tree_map(lambda x: _StandInCuda(x) if isinstance(x, torch.Tensor) else x, out)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run in this process (torch.compile with the eager backend: the compiled contenders' plumbing
    without minutes of inductor work), with fd 1/2 captured and torch's fp32 matmul precision set to TF32 by
    "the caller" beforehand.  Restores every global the run or the fixture touches."""
    out = tmp_path_factory.mktemp("bench")
    matmul = torch.backends.cuda.matmul
    new_api = hasattr(matmul, "fp32_precision")
    before = matmul.fp32_precision if new_api else torch.get_float32_matmul_precision()
    x64 = jax.config.jax_enable_x64 if jax is not None else None
    real_compile = torch.compile
    # every torch.compile contender (whatever it compiles) with dynamo's eager backend: same plumbing, no inductor
    torch.compile = lambda *a, **kw: real_compile(*a, **dict(kw, backend="eager"))
    capture = out / "stdio"
    saved_fds = [os.dup(1), os.dup(2)]
    try:
        if new_api:
            matmul.fp32_precision = "tf32"
        else:
            torch.set_float32_matmul_precision("high")
        text = io.StringIO()                # Python's prints (pytest may have replaced sys.stdout) ...
        with open(capture, "wb") as f:      # ... and what C++ writes to the descriptors
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
            try:
                with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                    code = run.main(TINY + ["--out", str(out)])
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved_fds[0], 1), os.dup2(saved_fds[1], 2)
        after = matmul.fp32_precision if new_api else torch.get_float32_matmul_precision()
    finally:
        for fd in saved_fds:
            os.close(fd)
        torch.compile = real_compile
        if new_api:
            matmul.fp32_precision = before
        else:
            torch.set_float32_matmul_precision(before)
        if jax is not None:
            jax.config.update("jax_enable_x64", x64)
        torch.compiler.reset()
    with open(out / "results.json") as f:
        results = json.load(f)
    return {"code": code, "results": results, "report": (out / "report.md").read_text(),
            "stdio": text.getvalue() + capture.read_text(errors="replace"), "precision_after": after,
            "new_api": new_api, "out": out}


def test_tiny_run_times_and_checks_every_contender(tiny_run):
    assert tiny_run["code"] == 0
    res = tiny_run["results"]
    (case,) = res["cases"]
    live = [name for name, c in res["contenders"].items() if c["available"]]
    kinds = {res["contenders"][n]["framework"] for n in live}
    assert {"torch", "floor"} <= kinds and "compiled" in live
    if jax is not None:
        assert "jax" in kinds
    for mode in ("both", "o", "a"):
        assert set(case["time"][mode]) == set(live), mode
        for name in live:
            assert case["time"][mode][name]["median"] > 0
            if res["contenders"][name]["framework"] != "floor":   # the floor computes no gradients
                assert case["rel_error"][mode][name] < 1e-5, (mode, name)
    assert not case.get("errors")
    for name in live:                      # memory probes ran for every torch contender, every mode
        if res["contenders"][name]["framework"] == "torch":
            assert {"saved", "both", "o", "a"} <= set(case["memory"][name])
            assert "error" not in case["memory"][name]["both"]
            assert case["memory"][name]["both"]["peak_bytes"] > 0


def test_lab_size_target_is_attn_against_the_bare_function(tiny_run):
    """At n=2 Function.apply dominates: the target holds attn to a bare new-style Function with the same
    products (measured, so it has a value), and the composite ratios are information only."""
    res = tiny_run["results"]
    assert "bare_function" in res["cases"][0]["time"]["both"]
    (lab,) = [t for t in res["targets"] if t["target"].startswith("lab size") and t["met"] is not None]
    assert "attn / bare new-style Function ≤ 1.10" in lab["target"] and lab["limit"] == 1.10 and lab["value"] > 0
    assert {t["target"].split(": ")[1] for t in res["targets"] if "(information)" in t["target"]
            and t["target"].startswith("lab size")} == {"attn / reference eager (information)",
                                                         "bare_function / reference eager (information)"}


def test_bare_function_gradients_are_the_references():
    q, k, v = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in ((5, 3), (5, 3), (5, 4)))
    go, ga = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    got = torch.autograd.grad(C.bare_function(q, k, v), (q, k, v), (go, ga))
    want = torch.autograd.grad(torch_impl.attn_reference(q, k, v), (q, k, v), (go, ga))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("mode", C.MODES)
def test_eager_floor_does_the_work_it_is_the_floor_of(mode):
    """The eager floor is a floor only if it computes what attn computes: the same a, o and gradients."""
    case = C.Case(6, 3, 4, "float64")
    case.make_arrays()
    a, o, g_q, g_k, g_v = C.eager_floor_step(case, mode)()
    q, k, v, go, ga = C.torch_inputs(case)
    o_ref, a_ref = torch_impl.attn_reference(q, k, v)
    outputs, cotangents = {"both": ((o_ref, a_ref), (go, ga)), "o": ((o_ref,), (go,)), "a": ((a_ref,), (ga,))}[mode]
    want = torch.autograd.grad(outputs, (q, k, v), cotangents, allow_unused=True)
    torch.testing.assert_close((a, o), (a_ref.detach(), o_ref.detach()))
    torch.testing.assert_close((g_q, g_k), want[:2])
    if mode == "a":                     # with G_O absent, v has no gradient and the floor computes none
        assert g_v is None and want[2] is None
    else:
        torch.testing.assert_close(g_v, want[2])


def test_tanh_kernels_times_atens_two_kernels_and_the_report_names_them():
    from benchmarks import kernels as K
    k = K.tanh_kernels(64, "float64", reps=3, with_inductor=False)
    assert set(k) == {"aten_tanh", "aten_tanh_backward"} and all(t > 0 for t in k.values())
    line = R.describe_tanh_kernels({"n": 64, "tanh_kernels": k})
    assert line.startswith("elementwise kernels alone, 64×64: ATen tanh ") and "ATen tanh_backward" in line


def test_report_names_devices_backend_and_precision(tiny_run):
    res, report = tiny_run["results"], tiny_run["report"]
    meta = res["meta"]
    assert meta["device"] == "cpu"
    if tiny_run["new_api"]:
        assert set(meta["fp32_precision"]["torch"].values()) == {"ieee"}     # although the caller set tf32
        assert tiny_run["precision_after"] == "tf32"                          # ... and got it back
    else:
        assert meta["fp32_precision"]["torch"] == {"float32_matmul_precision": "highest"}
        assert tiny_run["precision_after"] == "high"
    assert "float32 matmul precision: torch" in report and "CPU allocator events" in report
    if jax is not None:
        assert meta["jax_device"].startswith("cpu:0")
        assert meta["fp32_precision"]["jax"] == ["HIGHEST"]                  # read from every lowered step
        assert "JAX on cpu:0" in report and "JAX dots HIGHEST" in report


def test_output_has_no_issue_numbers_or_profiler_noise(tiny_run):
    stdio = tiny_run["stdio"]
    assert "\nTargets\n" in stdio and "Devices: torch on cpu" in stdio
    assert "USDT" not in stdio and "STAGE:" not in stdio, stdio[:2000]
    for text in (stdio, tiny_run["report"]):
        assert "issue" not in text.lower()


def test_profiler_noise_filter_keeps_other_stderr(capfd):
    with M._quiet_profiler_noise():
        os.write(2, b"USDT:2026 x.cpp:52] profiler_start\nreal warning\nSTAGE:2026 y] Warm Up\n")
    assert capfd.readouterr().err == "real warning\n"


def test_cuda_report_names_the_gpu_and_shows_the_cuda_peak(tiny_run, tmp_path, capsys):
    """A CUDA run's results rendered here: the GPU is named and the peak is the CUDA allocator's."""
    res = json.loads(json.dumps(tiny_run["results"]))
    res["meta"].update(device="cuda", gpu="NVIDIA Stand-in 80GB", cuda="13.0")
    (case,) = res["cases"]
    for mem in case["memory"].values():
        mem["both"]["peak_bytes_cuda"] = 3 * 2 ** 20
    R.write_markdown(res, tmp_path / "report.md", plot_name=None)
    text = (tmp_path / "report.md").read_text()
    assert "torch on cuda (NVIDIA Stand-in 80GB, CUDA 13.0)" in text
    assert "CUDA caching allocator on NVIDIA Stand-in 80GB" in text and "CPU allocator events" not in text
    assert "| 3.0 MiB |" in text
    R.print_case(case, res["contenders"])
    assert "peak fwd+bwd 3.0 MiB" in capsys.readouterr().out


# --- device plumbing ---------------------------------------------------------------------------------------

def test_grads_of_a_device_tensor_are_copied_to_the_host():
    g = torch.arange(6.0).reshape(2, 3)
    dev = _StandInCuda(g)
    assert dev.device.type == "cuda"
    with pytest.raises(RuntimeError):        # what `.detach().numpy()` alone does with it
        dev.detach().numpy()
    dq, dk, dv = C.to_numpy_grads(((), (dev, g, None)))
    np.testing.assert_array_equal(dq, g.numpy())
    np.testing.assert_array_equal(dk, g.numpy())
    assert dv is None
    assert M.relative_error(((), (dev, dev, None)), ((), (g, g, None))) == 0.0
    # A meta tensor has no data: the conversion must get as far as the host copy (not stop at `.numpy()`).
    with pytest.raises(NotImplementedError, match="meta"):
        C.to_numpy_grads(((), (torch.empty(2, 3, device="meta"),)))


def test_compile_time_is_synchronized_on_cuda(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    result, seconds = M.timed_first_call(lambda: events.append("step") or "out", device="cuda")
    assert (result, events) == ("out", ["sync", "step", "sync"]) and seconds >= 0
    events.clear()
    M.timed_first_call(lambda: events.append("step"), device="cpu")
    assert events == ["step"]


@pytest.mark.jax
def test_jax_contenders_run_on_the_device_asked_for(monkeypatch):
    """Every JAX input is committed to the jax.Device for --device (with a CUDA JAX, JAX's default device would
    be the GPU even for a CPU run)."""
    x64 = jax.config.jax_enable_x64
    try:
        (c, _) = C.jax_contenders(device="cpu")
        assert c.available and c.device == jax.devices("cpu")[0]
        put = []
        real_put = jax.device_put
        monkeypatch.setattr(jax, "device_put", lambda x, device=None, **kw: put.append(device) or real_put(x, device))
        case = C.Case(2, 3, 4, "float32")
        case.make_arrays()
        step = c.build(case, "both")
        out, _ = step()
        assert put == [jax.devices("cpu")[0]] * 5
        assert out[0].devices() == {jax.devices("cpu")[0]}
        assert c.extra[f"{case.key},both"]["dot_precision"] == ["HIGHEST"]
    finally:
        jax.config.update("jax_enable_x64", x64)


@pytest.mark.jax
def test_jax_without_gpu_is_left_out_of_a_cuda_run_with_the_reason():
    try:
        jax.devices("gpu")
        pytest.skip("this JAX has a GPU backend")
    except RuntimeError:
        pass
    x64 = jax.config.jax_enable_x64
    try:
        cs = C.jax_contenders(device="cuda")
    finally:
        jax.config.update("jax_enable_x64", x64)
    assert [c.available for c in cs] == [False, False]
    assert all("no GPU backend" in c.reason and "jax-cuda" in c.reason for c in cs)
    dev, why = C.jax_device("cpu:1")
    assert dev is None and "only 1 cpu device" in why


# --- command line ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, where", [
    ([], ["scratch", "full"]),
    (["--threads", "1"], ["scratch", "full", "threads1"]),
    (["--update-results"], ["results"]),
    (["--update-results", "--threads", "1"], ["results", "threads1"]),
    (["--update-results", "--device", "cuda"], ["results", "cuda"]),
    (["--quick"], ["scratch", "quick"]),
    (["--sizes", "64"], ["scratch", "partial"]),
    (["--dtypes", "float32"], ["scratch", "partial"]),
    (["--no-compile"], ["scratch", "partial"]),
    (["--no-plot"], ["scratch", "partial"]),
    (["--budget", "1"], ["scratch", "partial"]),
    (["--quick", "--device", "cuda:1"], ["scratch", "quick", "cuda1"]),
])
def test_only_update_results_writes_the_committed_results(argv, where):
    assert run.parse_args(argv).out == os.path.join(ROOT, "benchmarks", *where)
    if "--update-results" not in argv:
        assert run.parse_args(argv + ["--out", "/some/where"]).out == "/some/where"


@pytest.mark.parametrize("argv", [["--quick"], ["--sizes", "64"], ["--no-sharded"], ["--budget", "1"],
                                  ["--out", "/some/where"]])
def test_update_results_refuses_a_partial_run_or_another_directory(argv, capsys):
    """The committed results are the full run's (the README's table and plot): a partial run must not replace
    them, and --out elsewhere contradicts the flag."""
    with pytest.raises(SystemExit) as info:
        run.parse_args(["--update-results"] + argv)
    assert info.value.code == 2 and "--update-results" in capsys.readouterr().err


def test_scratch_results_are_git_ignored():
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    check = subprocess.run(["git", "check-ignore", "-q", "benchmarks/scratch/quick/results.json"], cwd=ROOT)
    assert check.returncode == 0
    check = subprocess.run(["git", "check-ignore", "-q", "benchmarks/results/results.json"], cwd=ROOT)
    assert check.returncode == 1


@pytest.mark.parametrize("module, flag", [("matplotlib", "--no-plot"), ("jax", "--no-jax")])
def test_missing_optional_dependency_is_reported_before_any_work(monkeypatch, capsys, module, flag):
    monkeypatch.setitem(sys.modules, module, None)          # `import module` now raises ImportError
    monkeypatch.setattr(run, "_run", lambda *a: pytest.fail("work started before the dependency check"))
    assert run.main(["--quick", "--out", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert module.replace("jax", "JAX") in err and flag in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_run_without_cuda_is_refused_before_any_work(monkeypatch, capsys):
    monkeypatch.setattr(run, "_run", lambda *a: pytest.fail("work started before the CUDA check"))
    assert run.main(["--quick", "--no-plot", "--no-jax", "--device", "cuda", "--out", "/nonexistent"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cpu:0"])
def test_bad_device_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as info:
        run.parse_args(["--device", bad])
    assert info.value.code == 2 and "--device" in capsys.readouterr().err


@pytest.mark.compile
def test_inductor_code_of_the_op_is_the_references():
    """The evidence the report gives for the compiled-path targets (benchmarks/inductor_code.py): parsed from
    one real inductor run each, the reference's code has the six GEMMs of fwd+bwd and the fused tanh /
    tanh_backward kernels, and the code for torch_impl.attn and for attn_lab.attn is the same."""
    from benchmarks import inductor_code as IC
    ref = IC.kernels(torch_impl.attn_reference)
    assert sorted(ref["gemms"]) == ["addmm", "mm", "mm", "mm", "mm", "mm"] and ref["fused"] == 2
    assert ref["nxn_buffers"] >= 1
    for fn in (torch_impl.attn, torch.ops.attn_lab.attn):
        assert IC.same_as(IC.kernels(fn), ref)


def test_inductor_note_reports_a_difference():
    from benchmarks import batched as B
    ref = {"gemms": ["mm", "mm", "addmm", "mm", "mm", "mm"], "fused": 2, "nxn_buffers": 2}
    worse = dict(ref, gemms=ref["gemms"] + ["mm"])
    results = {"inductor_kernels": {"compiled": ref, "compiled_attn": worse, "compiled_op": ref}}
    assert "differs: 7 GEMMs" in B.inductor_note(results, "compiled_attn")
    assert "the same kernels as for the reference, 6 GEMMs" in B.inductor_note(results, "compiled_op")
    assert B.inductor_note({}, "compiled_op") == ""
    nothing = {"gemms": [], "fused": 0, "nxn_buffers": 0}        # e.g. a code format the parser does not read
    assert "differs" in B.inductor_note({"inductor_kernels": {"compiled": nothing, "compiled_op": nothing}},
                                        "compiled_op")
    broken = {"inductor_kernels": {"compiled": ref, "compiled_op": {"error": "CppCompileError: no g++"}}}
    assert "not read: CppCompileError" in B.inductor_note(broken, "compiled_op")


def test_inductor_survey_reports_a_failed_compile(monkeypatch):
    from benchmarks import inductor_code as IC

    def broken(fn, **kwargs):
        raise RuntimeError("inductor fell over")

    monkeypatch.setattr(IC, "kernels", broken)
    (compiled,) = [c for c in C.torch_contenders() if c.name == "compiled"]
    assert IC.survey([compiled]) == {"compiled": {"error": "RuntimeError: inductor fell over"}}


def test_fresh_buffer_cost_tells_cold_from_warm():
    """Each case records the allocator state it was timed in (a fresh n×n buffer: page faults or not)."""
    cost = M.fresh_buffer_cost(1 << 20)
    assert cost["bytes"] == 1 << 20 and cost["fresh_s"] > 0 and cost["reused_s"] > 0
    assert M.fresh_buffer_cost(1 << 20, device="cuda") == {}          # CUDA: the caching allocator, not probed
    cold = R.describe_fresh_buffer({"bytes": 32 << 20, "fresh_s": 0.012, "reused_s": 0.0016})
    warm = R.describe_fresh_buffer({"bytes": 32 << 20, "fresh_s": 0.0018, "reused_s": 0.0016})
    assert cold == "a fresh 32.0 MiB buffer here: 12.0 ms to first fill, 1.6 ms reused (cold: page faults)"
    assert warm.endswith("(warm: no page faults)")
    both = R.describe_fresh_buffer({"bytes": 32 << 20, "fresh_s": 0.0018, "reused_s": 0.0016, "fresh_s_before": 0.012})
    assert both == ("a fresh 32.0 MiB buffer here: 12.0 ms to first fill before the timing, 1.8 ms after, "
                    "1.6 ms reused (cold, then warm)")
    assert R.fresh_buffer_note(None) == "" and R.fresh_buffer_note({"fresh_buffer": {}}) == ""


def test_benchmark_relative_error_is_crosschecks():
    """One relative error for the project: the benchmark's accuracy column is ``crosscheck.metrics.diff``.  Before,
    benchmarks/measure.py had its own, which reported a NaN gradient as error 0.0 (``max(0.0, nan)`` is 0.0) and
    divided by nothing on a zero reference."""
    from crosscheck.metrics import diff
    g = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    ref = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    zero = torch.zeros(2, 2)
    nan = torch.full((2, 2), float("nan"))
    assert M.relative_error(((), (g, None, None)), ((), (ref, None, None))) == diff(g.numpy(), ref.numpy()).rel_err
    assert M.relative_error(((), (g, g, None)), ((), (zero, g, None))) == diff(g.numpy(), zero.numpy()).rel_err > 1e6
    assert M.relative_error(((), (nan, g, None)), ((), (ref, g, None))) == float("inf")
    assert M.relative_error(((), (None, None, None)), ((), (None, None, None))) == 0.0
