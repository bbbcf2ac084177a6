"""``torch_impl.attn_o``'s memory as a user's process sees it: peak RSS, not only tensor bytes (issue 37).

The blocked ATen backward used to build each tile's terms as new tensors of varied sizes and torch.cat the
parts: glibc's heap fragmented and a float32 d = 64 fwd+bwd at n = 32768 grew the process's peak RSS by
841-1,082 MiB, 18× the tensors' own size.  Its first-order schedule now allocates the outputs once and
accumulates into them in place, the tiles in two buffers of one size (``o_only._backward_in_place``).

The test runs fwd+bwd in a fresh interpreter per size (a peak is a high-water mark: one process cannot measure
two sizes) and reads ``VmHWM`` from /proc/self/status after a small warm-up step, so the growth counts what the
step itself made the process hold.  Figures measured on this project's 2-core CPU machine (MiB of growth,
n = 2048 / 4096, d = e = 64, tiles of 2^20 elements): before 58 / 70, after 12 / 13; at the library's default
tiles and n = 4096 / 16384 / 32768: before 213 / 175 / 1,062, after 71 / 86 / 106 (peak RSS 1,314 MiB at 32768
before, 360 after).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

D = E = 64
TILE = 1 << 20         # tile elements: 4 MiB per float32 buffer (the default's 16 MiB needs n >= 4096 to be
#                        reached; at 2^20 both sizes below run at the full tile, so the tile budget is one constant)
SIZES = (2048, 4096)   # a few seconds each on 2 cores

_STEP = textwrap.dedent("""
    import json, sys
    import torch, torch_impl
    from torch_impl.kernels import o_only

    def peak_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

    n, d, e, tile = map(int, sys.argv[1:5])
    o_only.TILE_ELEMENTS = tile
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, m, requires_grad=True) for m in (d, d, e))
    small = [torch.randn(64, m, requires_grad=True) for m in (d, d, e)]
    torch_impl.attn_o(*small).sum().backward()           # warm-up: libraries' own first-call buffers
    base = peak_mib()
    torch_impl.attn_o(q, k, v).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    print(json.dumps({"base": base, "peak": peak_mib()}))
""")


def _growth_mib(n: int) -> float:
    done = subprocess.run([sys.executable, "-c", _STEP, str(n), str(D), str(E), str(TILE)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TANH_ATTN_FUSED": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures["peak"] - figures["base"]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc (Linux)")
def test_peak_rss_of_fwd_bwd_grows_as_the_tensors_plus_a_tile_budget():
    mib = 1 << 20
    for n in SIZES:
        tensors = 4 * n * (2 * D + 2 * E) * 2 / mib       # float32 q, k, v, o, G_O and their gradients: O(n·(d+e))
        tiles = 2 * TILE * 4 / mib                        # the backward's two tile buffers (A and G_X): constant
        # The margin: 2× the tensors (a reshape / contiguous copy of an input or of the expanded G_O may add one
        # of each) and 16 MiB for what is not ours to bound -- BLAS's per-thread packing buffers, the
        # allocator's granularity, run-to-run noise (after the fix: 12-13 MiB of growth against 32-40 allowed;
        # before it 46-63 at n = 2048 and 70 at 4096, above the bound at both sizes).
        allowed = 2 * tensors + tiles + 16
        growth = _growth_mib(n)
        assert growth <= allowed, (f"n = {n}: the fwd+bwd step grew the process's peak RSS by {growth:.0f} MiB, "
                                   f"more than {allowed:.0f} MiB (tensors {tensors:.0f} MiB, tiles {tiles:.0f})")
