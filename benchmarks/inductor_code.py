"""What inductor runs for each ``torch.compile`` contender, read from its generated code (not timed).

Under ``torch.compile`` inductor sees the op's formulas, and it normalises what it sees (AOTAutograd's joint graph is
CSE'd and re-partitioned; pointwise ops are fused): for ``torch.compile(torch_impl.attn)``,
``torch.compile(torch.ops.attn_lab.attn)`` and ``torch.compile(attn_reference)`` it generates the same
kernels.  The timed ratio between them is then a tie up to noise, and the report says so with this evidence:

    gemms        the extern GEMM calls of forward + backward, in order (``extern_kernels.mm`` / ``addmm`` ...)
    fused        the number of fused C++ kernel calls (``cpp_fused_*``: tanh, tanh_backward)
    nxn_buffers  the number of (n, n) buffers allocated (n distinct from d and e)
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional

import torch

_GEMM = re.compile(r"extern_kernels\.(\w+)\(")
_FUSED_CALL = re.compile(r"^(\w+ = )?cpp_fused_\w+\(")


def kernels(fn: Callable, n: int = 16, d: int = 4, e: int = 8) -> Optional[Dict[str, object]]:
    """Compile ``fn`` afresh with inductor (CPU), run forward + backward with both output gradients once,
    and summarise the generated code (see the module docstring); ``None`` if no code was generated (another
    backend)."""
    from torch._inductor.utils import run_and_get_code

    torch.compiler.reset()
    compiled = torch.compile(fn, dynamic=False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=g).requires_grad_() for s in ((n, d), (n, d), (n, e)))
    go, ga = torch.randn(n, e, generator=g), torch.randn(n, n, generator=g)

    def step():
        o, a = compiled(q, k, v)
        return torch.autograd.grad((o, a), (q, k, v), (go, ga))

    _, codes = run_and_get_code(step)
    torch.compiler.reset()
    if not codes:
        return None
    lines = [line.strip() for code in codes for line in code.splitlines() if "async_compile" not in line]
    return {
        "gemms": [m.group(1) for line in lines for m in [_GEMM.search(line)] if m],
        "fused": sum(bool(_FUSED_CALL.match(line)) for line in lines),
        "nxn_buffers": sum(f"empty_strided_cpu(({n}, {n})" in line for line in lines),
    }


def same_as(ours: dict, ref: dict) -> bool:
    """The same kernels: the same GEMMs (as a multiset: inductor may order independent ones differently), as
    many fused kernels and (n, n) buffers; never "the same" when nothing was parsed (another code format)."""
    return (bool(ref["gemms"]) and sorted(ours["gemms"]) == sorted(ref["gemms"])
            and ours["fused"] == ref["fused"] and ours["nxn_buffers"] == ref["nxn_buffers"])


def describe(summary: dict) -> str:
    return (f"{len(summary['gemms'])} GEMMs ({', '.join(summary['gemms'])}), {summary['fused']} fused kernels, "
            f"{summary['nxn_buffers']} n×n buffers")


def survey(contenders) -> Dict[str, dict]:
    """``{name: kernels(...)}`` for every available compiled contender that inductor compiled (empty when
    compile is skipped)."""
    out = {}
    for c in contenders:
        if c.available and c.compile_target is not None:
            try:     # like a broken timed contender, a failed compile is reported, not allowed to stop the run
                summary = kernels(c.compile_target)
            except Exception as exc:  # noqa: BLE001
                summary = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            if summary is not None:
                out[c.name] = summary
    return out
