"""A roofline model of each fused kernel on an H100 SXM: ``python scripts/roofline.py [--n N] [--d D] [--e E]
[--dtype bf16|fp16|tf32|fp32] [--causal] [--ga]``.

A model, not a measurement (no GPU has run these kernels): per head, each kernel's matmul FLOPs, its compulsory
HBM bytes (every input read once, every output written once; the lab's n x n A written by its forward and read by
its backward; re-reads of K / V tiles that L2 does not absorb are left out, so the memory time is a floor), and its
special-function (MUFU) operations, each divided by the H100 SXM's peak for it; the kernel's model time is the
largest of the three, and the bound says which.  The kernel names are ``jax_impl.kernels.pallas_attn.KERNELS``'
(the Triton kernels are the same three passes per path); the FLOP counts are docs/kernels.md's ("Traffic, FLOPs and
the roofline"): o-only 4n²d + 14n²d, the fused lab op 4n²d + 8n²d at d = e.  MUFU operations per score element:
1 where the hardware tanh runs (fp16 / bf16), 2 for the exact ``2σ(2x) − 1`` (an exponential and a reciprocal:
TF32 and float32), none where a kernel reads the saved A instead of computing tanh.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, NamedTuple, Optional

# H100 SXM5 peaks (NVIDIA's datasheet, dense): tensor-core FLOP/s per input dtype (float32: FFMA on the CUDA cores),
# HBM3 bandwidth, and the special-function units: 16 operations per clock per SM, 132 SMs at 1.83 GHz boost.
MMA_FLOPS = {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}
HBM_BYTES_PER_S = 3.35e12
MUFU_OPS_PER_S = 16 * 132 * 1.83e9
ITEMSIZE = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
TANH_MUFU = {"bf16": 1, "fp16": 1, "tf32": 2, "fp32": 2}      # MUFU ops per tanh evaluated

KERNELS = ("o_forward", "o_dkdv", "o_dq", "o_jvp", "fused_forward", "fused_dkdv", "fused_dq")
PATHS = {"o-only fwd+bwd": ("o_forward", "o_dkdv", "o_dq"), "fused lab op fwd+bwd": ("fused_forward", "fused_dkdv",
                                                                                     "fused_dq")}


class Work(NamedTuple):
    flops: float            # matmul FLOPs
    hbm_bytes: float        # compulsory HBM traffic
    mufu: float             # special-function operations


def scores(n: int, causal: bool) -> float:
    """Score entries a kernel visits: n², or the n(n + 1)/2 on and below the diagonal."""
    return n * (n + 1) / 2 if causal else float(n * n)


def work(kernel: str, n: int, d: int, e: int, dtype: str, causal: bool = False, ga: bool = False) -> Work:
    """One kernel's work per head (``ga``: the lab backward is given a cotangent G_A for a, read like A)."""
    s, b, t = scores(n, causal), ITEMSIZE[dtype], TANH_MUFU[dtype]
    nn = s * b                                          # one n x n (or triangular) matrix in HBM
    table: Dict[str, Work] = {
        # X = Q Kᵀ (2sd), O = A V (2se); reads q, k, v, writes o
        "o_forward": Work(2 * s * (d + e), n * (2 * d + 2 * e) * b, s * t),
        # recompute X (2sd) and G_O Vᵀ (2se); G_V += Aᵀ G_O (2se), G_K += G_Xᵀ Q (2sd); reads q, k, v, g_o, writes g_k, g_v
        "o_dkdv": Work(4 * s * (d + e), n * (3 * d + 3 * e) * b, s * t),
        # recompute X and G_O Vᵀ; G_Q += G_X K (2sd); reads q, k, v, g_o, writes g_q
        "o_dq": Work(s * (4 * d + 2 * e), n * (3 * d + 2 * e) * b, s * t),
        # X (2sd), Q̇ Kᵀ + Q K̇ᵀ (4sd), Ȧ V and A V̇ (4se); reads q, k, v and their tangents, writes o and ȯ
        "o_jvp": Work(s * (6 * d + 4 * e), n * (4 * d + 4 * e) * b, s * t),
        # as o_forward, and A written
        "fused_forward": Work(2 * s * (d + e), n * (2 * d + 2 * e) * b + nn, s * t),
        # reads the saved A (and G_A): G_V = Aᵀ G_O (2se), G_O Vᵀ (2se), G_K = G_Xᵀ Q (2sd); no tanh
        "fused_dkdv": Work(s * (2 * d + 4 * e), n * (2 * d + 3 * e) * b + nn * (2 if ga else 1), 0.0),
        # G_O Vᵀ again (2se) and G_Q = G_X K (2sd), from the saved A (and G_A)
        "fused_dq": Work(s * (2 * d + 2 * e), n * (3 * d + e) * b + nn * (2 if ga else 1), 0.0),
    }
    return table[kernel]


def model(w: Work, dtype: str) -> Dict[str, object]:
    """The three times (seconds) and which bounds the kernel."""
    times = {"compute": w.flops / MMA_FLOPS[dtype], "memory": w.hbm_bytes / HBM_BYTES_PER_S,
             "mufu": w.mufu / MUFU_OPS_PER_S}
    bound = max(times, key=times.get)
    return {**times, "time": times[bound], "bound": bound}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def table(n: int, d: int, e: int, dtype: str, causal: bool = False, ga: bool = False,
          heads: int = 1) -> List[str]:
    """The model as markdown lines: one row per kernel, then each path's sum."""
    lines = [f"Roofline model (not measured), H100 SXM, {dtype}, n = {n}, d = {d}, e = {e}, {heads} head(s)"
             + (", causal" if causal else "") + (", G_A given" if ga else ""),
             "", "| kernel | GFLOP | HBM MB | MUFU G-ops | compute µs | memory µs | MUFU µs | model µs | bound |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kernel in KERNELS:
        w = work(kernel, n, d, e, dtype, causal, ga)
        w = Work(*(x * heads for x in w))
        m = model(w, dtype)
        lines.append(f"| {kernel} | {w.flops / 1e9:,.2f} | {w.hbm_bytes / 1e6:,.1f} | {w.mufu / 1e9:,.3f} | "
                     f"{_us(m['compute'])} | {_us(m['memory'])} | {_us(m['mufu'])} | {_us(m['time'])} | {m['bound']} |")
    lines.append("")
    for path, kernels in PATHS.items():
        total = sum(model(Work(*(x * heads for x in work(k, n, d, e, dtype, causal, ga))), dtype)["time"]
                    for k in kernels)
        lines.append(f"{path}: {_us(total)} µs (the sum of its kernels' model times)")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/roofline.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--e", type=int, default=None, help="default: d")
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--dtype", choices=sorted(MMA_FLOPS), default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--ga", action="store_true", help="the lab backward is given G_A")
    args = p.parse_args(argv)
    print("\n".join(table(args.n, args.d, args.d if args.e is None else args.e, args.dtype, args.causal, args.ga,
                          args.heads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
