"""``--kernels``, run: each selected candidate (``crosscheck.kernels``) on its cases — the torch candidates in a
fresh interpreter (``TRITON_INTERPRET`` set before triton loads, the kernels routed for CPU tensors), the JAX
candidates in the run's own JAX executor — and their rows, each case compared by ``compare_case``."""

from __future__ import annotations

import itertools
import os
import pickle
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .cases import Case, Job
from .compare import jacrev_size, second_order_skips
from .frameworks import get
from .kernels import (CANDIDATES, KERNEL_SHAPES, PATH_SHAPES, SETUP_ENV, TILE, TIMEOUT_S, Candidate, how, jax_side,
                      selected, torch_side)
from .parts import EagerExecutor, Outcome
from .remote.outcome import compare_outcome
from .remote.process import run_child, run_job
from .specs import SPECS, Side

__all__ = ["CaseSpec", "Payload", "run_torch", "check"]


# --- the cases, and the torch subprocess --------------------------------------------------------------------------

# (op, dtype, shape, trial, all_paths, do_jacrev): what the subprocess needs to rebuild a case (with the run's seed)
CaseSpec = Tuple[str, str, Tuple[int, int, int], int, bool, bool]


@dataclass(frozen=True)
class Payload:
    """What the torch child gets (pickled by ``run_child``): the run's seed and device, each candidate's cases."""

    seed: int                                           # the run's: the cases' numbers are the run's
    device: str
    cases: Dict[str, List[CaseSpec]]                    # {candidate kind: its cases}


def _cases(config, cand: Candidate) -> List[CaseSpec]:
    out = []
    for op, dtype, shape, trial in itertools.product([o for o in cand.ops if o in config.ops],
                                                     [d for d in config.dtypes if d in cand.dtypes],
                                                     KERNEL_SHAPES, range(config.trials)):
        paths = shape in KERNEL_SHAPES[:PATH_SHAPES]
        size = jacrev_size(SPECS[op], Case(SPECS[op], dtype, shape, trial, config.seed, paths), shape, dtype)
        out.append((op, dtype, shape, trial, paths, 0 < size <= config.jacrev_max_elements))
    return out


def _job(side, seed: int, cs: CaseSpec) -> Job:
    op, dtype, shape, trial, paths, jacrev = cs
    spec = SPECS[op]
    return Job(side, spec, Case(spec, dtype, tuple(shape), trial, seed, paths), dtype, jacrev)


def _torch_main(payload_path: str, out_path: str) -> None:
    """The torch subprocess (TRITON_INTERPRET=1 set by the parent on the CPU): every torch candidate's cases."""
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    device = payload.device
    from torch_impl import kernels as K
    if device == "cpu":
        K.DEVICES = tuple(K.DEVICES) + ("cpu",)         # route CPU tensors to the (interpreted) kernels
    module = K.triton_module()
    if module is None:
        raise SystemExit("triton is not installed or does not import: the torch kernels cannot run")
    with module.tiles(TILE, TILE):                      # every launch on tiles of TILE rows
        setup = os.environ.get(SETUP_ENV, "")
        if setup:                                           # tests: plant a wrong kernel
            from .impls import resolve
            resolve(setup, SETUP_ENV)()
        executor = EagerExecutor("torch", device)
        results: Dict[str, List[Outcome]] = {}
        for kind, cases in payload.cases.items():
            cand = next(c for c in CANDIDATES if get(c.fw).kernels_apart and c.kind == kind)
            results[kind] = [run_job(executor, _job(torch_side(cand, cs[0], device), payload.seed, cs))
                             for cs in cases]
    with open(out_path, "wb") as f:
        pickle.dump({"results": results, "interpret": bool(module.INTERPRET)}, f)


def run_torch(device: str, seed: int, cases: Dict[str, List[CaseSpec]], timeout: float = TIMEOUT_S) -> dict:
    """The torch candidates' results ``{kind: [results per case]}`` from a fresh interpreter (this package first on
    PYTHONPATH; ``TRITON_INTERPRET=1`` on the CPU)."""
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return run_child(_torch_main, [], Payload(seed, device, cases), "--kernels: the torch subprocess", timeout, env)


# --- in the run -------------------------------------------------------------------------------------------------

def check(config, col, executors: Dict[str, object], progress=None) -> None:
    """Run every selected candidate on its cases and add its rows to ``col`` (each case by ``compare_case``).  The
    JAX candidates run in ``executors["jax"]`` (the run's, inside its context)."""
    def add(cand: Candidate, side, cs: CaseSpec, res: Outcome) -> None:
        op, dtype, shape, trial, paths, _ = cs
        spec, shape = SPECS[op], tuple(shape)
        case = Case(spec, dtype, shape, trial, config.seed, paths)
        if compare_outcome(col, spec, cand.fw, side, case, dtype, shape, trial, jacrev_size(spec, case, shape, dtype),
                           res):
            second_order_skips(col, spec, side, case, dtype, cand.fw)

    cands = selected(config)
    torch_cases = {c.kind: _cases(config, c) for c in cands if get(c.fw).kernels_apart}
    if torch_cases:
        if progress is not None:
            progress(0, 1, f"kernels: torch triton ({how(config.device)}) in a subprocess")
        found = run_torch(config.device, config.seed, torch_cases)
        for kind, cases in torch_cases.items():
            cand = next(c for c in cands if get(c.fw).kernels_apart and c.kind == kind)
            side = Side.results_only(cand.name(config.device), cand.entry)
            for cs, res in zip(cases, found["results"][kind]):
                add(cand, side, cs, res)
    jax_cands = [c for c in cands if not get(c.fw).kernels_apart]
    if jax_cands:
        if progress is not None:
            progress(0, 1, f"kernels: jax pallas ({how(config.device)})")
        executor = executors[jax_cands[0].fw]
        jobs = []
        for cand in jax_cands:
            sides = {op: jax_side(cand, op, config.device) for op in cand.ops if op in config.ops}
            for cs in _cases(config, cand):
                jobs.append((cand, sides[cs[0]], cs, _job(sides[cs[0]], config.seed, cs)))
        for *_, job in jobs:
            executor.prefetch(job)
        for cand, side, cs, job in jobs:
            add(cand, side, cs, run_job(executor, job))
