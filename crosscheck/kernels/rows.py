"""``--kernels`` in the run (``crosscheck.kernels``): each selected candidate on its cases — in its framework's child
where the driver has one (``drivers.Driver.kernels_main``: torch's, :mod:`.torch_triton`), else in the run's own
executor (JAX's) — and their rows, each case's
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
from .. import drivers
from . import candidates
from .candidates import TIMEOUT_S, Candidate, candidate, how, selected
from .payload import CaseSpec, Payload, job

__all__ = ["run_apart", "check"]


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


def run_apart(fw: str, device: str, seed: int, cases: Dict[str, List[CaseSpec]], timeout: float = TIMEOUT_S) -> dict:
    """Framework ``fw``'s candidates' results ``{kind: [results per case]}`` from its ``--kernels`` child in a fresh
    interpreter (``drivers.Driver.kernels_main``; this package first on PYTHONPATH, the driver's variables set)."""
    driver = drivers.get(fw)
    env = dict(os.environ)
    for name, value in driver.kernels_env(device).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return run_child(driver.kernels_main, [], Payload(fw, seed, device, cases), f"--kernels: the {fw} subprocess",
                     timeout, env)


# --- in the run -------------------------------------------------------------------------------------------------

def check(config, col, executors: Dict[str, object], progress=None) -> None:
    """Run every selected candidate on its cases and add its rows to ``col`` (each case by ``compare_case``): in its
    framework's child, else in ``executors[fw]`` (the run's, inside its context)."""
    def add(cand: Candidate, side, todo: Tuple[CaseSpec, Case, int], res: Outcome) -> None:
        (op, dtype, shape, trial, _, _), case, size = todo
        spec = SPECS[op]
        if compare_outcome(col, spec, cand.fw, side, case, dtype, tuple(shape), trial, size, res):
            second_order_skips(col, spec, side, case, dtype, cand.fw)

    cands = selected(config)
    apart = [c for c in cands if drivers.get(c.fw).kernels_main is not None]
    for fw in dict.fromkeys(c.fw for c in apart):
        todo = {c.kind: _cases(config, c) for c in apart if c.fw == fw}
        if progress is not None:
            progress(0, 1, f"kernels: {fw} {get(fw).kernel_library} ({how(config.device)}) in a subprocess")
        found = run_apart(fw, config.device, config.seed, {kind: [t[0] for t in cases] for kind, cases in todo.items()})
        for kind, cases in todo.items():
            cand = candidate(fw, kind)
            side = Side.results_only(cand.name(config.device), cand.entry)
            for t, res in zip(cases, found["results"][kind]):
                add(cand, side, t, res)
    inside = [c for c in cands if drivers.get(c.fw).kernels_main is None]
    for fw in dict.fromkeys(c.fw for c in inside):
        if progress is not None:
            progress(0, 1, f"kernels: {fw} {get(fw).kernel_library} ({how(config.device)})")
        jobs = []
        for cand in (c for c in inside if c.fw == fw):
            sides = {op: drivers.get(fw).kernel_side(cand, op, config.device) for op in cand.ops if op in config.ops}
            for t in _cases(config, cand):          # the job gets a Case of its own; the comparison keeps t's
                jobs.append((cand, sides[t[0][0]], t, job(sides[t[0][0]], config.seed, t[0])))
        for *_, queued in jobs:
            executors[fw].prefetch(queued)
        for cand, side, t, queued in jobs:
            add(cand, side, t, run_job(executors[fw], queued))
