"""The benchmark plot is readable: rendered (matplotlib, Agg) from synthetic results shaped like a full run's, no
two tick labels of a panel print over each other, and no two lines of a panel share (nearly) one colour.  No
benchmark runs here."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from benchmarks import report as R  # noqa: E402
from benchmarks import run  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.benchmarks.test_sharded import fake_sharded  # noqa: E402

# every contender a full run has, with its label as the run writes it (benchmarks/contenders.py)
LABELS = {
    "attn": "torch_impl.attn", "reference": "attn_reference eager (autograd)",
    "bare_function": "a bare new-style autograd.Function, the same products",
    "compiled": "torch.compile(attn_reference)", "compiled_attn": "torch.compile(torch_impl.attn)",
    "compiled_op": "torch.compile(torch.ops.attn_lab.attn)", "op": "torch.ops.attn_lab.attn",
    "gemm_floor": "GEMM floor (the 6 matmuls, fresh outputs)", "gemm_floor_prealloc": "GEMM floor, preallocated outputs",
    "eager_floor": "eager floor (GEMM floor + ATen's tanh_ and tanh_backward, one fresh n×n)",
    "jax_attn": "jax.jit(jax.vjp(jax_impl.attn)) custom_vjp",
    "jax_reference": "jax.jit(jax.vjp(jax_impl.attn_reference)) autodiff",
}
BATCHED = {"attn": "torch.vmap(torch_impl.attn)", "reference": "3-D reference", "compiled": "torch.compile(3-D reference)",
           "op": "torch.vmap(torch.ops.attn_lab.attn)", "loop": "Python loop of torch_impl.attn over the batch",
           "jax_attn": "jax.jit(jax.vjp(jax.vmap(jax_impl.attn))) custom_vjp",
           "jax_reference": "jax.jit(jax.vjp(jax.vmap(jax_impl.attn_reference))) autodiff"}
TORCH = ("attn", "reference", "bare_function", "compiled", "op")


def _ratio(rng):
    m = float(rng.uniform(0.2, 3.0))
    return {"median": m, "q1": m * 0.9, "q3": m * 1.1}


def synthetic_results(sizes=run.DEFAULT_SIZES, dtypes=("float32", "float64"), seed=0) -> dict:
    """A results dict with every panel a full run draws: ratios of every contender in every mode and case,
    memory of the torch contenders, the batched cases and the sharded case."""
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in dtypes:
        for n, d, e in run.parse_sizes(sizes):
            item = 4 if dtype == "float32" else 8
            mem = {name: {"saved": {"bytes": int(rng.integers(1, 4)) * n * n * item},
                          "both": {"peak_bytes": int(rng.integers(1, 10)) * n * n * item, "nxn_allocs_backward": 1}}
                   for name in TORCH}
            cases.append({"n": n, "d": d, "e": e, "dtype": dtype, "key": f"n={n},d={d},e={e},{dtype}",
                          "ratio_to_reference": {m: {name: _ratio(rng) for name in LABELS} for m in ("both", "o", "a")},
                          "memory": mem})
    batched = {"contenders": {k: {"label": v} for k, v in BATCHED.items()},
               "cases": [{"batch": b, "n": n, "d": 64, "dtype": "float32",
                          "ratio_to_reference": {"both": {k: _ratio(rng) for k in BATCHED}}}
                         for b, n in ((8, 1024), (32, 256))]}
    meta = {"date_utc": "today", "cpu": "a CPU", "cores": 2, "torch_threads": 2, "python": "3", "torch": "2",
            "git_commit": "abc", "load_average_start": [0.1], "load_average_end": [0.1], "device": "cpu"}
    return {"meta": meta, "cases": cases, "contenders": {k: {"label": v} for k, v in LABELS.items()},
            "batched": batched, "sharded": fake_sharded()}


def _committed():
    return json.loads((ROOT / "benchmarks/results/results.json").read_text(encoding="utf-8"))


RESULTS = {"synthetic full run": synthetic_results,
           "synthetic, 12 sizes, one dtype": lambda: synthetic_results(
               sizes="2x3x4,16,32,64,128,256,512,1024,2048,4096,8192,2048x256x256", dtypes=("float32",)),
           "committed run": _committed}


@pytest.fixture(scope="module", params=list(RESULTS))
def fig(request):
    import matplotlib.pyplot as plt
    fig = R.figure(RESULTS[request.param]())
    fig.canvas.draw()
    yield fig
    plt.close(fig)


def _labels_overlapping(labels, renderer):
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_visible() and t.get_text()]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def test_no_tick_labels_print_over_each_other(fig):
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not (ax.get_visible() and ax.axison):
            continue
        for which, labels in (("x", ax.get_xticklabels()), ("y", ax.get_yticklabels())):
            clash = _labels_overlapping(labels, renderer)
            assert not clash, (ax.get_title(), which, clash)
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert len(shown) >= min(2, len(ax.get_xticks())), ax.get_title()   # thinned, not emptied


def _lab(color):
    """CIELAB (D65) of a matplotlib colour: distances there are what an eye tells apart."""
    rgb = np.array(matplotlib.colors.to_rgb(color))
    rgb = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb
    f = lambda t: np.where(t > 0.008856, np.cbrt(t), 7.787 * t + 16 / 116)   # noqa: E731
    fx, fy, fz = f(xyz / np.array([0.95047, 1.0, 1.08883]))
    return np.array([116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)])


MIN_DISTANCE = 20      # CIE76 ΔE: tab:blue against the next-closest blue of the palette is ~29; identical is 0


def _drawn(ax):
    """(label, colour, line style, marker) of each labelled line or bar series of a panel."""
    out = []
    for handle, label in zip(*ax.get_legend_handles_labels()):
        if isinstance(handle, matplotlib.container.ErrorbarContainer):
            line = handle.lines[0]
            out.append((label, line.get_color(), line.get_linestyle(), line.get_marker()))
        elif isinstance(handle, matplotlib.lines.Line2D):
            out.append((label, handle.get_color(), handle.get_linestyle(), handle.get_marker()))
        elif isinstance(handle, matplotlib.container.BarContainer):
            out.append((label, handle.patches[0].get_facecolor(), "bar", None))
    return out


def test_lines_of_a_panel_have_distinct_colours_and_styles(fig):
    panels = 0
    for ax in fig.axes:
        drawn = _drawn(ax)
        if len(drawn) < 2:
            continue
        panels += 1
        for (la, ca, sa, ma), (lb, cb, sb, mb) in itertools.combinations(drawn, 2):
            distance = float(np.linalg.norm(_lab(ca) - _lab(cb)))
            assert distance >= MIN_DISTANCE, (ax.get_title(), la, lb, round(distance, 1))
            if "bar" not in (sa, sb):
                assert (sa, ma) != (sb, mb), (ax.get_title(), la, lb, sa, ma)
    assert panels >= 4          # two ratio panels, memory, batched


def test_every_contender_has_its_own_style():
    styles = list(R.STYLES.values())
    assert len({s[2] for s in styles}) == len(styles)            # one marker each
    for (a, sa), (b, sb) in itertools.combinations(R.STYLES.items(), 2):
        assert np.linalg.norm(_lab(sa[0]) - _lab(sb[0])) >= MIN_DISTANCE, (a, b)
    assert set(LABELS) | set(BATCHED) <= set(R.STYLES)


def test_a_warning_is_drawn_on_the_plot():
    import matplotlib.pyplot as plt
    results = synthetic_results(sizes="64", dtypes=("float32",))
    results["meta"]["warnings"] = ["at the start, the machine is loaded"]
    fig = R.figure(results)
    try:
        assert any("WARNING: at the start, the machine is loaded" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)
