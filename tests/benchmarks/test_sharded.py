"""The sharded case of ``python -m benchmarks`` (``benchmarks/sharded.py``): its targets, report section, plot
panel and command line, on a small fake results dict (the subprocesses themselves are the standalone
``benchmarks.distributed`` / ``benchmarks.distributed_jax``; nothing is spawned here).  No timing assertions."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import report as R
from benchmarks import run
from benchmarks import sharded as S
from benchmarks.distributed_jax import BUDGET, RATIO
from tests.conftest import ROOT


def _layout(fwd=None, bwd=None, ratio=0.9, hops=None, peak=100):
    hand = {"forward": fwd or {}, "backward": bwd or {}, "collective_bytes": 0}
    if hops is not None:
        hand["hops"] = {"forward": hops[0], "backward": hops[1], "forward_bytes": 64, "backward_bytes": 128}
    return {"hand": hand, "reference": {"forward": {}, "backward": {}, "collective_bytes": 0},
            "max_abs_error_o": 0.0, "peak_bytes_rank": {"forward": peak, "fwd_bwd": 2 * peak},
            "time": {"hand_median_s": 0.01 * ratio, "reference_median_s": 0.01, "ratio_median": ratio,
                     "ratio_q1": ratio - 0.05, "ratio_q3": ratio + 0.05, "reps": 5}}


def _jax_layout(fwd=None, bwd=None, ratio=0.95, peak=150):
    return {"forward": fwd or {}, "backward": bwd or {}, "reference forward": {},
            "peak bytes per device, forward": peak, "peak bytes per device, fwd+bwd": peak,
            RATIO: [ratio, ratio - 0.04, ratio + 0.04]}


GATHER = "c10d_functional.all_gather_into_tensor"


def fake_sharded():
    """What the two subprocesses write at P=4, n=8, d=e=2 (ring bound (2·8 + 3·2·4 + 2·2·4)·4 = 224 bytes)."""
    torch_part = {"world": 4, "n": 8, "d": 2, "reps": 5, "torch": "x", "cpus": 2, "date": "today",
                  "block": {"m": 2, "n": 8, "d": 2, "e": 2, "itemsize": 4},
                  "layouts": {"replicate": _layout(ratio=0.8), "rows": _layout(), "keys": _layout(),
                              "all_shard0": _layout(fwd={GATHER: 1}, bwd={GATHER: 1}),
                              "ring": _layout(hops=(3, 5), peak=200)}}
    jax_part = {"jax": "x", "devices": 4, "n": 8, "d": 2, "e": 2, "dtype": "float32", "cpu_count": 2,
                BUDGET: {"a rows (m x n)": 64, "sum": 160},
                "layouts": {"jit rows": _jax_layout(bwd={"all-reduce": 1}),
                            "shard_map rows": _jax_layout(bwd={"all-reduce": 1}),
                            "jit all-gather": _jax_layout(fwd={"all-gather": 2}, bwd={"all-reduce": 1}),
                            "ring": _jax_layout(fwd={"collective-permute": 3}, bwd={"collective-permute": 7}),
                            "jit rows explicit": _jax_layout(bwd={"all-reduce": 1})}}
    return {"world": 4, "commands": {"torch": "-m benchmarks.distributed", "jax": "-m benchmarks.distributed_jax"},
            "seconds": {"torch": 1.0, "jax": 2.0}, "torch": torch_part, "jax": jax_part}


def _by(targets, framework, what):
    hits = [t for t in targets if t["target"].startswith(f"sharded {framework}") and what in t["target"]]
    assert len(hits) == 1, (framework, what, [t["target"] for t in targets])
    return hits[0]


def test_every_target_is_met_on_the_fake_run():
    targets = S.evaluate_targets({"sharded": fake_sharded()})
    for fw, layouts in (("torch", S.TORCH_RATIO_LAYOUTS), ("JAX", S.JAX_RATIO_LAYOUTS)):
        t = _by(targets, fw, "fwd+bwd / attn_reference ≤ 1.0 for each layout")
        assert t["met"] is True and t["limit"] == 1.0
        assert [part.rsplit(" ", 1)[0] for part in t["value"].split(", ")] == list(layouts)
    assert _by(targets, "torch", "for each layout")["value"].startswith("replicate 0.800, rows 0.900,")
    assert "replicate 0.800 (IQR 0.750–0.850)" in _by(targets, "torch", "for each layout")["detail"]
    assert _by(targets, "torch", "rows: 0 collectives")["met"] is True
    assert _by(targets, "torch", "keys: exactly its rule's collectives")["met"] is True
    ring = _by(targets, "torch", "ring: P−1 hops")
    assert ring["met"] is True and ring["value"] == "3 / 5"
    peak = _by(targets, "torch", "ring: forward peak bytes")
    assert (peak["met"], peak["value"], peak["limit"]) == (True, 200, 224)
    assert _by(targets, "JAX", "ring: P−1 hops")["value"] == "3 / 7"
    assert _by(targets, "JAX", "ring: forward peak bytes")["limit"] == 160
    # JAX rows' all-reduce in backward is by design: information, not a target
    info = _by(targets, "JAX", "rows: collectives (information")
    assert info["met"] is None and "backward 1× all-reduce" in info["detail"]


@pytest.mark.parametrize("break_it, framework, what", [
    (lambda s: s["torch"]["layouts"]["ring"]["time"].update(ratio_median=1.2), "torch", "for each layout"),
    (lambda s: s["jax"]["layouts"]["shard_map rows"][RATIO].__setitem__(0, 1.01), "JAX", "for each layout"),
    (lambda s: s["torch"]["layouts"]["rows"]["hand"]["backward"].update({GATHER: 1}), "torch", "rows: 0 coll"),
    (lambda s: s["torch"]["layouts"]["keys"]["hand"]["forward"].update({"c10d.all_reduce_": 1}), "torch",
     "keys: exactly"),
    (lambda s: s["torch"]["layouts"]["ring"]["hand"]["hops"].update(forward=4), "torch", "ring: P−1 hops"),
    (lambda s: s["torch"]["layouts"]["ring"]["hand"]["hops"].update(backward=8), "torch", "ring: P−1 hops"),
    (lambda s: s["torch"]["layouts"]["ring"]["hand"]["forward"].update({GATHER: 1}), "torch", "ring: P−1 hops"),
    (lambda s: s["torch"]["layouts"]["ring"]["peak_bytes_rank"].update(forward=225), "torch", "ring: forward peak"),
    (lambda s: s["jax"]["layouts"]["ring"]["backward"].update({"collective-permute": 8}), "JAX", "ring: P−1 hops"),
    (lambda s: s["jax"]["layouts"]["ring"]["forward"].update({"all-gather": 1}), "JAX", "ring: P−1 hops"),
    (lambda s: s["jax"]["layouts"]["ring"].update({"peak bytes per device, forward": 161}), "JAX",
     "ring: forward peak"),
])
def test_each_target_fails_when_its_figure_misses(break_it, framework, what):
    s = fake_sharded()
    break_it(s)
    assert _by(S.evaluate_targets({"sharded": s}), framework, what)["met"] is False


def test_a_missed_layout_is_named_in_bold():
    s = fake_sharded()
    s["torch"]["layouts"]["ring"]["time"].update(ratio_median=1.2)
    assert _by(S.evaluate_targets({"sharded": s}), "torch", "for each layout")["value"].endswith(
        "all_shard0 0.900, **ring 1.200**")


def test_a_failed_or_skipped_subprocess_is_reported_not_measured():
    s = fake_sharded()
    s["jax"] = {"error": "no result within 900 s (timeout)"}
    targets = S.evaluate_targets({"sharded": s})
    failed = [t for t in targets if t["target"].startswith("sharded jax")]
    assert len(failed) == 1 and failed[0]["met"] is None and "timeout" in failed[0]["detail"]
    assert any(t["target"].startswith("sharded torch") and t["met"] for t in targets)
    assert "Not measured: no result within 900 s (timeout)" in S.markdown({"sharded": s})
    s["jax"] = {"skipped": "--no-jax"}
    assert not any("jax" in t["target"].lower() for t in S.evaluate_targets({"sharded": s}))
    assert S.skipped_line({"sharded": s}) == "sharded (4 CPU ranks), JAX: --no-jax"
    left_out = {"sharded": {"skipped": "--no-sharded"}}
    assert S.evaluate_targets(left_out) == [] and S.skipped_line(left_out) == "sharded (4 CPU ranks): --no-sharded"
    assert "Left out of this run: --no-sharded." in S.markdown(left_out)


def test_report_section_has_both_tables():
    text = S.markdown({"sharded": fake_sharded()})
    assert "### torch DTensor, gloo ranks" in text and "### JAX, host-platform devices" in text
    assert "# Sharded tanh attention" not in text          # the standalone page's title is dropped
    assert "| ring: q, k, v Shard(0), the ring (P2P) | 0 / 0 |" in text
    assert "| 3 / 5 |" in text                               # the torch ring's hops
    assert "| ring | 3× collective-permute / 7× collective-permute |" in text
    assert "0.800 [0.750, 0.850]" in text                    # replicate's ratio and IQR
    assert "`python -m benchmarks.distributed` (1 s)" in text


def test_plot_panel_draws_each_layouts_ratio_with_its_iqr():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        s = fake_sharded()
        S.plot_panel(ax, s)
        heights = [p.get_height() for p in ax.patches]
        labels = [t.get_text() for t in ax.get_xticklabels()]
        lines = [c for c in ax.containers if hasattr(c, "lines") and c.lines[2]]
        (bars_err,) = lines
        segments = bars_err.lines[2][0].get_segments()        # one whisker per bar: (x, q1) → (x, q3)
    finally:
        plt.close(fig)
    expected = [s["torch"]["layouts"][n]["time"]["ratio_median"] for n in S.TORCH_RATIO_LAYOUTS] + \
               [s["jax"]["layouts"][n][RATIO][0] for n in S.JAX_RATIO_LAYOUTS]
    assert heights == pytest.approx(expected)
    assert labels[0] == "torch\nreplicate" and labels[-1] == "JAX\nring" and len(labels) == 10
    assert [(seg[0][1], seg[1][1]) for seg in segments][0] == pytest.approx((0.75, 0.85))


def test_full_plot_gets_the_sharded_panel(tmp_path, monkeypatch):
    """``report.plot`` hands the sharded section to its panel (a run without 2-D cases: the batched-only layout)."""
    seen = []
    monkeypatch.setattr(S, "plot_panel", lambda ax, sharded: seen.append((ax.get_visible(), sharded["world"])))
    results = {"meta": {"date_utc": "today", "cpu": "cpu", "cores": 2, "torch_threads": 2, "python": "3",
                        "torch": "t", "git_commit": "abc", "load_average_start": [1.0]},
               "cases": [], "contenders": {}, "sharded": fake_sharded()}
    R.plot(results, str(tmp_path / "p.png"))
    assert seen == [(True, 4)] and (tmp_path / "p.png").stat().st_size > 0
    seen.clear()
    R.plot(dict(results, sharded={"skipped": "--no-sharded"}), str(tmp_path / "q.png"))
    assert seen == []


# --- command line and the subprocesses' plumbing ----------------------------------------------------------------

@pytest.mark.parametrize("argv, skipped", [
    ([], None),
    (["--quick", "--sharded"], None),
    (["--sizes", "64", "--sharded"], None),
    (["--quick"], "left out of --quick and partial runs (--sharded adds it)"),
    (["--sizes", "64"], "left out of --quick and partial runs (--sharded adds it)"),
    (["--no-sharded"], "--no-sharded"),
    (["--device", "cuda"], "--device cuda: the sharded case runs on CPU ranks (run it without --device)"),
])
def test_which_runs_include_the_sharded_case(argv, skipped):
    assert run.parse_args(argv).sharded_skipped == skipped


def test_no_sharded_makes_a_partial_run(capsys):
    assert run.parse_args(["--no-sharded"]).out == os.path.join(ROOT, "benchmarks", "scratch", "partial")
    with pytest.raises(SystemExit):
        run.parse_args(["--sharded", "--no-sharded"])
    assert "contradict" in capsys.readouterr().err


def test_commands_run_the_standalone_modules():
    full = S.commands("/o", quick=False, jax=True)
    assert full["torch"][1:] == ["-m", "benchmarks.distributed", "--world", "4", "--out", "/o"]
    assert full["jax"][1:] == ["-m", "benchmarks.distributed_jax", "--devices", "4", "--out", "/o/distributed_jax.json"]
    quick = S.commands("/o", quick=True, jax=False)
    assert list(quick) == ["torch"] and quick["torch"][-4:] == ["--n", "256", "--reps", "3"]


def test_run_folds_in_the_files_the_subprocesses_write(tmp_path, monkeypatch):
    fake = fake_sharded()
    calls = []

    def fake_run_one(cmd, timeout_s, cwd):
        calls.append((cmd[2], timeout_s, cwd))
        if cmd[2] == "benchmarks.distributed_jax":
            return {"error": "exit status 1 (its output is above)", "seconds": 0.5}
        with open(os.path.join(cwd, cmd[cmd.index("--out") + 1], "distributed.json"), "w") as f:   # cwd: the repo
            json.dump(fake["torch"], f)
        return {"seconds": 3.0}

    (tmp_path / "distributed_jax.json").write_text(json.dumps(fake["jax"]))    # an older run's file: not used
    monkeypatch.setattr(S, "run_one", fake_run_one)
    out = S.run(str(tmp_path), quick=False, jax=True, repo=str(tmp_path.parent))
    assert [c[0] for c in calls] == ["benchmarks.distributed", "benchmarks.distributed_jax"]
    assert [c[1] for c in calls] == [S.TIMEOUT_S["torch"], S.TIMEOUT_S["jax"]]
    assert out["torch"] == fake["torch"] and out["jax"] == {"error": "exit status 1 (its output is above)"}
    assert out["seconds"] == {"torch": 3.0, "jax": 0.5}
    assert out["commands"]["torch"] == f"-m benchmarks.distributed --world 4 --out {tmp_path.name}"
    assert not (tmp_path / "distributed_jax.json").exists()
    json.dumps(out)                               # plain data, as results.json stores it


def test_jax_collective_bytes_read_from_the_hlo():
    from benchmarks.distributed_jax import collective_bytes

    hlo = """
  %all-gather.1 = f32[64,8]{1,0} all-gather(%param.2), channel_id=2, dimensions={0}
  %ppermute.9 = f32[16,16]{1,0} collective-permute(%concatenate.9), channel_id=1
  %all-reduce = (f32[64,8]{1,0}, f64[4]{0}) all-reduce(%a, %b), channel_id=3
  %fusion = f32[16,8]{1,0} fusion(%all-gather.1), kind=kCustom
