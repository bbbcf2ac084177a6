"""``--kernels``, run: each selected candidate (``crosscheck.kernels``) on its cases — the torch candidates in a
fresh interpreter (``TRITON_INTERPRET`` set before triton loads, the kernels routed for CPU tensors), the JAX
candidates in the run's own JAX executor — and their rows, each case compared by ``compare_case``."""

from __future__ import annotations

import itertools
import os
import pickle
from typing import Dict, List, Tuple

from .child import run_child
from .errors import Raised
from .frameworks import get
from .kernels import (CANDIDATES, KERNEL_SHAPES, PATH_SHAPES, SETUP_ENV, TILE, TIMEOUT_S, Candidate, how, jax_side,
                      selected, torch_side)
from .parts import Outcome

__all__ = ["CaseSpec", "run_torch", "check"]


# --- the cases, and the torch subprocess --------------------------------------------------------------------------

# (op, dtype, shape, trial, all_paths, do_jacrev): what the subprocess needs to rebuild a case (with the run's seed)
CaseSpec = Tuple[str, str, Tuple[int, int, int], int, bool, bool]


def _cases(config, cand: Candidate) -> List[CaseSpec]:
    from .cases import Case
    from .compare import jacrev_size
    from .specs import SPECS
    out = []
    for op, dtype, shape, trial in itertools.product([o for o in cand.ops if o in config.ops],
                                                     [d for d in config.dtypes if d in cand.dtypes],
                                                     KERNEL_SHAPES, range(config.trials)):
        paths = shape in KERNEL_SHAPES[:PATH_SHAPES]
        size = jacrev_size(SPECS[op], Case(SPECS[op], dtype, shape, trial, config.seed, paths), shape, dtype)
        out.append((op, dtype, shape, trial, paths, 0 < size <= config.jacrev_max_elements))
    return out


def _job(side, seed: int, cs: CaseSpec):
    from .cases import Case, Job
    from .specs import SPECS
    op, dtype, shape, trial, paths, jacrev = cs
    spec = SPECS[op]
    return Job(side, spec, Case(spec, dtype, tuple(shape), trial, seed, paths), dtype, jacrev)


def _torch_main(payload_path: str, out_path: str) -> None:
    """The torch subprocess (TRITON_INTERPRET=1 set by the parent on the CPU): every torch candidate's cases."""
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    device = payload["device"]
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
        from .parts import EagerExecutor
        executor = EagerExecutor("torch", device)
        results: Dict[str, List[Outcome]] = {}
        for kind, cases in payload["cases"].items():
            cand = next(c for c in CANDIDATES if get(c.fw).kernels_apart and c.kind == kind)
            results[kind] = [_outcome(executor, _job(torch_side(cand, cs[0], device), payload["seed"], cs))
                             for cs in cases]
    with open(out_path, "wb") as f:
        pickle.dump({"results": results, "interpret": bool(module.INTERPRET)}, f)


def _outcome(executor, job) -> Outcome:
    """The executor's results of ``job``, or the error (reported as this case's failure)."""
    try:
        return Outcome(results=executor.run(job))
    except Exception as exc:                            # noqa: BLE001 - reported as this case's failure
        return Outcome(error=Raised.of(exc))


def run_torch(device: str, seed: int, cases: Dict[str, List[CaseSpec]], timeout: float = TIMEOUT_S) -> dict:
    """The torch candidates' results ``{kind: [results per case]}`` from a fresh interpreter (this package first on
    PYTHONPATH; ``TRITON_INTERPRET=1`` on the CPU)."""
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return run_child(_torch_main, [], {"seed": seed, "device": device, "cases": cases},
                     "--kernels: the torch subprocess", timeout, env)


# --- in the run -------------------------------------------------------------------------------------------------

def check(config, col, executors: Dict[str, object], progress=None) -> None:
    """Run every selected candidate on its cases and add its rows to ``col`` (each case by ``compare_case``).  The
    JAX candidates run in ``executors["jax"]`` (the run's, inside its context)."""
    from .cases import Case
    from .compare import case_info, compare_case, jacrev_size, own_oracle, second_order_skips
    from .oracles import Kind, Party
    from .parts import Failed
    from .specs import SPECS, Side

    def add(cand: Candidate, side, cs: CaseSpec, res: Outcome) -> None:
        op, dtype, shape, trial, paths, _ = cs
        spec, name = SPECS[op], cand.name(config.device)
        case = Case(spec, dtype, tuple(shape), trial, config.seed, paths)
        if res.error is not None:                       # nothing of this case could be compared
            col.compare(spec, case_info(spec, dtype, shape, trial), own_oracle(
                cand.fw, Kind.FORWARD, "impl", Party(cand.fw, "reference"), name), Failed.from_error(res.error),
                None, (), spec.outputs)
            return
        compare_case(col, spec, {cand.fw: side}, case, dtype, tuple(shape), trial, {cand.fw: res.results},
                     jacrev_size(spec, case, tuple(shape), dtype))
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
            add(cand, side, cs, _outcome(executor, job))
