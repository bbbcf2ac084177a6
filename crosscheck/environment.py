"""The environment of a run: versions, whether the requested device exists in each framework checked, and
torch's float32 matmul precision (pinned on CUDA, restored afterwards)."""

from __future__ import annotations

import contextlib
import importlib
import platform
from typing import Dict, Sequence

import numpy as np

from ._version import __version__
from .errors import EnvironmentProblem
from .frameworks import NAMES, get

__all__ = ["versions", "check_environment", "torch_precision"]

def versions(frameworks: Sequence[str]) -> Dict[str, str]:
    import torch
    v = {"crosscheck": __version__, "python": platform.python_version(), "numpy": np.__version__,
         "torch": torch.__version__, "platform": platform.platform()}
    for package in (p for fw in frameworks for p in get(fw).versions):
        v[package] = getattr(importlib.import_module(package), "__version__", "?")
    return v


def check_environment(device: str, frameworks: Sequence[str]) -> None:
    """Raise :class:`EnvironmentProblem` when a framework checked is missing, or lacks ``device``: the message
    names *each* framework that lacks it and why that matters for the run asked.  The float64 ground truth is
    always computed by torch on the CPU, so ``--frameworks jax --device cuda`` needs no CUDA in torch."""
    for fw in frameworks:
        words = get(fw)
        try:
            __import__(words.name)
            __import__(words.package)
        except ImportError as e:
            raise EnvironmentProblem(f"{words.title} side unavailable: {e}. {words.missing_advice}") from None
    if device != "cuda":
        return
    found = {fw: get(fw).gpu_check() for fw in NAMES if fw in frameworks}
    fine = [fw for fw, problem in found.items() if not problem]
    problems = [f"{problem}\n    needed because --frameworks includes {fw}: its hand-written gradients and its "
                f"autodiff oracles would run on the GPU" for fw, problem in found.items() if problem]
    if problems:
        count = f"{len(problems)} of {len(found)} frameworks"       # before the note below joins the list
        problems += [get(fw).not_needed_on_gpu for fw in NAMES if fw not in frameworks and get(fw).not_needed_on_gpu]
        advice = ("leave out --device cuda to check on the CPU"
                  + (f", or check only the framework that has a GPU: --frameworks {','.join(fine)}" if fine else ""))
        raise EnvironmentProblem(f"--device cuda: {count} checked lack a GPU. Nothing was checked; {advice}.\n"
                                 + "\n".join(f"  - {p}" for p in problems))


def _new_precision_api(torch) -> bool:
    return hasattr(getattr(torch.backends.cuda, "matmul", None), "fp32_precision")


@contextlib.contextmanager
def torch_precision(device: str):
    """On CUDA, pin float32 matmuls (and cuDNN convolutions) to full IEEE precision — no TF32, which would
    drown real errors — and restore the previous settings afterwards.

    torch >= 2.9 has per-backend ``fp32_precision`` settings; reading a legacy flag (``allow_tf32``,
    ``get_float32_matmul_precision()``) after the new API was used raises ("mix of the legacy and new APIs"),
    and setting a legacy flag would leave the new settings changed.  So where the new API exists only it is
    used (save, set ``"ieee"``, restore); older torch gets the legacy flags."""
    import torch
    if device != "cuda":
        yield
        return
    if _new_precision_api(torch):
        knobs = [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision")]
        saved = [getattr(obj, name) for obj, name in knobs]
        for obj, name in knobs:
            setattr(obj, name, "ieee")
        try:
            yield
        finally:
            for (obj, name), value in zip(knobs, saved):
                setattr(obj, name, value)
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])
