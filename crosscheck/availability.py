"""Whether a run can start: each framework checked is installed and has the device asked (else one
:class:`EnvironmentProblem` naming every framework that lacks it), and the versions a report records."""

from __future__ import annotations

import platform
from typing import Dict, Sequence

import numpy as np

from ._version import __version__
from .errors import EnvironmentProblem
from .frameworks import NAMES, get

__all__ = ["versions", "check_environment"]


def versions(frameworks: Sequence[str]) -> Dict[str, str]:
    import torch
    v = {"crosscheck": __version__, "python": platform.python_version(), "numpy": np.__version__,
         "torch": torch.__version__, "platform": platform.platform()}
    for fw in frameworks:
        v.update(get(fw).versions())
    return v


def check_environment(device: str, frameworks: Sequence[str]) -> None:
    """Raise :class:`EnvironmentProblem` when a framework checked is missing, or lacks ``device``: the message
    names *each* framework that lacks it and why that matters for the run asked.  The float64 ground truth is
    always computed by torch on the CPU, so ``--frameworks jax --device cuda`` needs no CUDA in torch."""
    for fw in frameworks:
        words = get(fw)
        try:
            words.load()
            words.impl()
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
