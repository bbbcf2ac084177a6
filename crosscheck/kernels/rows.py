"""``--kernels`` in the run (``crosscheck.kernels``): each selected candidate on its cases — the torch candidates in
their child (:mod:`.torch_triton`), the JAX candidates in the run's own JAX executor — and their rows, each case's
outcome compared by ``remote.outcome.compare_outcome``."""

from __future__ import annotations

import itertools
import os
from typing import Dict, List

from ..cases import Case
from ..compare import jacrev_size, second_order_skips
from ..frameworks import get
from ..parts import Outcome
from ..remote.outcome import compare_outcome
from ..remote.process import run_child, run_job
from ..specs import SPECS, Side
from . import candidates, torch_triton
from .candidates import TIMEOUT_S, Candidate, how, in_child, jax_side, selected
from .payload import CaseSpec, Payload, job

__all__ = ["run_torch", "check"]


def _cases(config, cand: Candidate) -> List[CaseSpec]:
    out = []
    for op, dtype, shape, trial in itertools.product([o for o in cand.ops if o in config.ops],
                                                     [d for d in config.dtypes if d in cand.dtypes],
                                                     candidates.KERNEL_SHAPES, range(config.trials)):
        paths = shape in candidates.KERNEL_SHAPES[:candidates.PATH_SHAPES]
        size = jacrev_size(SPECS[op], Case(SPECS[op], dtype, shape, trial, config.seed, paths), shape, dtype)
        out.append((op, dtype, shape, trial, paths, 0 < size <= config.jacrev_max_elements))
    return out



def run_torch(device: str, seed: int, cases: Dict[str, List[CaseSpec]], timeout: float = TIMEOUT_S) -> dict:
    """The torch candidates' results ``{kind: [results per case]}`` from a fresh interpreter (this package first on
    PYTHONPATH; ``TRITON_INTERPRET=1`` on the CPU)."""
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return run_child(torch_triton.main, [], Payload(seed, device, cases), "--kernels: the torch subprocess", timeout, env)



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
            cand = in_child(kind)
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
                jobs.append((cand, sides[cs[0]], cs, job(sides[cs[0]], config.seed, cs)))
        for *_, queued in jobs:
            executor.prefetch(queued)
        for cand, side, cs, queued in jobs:
            add(cand, side, cs, run_job(executor, queued))
