"""The ``--kernels`` torch child (``crosscheck.kernels``): a fresh interpreter, ``TRITON_INTERPRET=1`` set by the run on
the CPU before triton loads, the kernels routed for CPU tensors; every torch candidate's cases run there."""

from __future__ import annotations

import os
import pickle
from typing import Dict, List

from ..parts import EagerExecutor, Outcome
from ..remote.process import run_job
from .candidates import SETUP_ENV, TILE, candidate, torch_side
from .payload import job

__all__ = ["main"]


def main(payload_path: str, out_path: str) -> None:
    """The torch subprocess (TRITON_INTERPRET=1 set by the parent on the CPU): every torch candidate's cases."""
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    device = payload.device
    from torch_impl import kernels as K
    module = K.triton_module()
    if module is None:
        raise SystemExit("triton is not installed or does not import: the torch kernels cannot run")
    # CPU tensors routed to the (interpreted) kernels; every launch on tiles of TILE rows
    with K.kernel_devices(*dict.fromkeys((*K.DEVICES, device))), module.tiles(TILE, TILE):
        setup = os.environ.get(SETUP_ENV, "")
        if setup:                                           # tests: plant a wrong kernel
            from ..impls import resolve
            resolve(setup, SETUP_ENV)()
        executor = EagerExecutor("torch", device)
        results: Dict[str, List[Outcome]] = {}
        for kind, cases in payload.cases.items():
            cand = candidate(payload.fw, kind)
            results[kind] = [run_job(executor, job(torch_side(cand, cs[0], device), payload.seed, cs))
                             for cs in cases]
    with open(out_path, "wb") as f:
        pickle.dump({"results": results, "interpret": bool(module.INTERPRET)}, f)

