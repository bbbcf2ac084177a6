"""``python -m benchmarks.gpu_kernels`` (the GPU kernel benchmark of issue 30) on this GPU-less machine: the quick
run's JSON and report, the contenders that need CUDA reported "not run: <reason>", the FLOP counts of
docs/kernels.md, the ratios (paired within a timing group, unpaired across), the targets, out-of-memory caught
and recorded as "OOM" (faked here), the time budget, and the output directories.  Nothing is timed against a
bound: the targets are reported by the benchmark, never asserted."""

import json

import pytest

torch = pytest.importorskip("torch")

from benchmarks import gpu_kernels as G  # noqa: E402

from tests.conftest import ROOT, require_jax  # noqa: E402

REGULAR = {s.name for s in G.SPECS}
LONG = {s.name for s in G.SPECS if s.long_case}
NEED_GPU = {"lab_fused", "o_triton", "sdpa_flash", "lab_pallas", "o_pallas"}
RUNS_ON_CPU = {"lab_aten", "o_aten", "lab_jit", "o_jit"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the quick run's CPU statuses do not apply")
    require_jax()
    out = tmp_path_factory.mktemp("gpu_kernels")
    assert G.main(["--quick", "--out", str(out)]) == 0
    return json.loads((out / "gpu_kernels.json").read_text()), (out / "gpu_kernels.md").read_text()


def test_quick_run_json_structure(quick):
    res, _ = quick
    assert {"meta", "cases", "targets", "notes"} <= set(res)
    assert res["meta"]["device"] == "cpu" and res["meta"]["quick"] is True and res["meta"]["flops_rule"]
    keys = [(c["dtype"], c["n"], c["bh"]) for c in res["cases"]]
    assert keys == [("bfloat16", 32, 2), ("bfloat16", 128, 1), ("float32", 32, 2), ("float32", 128, 1)]
    for case in res["cases"]:
        assert set(case["results"]) == (LONG if case["long"] else REGULAR)
        for name, modes in case["results"].items():
            assert set(modes) == {"fwd", "fwd+bwd"}
            for mode, r in modes.items():
                if name in NEED_GPU or name.endswith("_compile"):
                    assert r["status"].startswith("not run: ") and len(r["status"]) > len("not run: ") + 10
                    assert "median_s" not in r
                else:
                    assert name in RUNS_ON_CPU
                    assert r["status"] == "ok", (name, mode, r["status"])
                    assert r["median_s"] > 0 and r["reps"] >= 2 and len(r["samples"]) == r["reps"]
                    assert r["tflops"] == pytest.approx(r["flops"] / r["median_s"] / 1e12)
                    assert r["first_call_s"] > 0
    lab_status = res["cases"][0]["results"]["lab_fused"]["fwd"]["status"]
    assert "CUDA" in lab_status
    assert "CUDA" in res["cases"][0]["results"]["sdpa_flash"]["fwd+bwd"]["status"]
    status = res["cases"][0]["results"]["o_pallas"]["fwd"]["status"]
    assert "GPU backend" in status or "needs JAX >=" in status, status      # a JAX older than the kernels' MIN_JAX
    assert "--quick" in res["cases"][0]["results"]["lab_compile"]["fwd"]["status"]
    # JAX's memory comes from XLA's analysis, torch's is CUDA-only
    jit = res["cases"][0]["results"]["lab_jit"]["fwd+bwd"]
    assert jit["peak_source"].startswith("XLA") and jit["peak_bytes"] is not None
    assert res["cases"][0]["results"]["lab_aten"]["fwd+bwd"]["peak_bytes"] is None


def test_quick_run_flop_counts_in_the_json(quick):
    res, _ = quick
    case = res["cases"][0]
    n, d, bh = case["n"], case["d"], case["bh"]
    r = case["results"]
    assert r["lab_aten"]["fwd"]["flops"] == 4 * n * n * d * bh
    assert r["lab_aten"]["fwd+bwd"]["flops"] == 12 * n * n * d * bh
    assert r["o_triton"]["fwd+bwd"]["flops"] == 18 * n * n * d * bh        # its recomputing backward
    assert r["o_aten"]["fwd+bwd"]["flops"] == 12 * n * n * d * bh          # the composite's autograd backward
    assert r["sdpa_flash"]["fwd+bwd"]["flops"] == 14 * n * n * d * bh


def test_quick_run_report(quick):
    res, md = quick
    for name in REGULAR:
        assert f"| {name} |" in md
    assert "Targets (issue 30)" in md and "not measured" in md
    assert "not run: needs CUDA" in md
    # on CPU no target can be decided: nothing claims "met"
    assert all(m["met"] is None for t in res["targets"] for m in t["measured"])
    assert " met" not in md.replace("not met", "")


def test_flop_counts_follow_docs_kernels_md():
    n, d, bh = 1024, 128, 16
    for algo in ("lab", "o_only", "sdpa"):
        assert G.flops(algo, "fwd", n, d, d, bh) == 4 * n * n * d * bh
        assert G.flops(algo, "fwd+bwd", n, d, d, bh) == G.flops(algo, "fwd", n, d, d, bh) + G.flops(
            algo, "bwd", n, d, d, bh)
    assert G.flops("lab", "bwd", n, d, d, bh) == 8 * n * n * d * bh
    assert G.flops("o_only", "bwd", n, d, d, bh) == 14 * n * n * d * bh
    assert G.flops("sdpa", "bwd", n, d, d, bh) == 10 * n * n * d * bh
    docs = (ROOT / "docs" / "kernels.md").read_text()
    assert "4n²d + 14n²d = 18n²d" in docs and "| 3 (5) passes | 4n²d + 10n²d = 14n²d |" in docs
    # the lab op's count is a single pass's (8n²d backward); its fused two-kernel backward does 10n²d
    assert "a single pass would be 8n²d" in docs and "8n²d·BH for the lab's op, a single pass's count" in docs
    # d ≠ e: the forward is (1) 2n²d plus (3) 2n²e; the o-only backward 4 GEMMs of d and 3 of e... per docs
    assert G.flops("lab", "fwd", 10, 3, 5, 1) == 2 * 100 * 3 + 2 * 100 * 5
    assert G.flops("o_only", "bwd", 10, 3, 5, 1) == 100 * (8 * 3 + 6 * 5)


def _r(samples, group="torch0"):
    return {"status": "ok", "samples": samples, "group": group}


def test_ratios_paired_within_a_group_unpaired_across():
    num, den = [2.0, 3.0, 10.0], [1.0, 3.0, 2.0]          # per-repetition ratios 2, 1, 5 -> median 2
    paired = G.ratio(_r(num), _r(den))
    assert paired["paired"] is True and paired["median"] == pytest.approx(2.0)
    unpaired = G.ratio(_r(num, "jax0"), _r(den, "torch0"))   # median(num) 3 / median(den) 2
    assert unpaired["paired"] is False and unpaired["median"] == pytest.approx(1.5)
    assert G.ratio({"status": "OOM"}, _r(den)) is None
    assert G.ratio(_r(num), {"status": "not run: x"}) is None


def _case(dtype, n, bh, times, long=False):
    case = G.make_case(dtype, n, bh, 128, long)
    for name, (status, t) in times.items():
        case["results"][name] = {m: ({"status": status} if status != "ok" else _r([t, t, t]))
                                 for m in G.MODES}
    case["ratios"] = G.case_ratios(case)
    return case


def test_case_ratios_and_targets():
    sizes = G.FULL_SIZES
    ok = lambda t: ("ok", t)  # noqa: E731
    cases = [_case("bfloat16", 4096, 16, {"lab_fused": ok(1.0), "lab_aten": ok(2.0), "o_triton": ok(1.2),
                                          "sdpa_flash": ok(1.0), "lab_pallas": ("not run: no GPU", 0)}),
             _case("bfloat16", 16384, 16, {"lab_fused": ok(1.0), "lab_aten": ok(1.5), "o_triton": ok(1.3),
                                           "sdpa_flash": ok(1.0)}),
             _case("bfloat16", 131072, 1, {"o_triton": ok(1.0), "o_aten": ("OOM", 0)}, long=True),
             _case("float32", 131072, 1, {"o_triton": ok(1.0), "o_aten": ok(9.0)}, long=True)]
    r = {(x["name"], x["mode"]): x for x in cases[0]["ratios"]}
    assert r[("lab: ATen unfused / Triton fused", "fwd+bwd")]["median"] == pytest.approx(2.0)
    assert r[("o-only: Triton / SDPA flash", "fwd")]["median"] == pytest.approx(1.2)
    assert "lab_pallas: not run: no GPU" in r[("lab: Pallas / Triton", "fwd")]["why_not"]
    assert ("lab: torch.compile / Triton fused", "fwd") not in r     # a contender the case lacks: no entry
    speed = next(x for x in G.targets(cases, sizes) if x["ratio"] == "lab: ATen unfused / Triton fused")
    assert [(m["n"], m["ratio"], m["met"]) for m in speed["measured"]] == [(4096, 2.0, True), (16384, 1.5, False)]
    sdpa = next(x for x in G.targets(cases, sizes) if x["ratio"] == "o-only: Triton / SDPA flash")
    assert [(m["n"], m["met"]) for m in sdpa["measured"]] == [(1024, None), (4096, True), (16384, False),
                                                               (131072, None)]
    long = next(x for x in G.targets(cases, sizes) if x["ratio"] is None)
    assert [(m["dtype"], m["met"]) for m in long["measured"]] == [("bfloat16", True), ("float32", False)]


def test_is_oom_recognises_torch_and_xla():
    assert G.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB"))
    assert G.is_oom(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68719476736 bytes."))
    assert not G.is_oom(RuntimeError("No available kernel. Aborting execution."))
    assert G._failure(ValueError("bad\nmore")) == "error: ValueError: bad"


def _fake_specs(monkeypatch, oom_on_call):
    """o_triton runs (on ATen's attn_o, standing in for the kernel), o_aten runs out of memory on call number
    ``oom_on_call`` (1: its first call; 3: while being timed), sdpa_flash raises another error."""
    calls = {"n": 0}

    def oom_build(env, case, mode, cache):
        def step():
            calls["n"] += 1
            if calls["n"] >= oom_on_call:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB (faked)")
            return torch.ones(1)
        return step

    def broken_build(env, case, mode, cache):
        raise RuntimeError("No available kernel. Aborting execution.")

    specs = {s.name: s for s in G.TORCH_SPECS}
    monkeypatch.setattr(specs["o_triton"], "unavailable", lambda env, case: "")
    monkeypatch.setattr(specs["o_triton"], "build", G._eager_build(
        lambda q, k, v: __import__("torch_impl").attn_o(q, k, v), "o"))
    monkeypatch.setattr(specs["o_aten"], "build", oom_build)
    monkeypatch.setattr(specs["sdpa_flash"], "unavailable", lambda env, case: "")
    monkeypatch.setattr(specs["sdpa_flash"], "build", broken_build)
    return [specs[n] for n in ("o_triton", "o_aten", "sdpa_flash")]


@pytest.mark.parametrize("oom_on_call", [1, 3], ids=["first-call", "while-timing"])
def test_out_of_memory_is_recorded_and_the_run_goes_on(monkeypatch, oom_on_call):
    specs = _fake_specs(monkeypatch, oom_on_call)
    env = G.Env(device="cpu", quick=True, compile=False, jax_why="--no-jax")
    case = G.make_case("bfloat16", 64, 1, 16, True)
    timing = G.Timing(budget_s=0.0, min_reps=2, max_reps=2, sample_s=0.0)
    G.run_case(case, specs, env, timing, deadline=float("inf"), framework="torch")
    res = case["results"]
    assert res["sdpa_flash"]["fwd"]["status"] == "error: RuntimeError: No available kernel. Aborting execution."
    assert all(res["o_triton"][m]["status"] == "ok" and res["o_triton"][m]["median_s"] > 0 for m in G.MODES)
    st = res["o_aten"]["fwd"]["status"]
    assert st == ("OOM" if oom_on_call == 1 else "OOM: while timing")
    assert "torch_inputs" not in case                         # inputs released with the case
    case["ratios"] = G.case_ratios(case)
    targets = G.targets([case], {"ns": (), "long": (64, 1)})
    long = next(t for t in targets if t["ratio"] is None)["measured"]
    assert long[0] == {"dtype": "bfloat16", "n": 64, "o_triton": "ok",
                       "o_aten": "OOM" if oom_on_call == 1 else "OOM: while timing", "met": True}


def test_budget_spent_skips_what_is_left(tmp_path):
    assert G.main(["--quick", "--no-jax", "--budget-s", "0", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu_kernels.json").read_text())
    statuses = {r["status"] for c in res["cases"] for m in c["results"].values() for r in m.values()}
    assert not any(s == "ok" for s in statuses)
    assert any(s.startswith("skipped: over the torch phase's time budget") for s in statuses)
    assert "--no-jax" in " ".join(statuses)
    assert any("--budget-s" in n for n in res["notes"])


def test_output_directories_follow_the_update_results_convention():
    default = G.parse_args(["--quick", "--device", "cpu"])
    assert default.out == str(ROOT / "benchmarks" / "scratch" / "gpu_kernels" / "quick")
    assert G.parse_args(["--device", "cpu"]).out == str(ROOT / "benchmarks" / "scratch" / "gpu_kernels")
    assert G.parse_args(["--out", "x", "--device", "cpu"]).out == "x"
    for bad in (["--update-results", "--quick"], ["--update-results", "--device", "cpu"],
                ["--update-results", "--out", "x"]):
        with pytest.raises(SystemExit):
            G.parse_args(bad)