"""
    # an all-gather brings (P-1)/P of its output; the others their whole output (a tuple: every element)
    assert collective_bytes(hlo, 4) == 64 * 8 * 4 * 3 // 4 + 16 * 16 * 4 + (64 * 8 * 4 + 4 * 8)
    assert collective_bytes("  %f = f32[2]{0} fusion(%x)\n", 4) == 0
    async_op = "  %cp = (f32[4]{0}, f32[4]{0}, u32[], u32[]) collective-permute-start(%x)\n"
    assert collective_bytes(async_op, 4) is None           # not readable: no figure rather than a wrong one


# --- benchmarks.ab: this tree against another commit, run by run ----------------------------------------------------

def test_ab_says_slower_or_faster_only_when_the_runs_do_not_overlap():
    from benchmarks.ab import verdict
    assert verdict([0.80, 0.82], [0.70, 0.79]) == "slower"
    assert verdict([0.70, 0.72], [0.73, 0.80]) == "faster"
    assert verdict([0.75, 0.80], [0.70, 0.76]) == "within spread"        # 0.75 below REV's 0.76
    assert verdict([0.70, 0.80], [0.80, 0.90]) == "within spread"        # a tie at 0.80 is no difference


def test_ab_reads_each_layouts_ratio_from_the_committed_results():
    from benchmarks.ab import jax_ratios, torch_ratios
    results = os.path.join(ROOT, "benchmarks", "results")
    with open(os.path.join(results, "distributed_jax.json")) as f:
        jax_ratios_ = jax_ratios(json.load(f))
    with open(os.path.join(results, "distributed.json")) as f:
        torch_ratios_ = torch_ratios(json.load(f))
    assert set(jax_ratios_) == set(S.JAX_RATIO_LAYOUTS) and set(torch_ratios_) == set(S.TORCH_RATIO_LAYOUTS)
    assert all(0 < r < 3 for r in [*jax_ratios_.values(), *torch_ratios_.values()])
    no_time = {"forward": {}, "backward": {}}                     # a layout measured for collectives only
    assert jax_ratios({"layouts": {"ring": _jax_layout(ratio=0.9), "counted": no_time}}) == {"ring": 0.9}
    assert torch_ratios({"layouts": {"rows": _layout(ratio=0.8), "counted": no_time}}) == {"rows": 0.8}


def test_ab_table_compares_the_layouts_every_run_measured():
    from benchmarks.ab import table_of
    sides = {"here": [{"rows": 0.9, "ring": 0.8}, {"rows": 0.91, "ring": 0.82}],
             "rev": [{"rows": 0.7, "ring": 0.81, "old": 1.0}, {"rows": 0.72, "ring": 0.79, "old": 1.1}]}
    table = table_of(sides)
    assert table["rows"] == {"here": [0.9, 0.91], "rev": [0.7, 0.72], "verdict": "slower"}
    assert table["ring"]["verdict"] == "within spread"
    assert table["old"] == {"here": [], "rev": [1.0, 1.1], "verdict": "not compared (missing in some runs)"}


def test_ab_states_its_false_alarm_rate():
    from benchmarks.ab import false_alarm, render
    assert false_alarm(3) == 1 / 20 and false_alarm(4) == 1 / 70
    text = render("abc123", 4, {"jax": {"ring": {"here": [0.9], "rev": [0.8], "verdict": "slower"}}})
    assert "| jax | ring | 0.900 | 0.800 | slower |" in text and "by chance 1.4% of the time per layout" in text


@pytest.mark.parametrize("argv, message", [
    (["HEAD", "--frameworks", "jax,mxnet"], "--frameworks takes jax, torch (got mxnet)"),
    (["HEAD", "--runs", "2"], "--runs must be at least 3: with 2 a side, unchanged code reads 'slower' or 'faster' "
                              "33% of the time"),
    (["no-such-commit"], "REV 'no-such-commit' is not a commit of this repository"),
])
def test_ab_refuses_bad_arguments_before_any_run(argv, message, capsys, monkeypatch):
    from benchmarks import ab
    monkeypatch.setattr(ab, "compare", lambda *a: pytest.fail("ran"))
    with pytest.raises(SystemExit) as e:
        ab.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
