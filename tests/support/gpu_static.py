"""What the GPU-static tables must hold, derived from the launchers' flag space and ``triton_attn.CONFIGS``
(tests/kernels/test_gpu_static.py and test_gpu_static_full.py)."""

from __future__ import annotations


def launcher_variants() -> set:
    """Every Triton row variant the launchers produce at one (arch, dtype, d, e) whose table entries are all
    proven: the o-only forward (causal or not) and the lab's, the o-only backward's dK/dV (asked for G_K, G_V or
    both) and dQ, causal or not, and the lab's backward for each set of cotangents (G_O and G_A, G_O, G_A)."""
    want = {"o_forward", "o_forward causal", "fused_forward"}
    for causal in ("", " causal"):
        want |= {f"o_dkdv GO need-{n}{causal}" for n in ("K", "V", "KV")} | {f"o_dq GO{causal}"}
    for flags, needs in (("GO GA", ("K", "V", "KV")), ("GO", ("K", "V", "KV")), ("GA", ("K",))):
        want |= {f"fused_dkdv {flags} need-{n}" for n in needs} | {f"fused_dq {flags}"}
    return want

