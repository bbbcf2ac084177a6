"""The batched cases of the benchmark (``benchmarks/batched.py``) run end to end: every contender is timed and
checked against the 3-D reference, the memory probe counts (B, n, n) stacks, and the report has the section.
Never a timing assertion (the machine is shared)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from benchmarks import batched as B
from benchmarks import run
from tests.conftest import optional_jax

jax = optional_jax()   # without JAX (a torch-only install) its contenders are reported n/a; in CI it must import


@pytest.fixture(scope="module")
def batched_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_batched")
    x64 = jax.config.jax_enable_x64 if jax is not None else None
    try:
        code = run.main(["--sizes", "", "--batched", "2x256", "--budget", "0.02", "--no-plot", "--no-compile",
                         "--out", str(out)])
    finally:
        if jax is not None:
            jax.config.update("jax_enable_x64", x64)
        torch.compiler.reset()
    import json
    with open(out / "results.json") as f:
        return code, json.load(f), (out / "report.md").read_text()


def test_batched_contenders_are_timed_and_agree_with_the_3d_reference(batched_run):
    code, res, report = batched_run
    assert code == 0 and res["cases"] == []
    (case,) = res["batched"]["cases"]
    assert (case["batch"], case["n"], case["d"], case["e"]) == (2, 256, 64, 64)
    live = [n for n, c in res["batched"]["contenders"].items() if c["available"]]
    assert {"attn", "reference", "op", "loop"} <= set(live)
    assert res["batched"]["contenders"]["attn"]["label"] == "torch.vmap(torch_impl.attn)"
    for mode in ("both", "o", "a"):
        assert set(case["time"][mode]) == set(live)
        for name in live:
            assert case["rel_error"][mode][name] < 1e-5, (mode, name)
    assert not case.get("errors")
    # one (B, n, n) stack in backward for the batched path (a stack of 512 KiB: in place, IN_PLACE_FROM_BYTES),
    # three for the 3-D reference (both gradients) and for the operator, whose vmap rule runs the formulas' aten ops
    # (torch_impl.ops._vmap_rule)
    assert case["memory"]["attn"]["both"]["nxn_allocs_backward"] == 1
    assert case["memory"]["op"]["both"]["nxn_allocs_backward"] == 3
    assert case["memory"]["reference"]["both"]["nxn_allocs_backward"] == 3
    assert case["fresh_buffer"]["bytes"] == 2 * 256 * 256 * 4         # the allocator state of the timing: one stack
    assert case["fresh_buffer"]["fresh_s_before"] > 0 and case["fresh_buffer"]["fresh_s"] > 0
    assert "## Batched cases" in report and "torch.vmap(torch_impl.attn)" in report


def test_batched_targets_are_reported(batched_run):
    _, res, report = batched_run
    targets = {t["target"]: t for t in res["targets_compile_batched"]}
    compile_target = next(t for name, t in targets.items() if "torch.compile(attn)" in name)
    assert compile_target["met"] is None            # n=4096 was not run
    assert "### Targets: torch.compile and batched (vmap) attention" in report


def test_parse():
    assert B.parse("8x1024, 32x256") == [(8, 1024), (32, 256)]
    assert B.parse("none") == [] and B.parse("") == []
    with pytest.raises(ValueError, match="BxN"):
        B.parse("8x1024x3")


def test_plot_has_a_panel_for_the_batched_cases(batched_run, tmp_path):
    """results.png gets one bar per (case, contender other than the 3-D reference) in its batched panel."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from benchmarks import report as R
    _, res, _ = batched_run
    fig, ax = plt.subplots()
    R._plot_batched(ax, res["batched"])
    (case,) = res["batched"]["cases"]
    bars = [c for c in ax.containers if isinstance(c, matplotlib.container.BarContainer)]
    want = [res["batched"]["contenders"][n]["label"] for n in case["ratio_to_reference"]["both"] if n != "reference"]
    assert sorted(c.get_label() for c in bars) == sorted(want) and all(len(c) == 1 for c in bars)
    plt.close(fig)
    shown = []
    real_savefig = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        shown.extend(a.get_title() for a in fig.axes if a.get_visible())
        return real_savefig(fig, *args, **kwargs)

    with mock.patch.object(matplotlib.figure.Figure, "savefig", savefig):
        R.plot(res, str(tmp_path / "results.png"))      # the whole figure, with no 2-D case at all
    assert (tmp_path / "results.png").stat().st_size > 10_000
    assert len(shown) == 1 and shown[0].startswith("batched:")   # no empty 2-D panel titled "None: ..."
