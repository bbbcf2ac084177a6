"""``--kernels`` in the run (``crosscheck.kernels``): each selected candidate on its cases — the torch candidates in
their child (:mod:`.torch_triton`), the JAX candidates in the run's own JAX executor — and their rows, each case's
outcome compared by ``remote.outcome.compare_outcome``."""

from __future__ import annotations

import itertools
import os
from typing import Dict, List, Tuple

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


def _cases(config, cand: Candidate) -> List[Tuple[CaseSpec, Case, int]]:
    """``(CaseSpec, Case, jacrev size)`` of each of ``cand``'s cases: the spec for a child, the case and its size for
    the comparison back in the run (as ``shards.rows.check`` keeps them)."""
    out = []
    for op, dtype, shape, trial in itertools.product([o for o in cand.ops if o in config.ops],
                                                     [d for d in config.dtypes if d in cand.dtypes],
                                                     candidates.KERNEL_SHAPES, range(config.trials)):
        paths = shape in candidates.KERNEL_SHAPES[:candidates.PATH_SHAPES]
        case = Case(SPECS[op], dtype, shape, trial, config.seed, paths)
        size = jacrev_size(SPECS[op], case, shape, dtype)
        out.append(((op, dtype, shape, trial, paths, 0 < size <= config.jacrev_max_elements), case, size))
    return out


def run_torch(device: str, seed: int, cases: Dict[str, List[CaseSpec]], timeout: float = TIMEOUT_S) -> dict:
    """The torch candidates' results ``{kind: [results per case]}`` from a fresh interpreter (this package first on
    PYTHONPATH; ``TRITON_INTERPRET=1`` on the CPU)."""
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return run_child(torch_triton.main, [], Payload(seed, device, cases), "--kernels: the torch subprocess", timeout,
                     env)


# --- in the run -------------------------------------------------------------------------------------------------

def check(config, col, executors: Dict[str, object], progress=None) -> None:
    """Run every selected candidate on its cases and add its rows to ``col`` (each case by ``compare_case``).  The
    JAX candidates run in ``executors["jax"]`` (the run's, inside its context)."""
    def add(cand: Candidate, side, todo: Tuple[CaseSpec, Case, int], res: Outcome) -> None:
        (op, dtype, shape, trial, _, _), case, size = todo
        spec = SPECS[op]
        if compare_outcome(col, spec, cand.fw, side, case, dtype, tuple(shape), trial, size, res):
            second_order_skips(col, spec, side, case, dtype, cand.fw)

    cands = selected(config)
    torch_cases = {c.kind: _cases(config, c) for c in cands if get(c.fw).kernels_apart}
    if torch_cases:
        if progress is not None:
            progress(0, 1, f"kernels: torch triton ({how(config.device)}) in a subprocess")
        specs = {kind: [t[0] for t in todo] for kind, todo in torch_cases.items()}
        found = run_torch(config.device, config.seed, specs)
        for kind, todo in torch_cases.items():
            cand = in_child(kind)
            side = Side.results_only(cand.name(config.device), cand.entry)
            for t, res in zip(todo, found["results"][kind]):
                add(cand, side, t, res)
    jax_cands = [c for c in cands if not get(c.fw).kernels_apart]
    if jax_cands:
        if progress is not None:
            progress(0, 1, f"kernels: jax pallas ({how(config.device)})")
        executor = executors[jax_cands[0].fw]
        jobs = []
        for cand in jax_cands:
            sides = {op: jax_side(cand, op, config.device) for op in cand.ops if op in config.ops}
            for t in _cases(config, cand):          # the job gets a Case of its own; the comparison keeps t's
                jobs.append((cand, sides[t[0][0]], t, job(sides[t[0][0]], config.seed, t[0])))
        for *_, queued in jobs:
            executor.prefetch(queued)
        for cand, side, t, queued in jobs:
            add(cand, side, t, run_job(executor, queued))
