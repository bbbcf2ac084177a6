"""``scripts/roofline.py``: the per-kernel roofline model (a model of an H100 SXM, not a measurement) — its FLOP
counts are docs/kernels.md's per path, its bounds behave as a roofline does, and the roofline table in
docs/kernels.md is the script's output.  Pure arithmetic: no torch, no JAX."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("roofline", ROOT / "scripts" / "roofline.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)

N, D = 4096, 128


def _path_flops(path: str, n: int, d: int, e: int, **kw) -> float:
    return sum(R.work(k, n, d, e, "bf16", **kw).flops for k in R.PATHS[path])


def test_path_flops_are_the_docs_counts():
    """o-only 4n²d + 14n²d, the fused lab op 4n²d + 10n²d (two-kernel backward) at d = e; the forwards 4n²d."""
    n2d = N * N * D
    assert _path_flops("o-only fwd+bwd", N, D, D) == 18 * n2d
    assert _path_flops("fused lab op fwd+bwd", N, D, D) == 14 * n2d
    assert R.work("o_forward", N, D, D, "bf16").flops == R.work("fused_forward", N, D, D, "bf16").flops == 4 * n2d
    # d != e: the forward is 2n²d + 2n²e
    assert R.work("o_forward", 10, 3, 5, "bf16").flops == 2 * 100 * 3 + 2 * 100 * 5


def test_causal_visits_the_lower_triangle():
    full, causal = (R.work("o_dkdv", 8, 4, 4, "bf16", causal=c) for c in (False, True))
    assert causal.flops == full.flops * (8 * 9 / 2) / 64 and causal.mufu == 8 * 9 / 2
    assert causal.hbm_bytes == full.hbm_bytes                # q, k, v, g_o, g_k, g_v: whole


def test_mufu_follows_where_tanh_runs():
    """One MUFU op per score where the hardware tanh runs (16-bit), two for the exact tanh, none in the kernels
    that read the saved A."""
    for kernel in ("o_forward", "o_dkdv", "o_dq", "o_jvp", "fused_forward"):
        assert R.work(kernel, N, D, D, "bf16").mufu == N * N
        assert R.work(kernel, N, D, D, "fp32").mufu == 2 * N * N
    assert R.work("fused_dkdv", N, D, D, "bf16").mufu == R.work("fused_dq", N, D, D, "bf16").mufu == 0


def test_the_bound_is_the_largest_time():
    fwd = R.model(R.work("fused_forward", N, D, D, "bf16"), "bf16")     # 256 FLOP/byte < the ridge: memory
    assert fwd["bound"] == "memory" and fwd["time"] == fwd["memory"] > fwd["compute"]
    o = R.model(R.work("o_forward", N, D, D, "bf16"), "bf16")
    assert o["bound"] == "compute" and o["time"] == max(o["compute"], o["memory"], o["mufu"])
    # float32 (FFMA, 67 TFLOP/s) is 14.8x slower in compute than bf16's tensor cores
    assert R.model(R.work("o_forward", N, D, D, "fp32"), "fp32")["compute"] / o["compute"] == pytest.approx(14.79, 0.01)
    # a G_A given doubles the n x n reads of each backward kernel
    assert R.work("fused_dq", N, D, D, "bf16", ga=True).hbm_bytes - R.work("fused_dq", N, D, D, "bf16").hbm_bytes \
        == N * N * 2


def _model_us(path: str, n: int, ga: bool = False) -> float:
    return sum(R.model(R.work(k, n, D, D, "bf16", ga=ga), "bf16")["time"] for k in R.PATHS[path]) * 1e6


def _fmt(us: float) -> str:
    """The docs' rounding: µs below 100 as an integer, ms below 10 to 2 decimals, else an integer of ms."""
    return f"{us:.0f} µs" if us < 100 else f"{us / 1e3:.2f} ms" if us < 1e4 else f"{us / 1e3:.0f} ms"


def test_the_docs_roofline_table_is_the_scripts():
    docs = (ROOT / "docs" / "kernels.md").read_text(encoding="utf-8")
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| [^|]+ \| ([^|]+ \| [^|]+) \|", docs, re.M)}
    for n in (4096, 16384, 131072):
        fused = f"{_fmt(_model_us('fused lab op fwd+bwd', n))} / {_fmt(_model_us('fused lab op fwd+bwd', n, True))}"
        assert rows[n] == f"{fused} | {_fmt(_model_us('o-only fwd+bwd', n))}", (n, rows.get(n))


def test_the_script_prints_a_labelled_model(capsys):
    assert R.main(["--n", "1024", "--dtype", "fp16", "--causal"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Roofline model (not measured), H100 SXM, fp16, n = 1024") and "causal" in out
    assert all(f"| {k} |" in out for k in R.KERNELS) and "o-only fwd+bwd:" in out
