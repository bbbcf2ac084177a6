"""The elementwise kernels the GEMM floor does not run, timed alone on one n×n matrix: ATen's eager ``tanh``
(MKL's vector math library on builds with MKL, as the x86 wheels are: ``ATen/cpu/vml.h``), the ``tanh`` that
inductor generates (SLEEF's, ``at::vec::Vectorized::tanh``) and ATen's ``tanh_backward``.

All three write into a preallocated matrix (no page faults) and are timed by ``measure.time_steps``, interleaved
in a fresh random order each repetition; medians.  A full run records them for the n=4096 cases
(``run.run_case``), so the report can say what ``tanh`` costs against the GEMM floor."""

from __future__ import annotations

import numpy as np
import torch

from .measure import time_steps

__all__ = ["tanh_kernels"]


def tanh_kernels(n: int, dtype: str, reps: int = 15, with_inductor: bool = True) -> dict:
    """``{"aten_tanh": s, "inductor_tanh": s, "aten_tanh_backward": s}``: median seconds of one call on an (n, n)
    ``dtype`` matrix of standard normal values (``inductor_tanh`` left out without ``with_inductor``)."""
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=getattr(torch, dtype))
    y = torch.empty_like(x)
    steps = {"aten_tanh": lambda: torch.tanh(x, out=y),
             "aten_tanh_backward": lambda: torch.ops.aten.tanh_backward.grad_input(x, x, grad_input=y)}
    if with_inductor:
        compiled = torch.compile(lambda x, y: y.copy_(torch.tanh(x)), dynamic=False)
        steps["inductor_tanh"] = lambda: compiled(x, y)
    for step in steps.values():       # the first call (inductor's compile), which time_steps expects done
        step()
    timing = time_steps(steps, budget_s=0.0, min_reps=reps, max_reps=reps, sample_s=0.0, pause_s=0.0)
    return {key: float(np.median(v)) for key, v in timing["samples"].items()}
