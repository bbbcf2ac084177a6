"""The run's side of ``--shards``: the cases out to a child per framework (:func:`run_layouts`), rows in
(:func:`check`): each case compared by ``compare_case``, plus torch's in-place and "every rank ends alike" rows.

Nothing here imports torch.distributed or JAX: the children do (``torch_ranks``, ``jax_devices``), in fresh
interpreters whose environment is set before they load.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from typing import Dict, List, Sequence

from .. import drivers, metrics
from ..cases import Case
from ..compare import autodiff, case_info, jacrev_size, own_oracle
from ..errors import Raised, first_line
from ..oracles import Kind, Party
from ..parts import Outcome
from ..remote.outcome import compare_outcome
from ..remote.process import run_child
from ..specs import SPECS, Side
from ..frameworks import get
from .payload import TIMEOUT_S, CaseSpec, Payload, candidate, raised, sharded_shapes

__all__ = ["run_layouts", "check"]


def run_layouts(fw: str, world: int, seed: int, cases: Sequence[CaseSpec], timeout: float = TIMEOUT_S,
                layouts: str = "") -> Dict[str, List[Outcome]]:
    """Every layout of ``fw`` on ``world`` gloo ranks / JAX host devices: ``{layout: [results per case]}``, from the
    framework's ``main(PAYLOAD, OUT)`` in a fresh interpreter with a timeout (this package first on PYTHONPATH)."""
    env, flag = dict(os.environ), get(fw).device_count_flag
    if flag:                                           # N host devices: XLA reads the flag when JAX is imported
        flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(flag))
        env["XLA_FLAGS"] = f"{flags} {flag}={world}".strip()
    payload = Payload(seed=seed, world=world, cases=tuple(cases), timeout=timeout, layouts=layouts)
    return run_child(drivers.get(fw).shards_main, [], payload, f"--shards {world}: the {fw} subprocess", timeout + 30, env)


def check(config, col, progress=None) -> None:
    """Run every sharded layout of every framework of ``config`` on ``config.shards`` ranks / devices and add their
    rows to ``col`` (a :class:`~crosscheck.compare.Collector`), each case compared by ``compare_case``."""
    world, spec = config.shards, SPECS["attn"]
    all_shapes, paths = sharded_shapes(world)
    todo = []                                          # (CaseSpec, Case, jacrev size)
    for dtype, shape, trial in itertools.product(list(config.dtypes), all_shapes, range(config.trials)):
        case = Case(spec, dtype, shape, trial, config.seed, shape in paths)
        size = jacrev_size(spec, case, shape, dtype)
        todo.append(((dtype, shape, trial, shape in paths, 0 < size <= config.jacrev_max_elements), case, size))
    for fw in config.frameworks:
        if progress is not None:
            progress(0, 1, f"sharded {fw} on {world} {get(fw).units}")
        by_layout = run_layouts(fw, world, config.seed, [t[0] for t in todo], layouts=config.user(fw).layouts)
        for layout, results in by_layout.items():
            name = candidate(fw, layout, world)
            side = Side.results_only(name, name)
            for (cs, case, size), res in zip(todo, results):
                _add_case(col, spec, fw, side, cs, case, size, res)


def _add_case(col, spec, fw: str, side: Side, cs: CaseSpec, case, size: int, res: Outcome) -> None:
    """The rows of one case of one layout (``side``: its name), from its outcome ``res``."""
    name = side.candidate
    dtype, shape, trial = cs[0], tuple(cs[1]), cs[2]
    if not compare_outcome(col, spec, fw, side, case, dtype, shape, trial, size, res):
        return
    info = case_info(spec, dtype, shape, trial)
    if res.inplace is not None:
        _compare_inplace(col, spec, name, case, info, res.inplace)
    if res.ranks is not None:
        _compare_ranks(col, spec, name, info, res.ranks)
    if case.all_paths and res.results.hvp is None:
        col.skip(spec.name, own_oracle(fw, Kind.HVP, "hand HVP", autodiff(fw, "hvp"), name), dtype,
                 f"{name}: no forward-mode rule, which the forward-over-reverse HVP needs")


def _reference_inplace(case) -> dict:
    """The single-device reference on the in-place probe (``TorchCandidate.inplace_probe``), per output:
    ``(raises, gradients)``: whether autograd refuses the backward after ``out.mul_(0.5)`` (its saved tensor was
    modified), and the gradients of the same program written out of place (``out * 0.5``), which a layout that
    does not raise must give."""
    # imported here, not at the top: only a run with torch layouts gets here, and a JAX-only run imports no torch
    import torch

    import torch_impl

    from ..torch_oracles import to_native
    found = {}
    for i, out_name in enumerate(("o", "a")):
        cots = tuple(to_native(c, "cpu") for c in case.second[0])
        runs = []
        for in_place in (True, False):
            leaves = tuple(to_native(x, "cpu").requires_grad_() for x in case.inputs)
            outs = list(torch_impl.attn_reference(*leaves))
            outs[i] = outs[i].mul_(0.5) if in_place else outs[i] * 0.5
            try:
                runs.append(torch.autograd.grad(outs, leaves, cots, allow_unused=True))
            except RuntimeError as exc:
                runs.append(("raised", first_line(exc)))
        found[out_name] = (raised(runs[0]), tuple(None if g is None else g.detach().numpy() for g in runs[1]))
    return found


def _compare_inplace(col, spec, name: str, case, info, found: dict) -> None:
    """Rows ``<candidate> backward after an in-place write vs torch reference``: after ``out.mul_(0.5)`` on each
    output, a layout either raises where the reference raises (autograd's version counter: a saved tensor was
    modified), or gives the gradients of the program written out of place; raising where the reference does not,
    or any other gradient (a backward that read a modified saved tensor), disagrees."""
    oracle = own_oracle("torch", Kind.VJP, "backward after an in-place write", Party("torch", "reference"), name)
    row = col.row(spec.name, oracle, info.dtype)
    expected, every = _reference_inplace(case), tuple(spec.inputs)
    for out in ("o", "a"):
        got, (raises, want) = found.get(out, found.get("error")), expected[out]
        where = f"{out}.mul_(0.5) before the backward"
        if not isinstance(got, tuple):                 # the probe itself failed
            diffs = [(every, metrics.Diff(math.inf, math.inf, f"the in-place probe raised {got}"))]
        elif raised(got):
            diffs = [(every, metrics.Diff(0.0, 0.0) if raises else metrics.Diff(
                math.inf, math.inf, f"raised {got[1]}; the reference computes the gradients"))]
        else:
            diffs = [((inp,), metrics.diff(g, w)) for inp, g, w in zip(spec.inputs, got, want)]
        for inp, d in diffs:
            d = dataclasses.replace(d, note=f"{where}: {d.note}" if d.note else where)
            col.record(row, spec, info, oracle, inp, tuple(spec.outputs), d, d.note)


def _compare_ranks(col, spec, name: str, info, disagreement: str) -> None:
    """One row per case, ``<candidate> every rank ends alike``: the ranks compare what they raised (or that they
    did not) after every case, and rank 0 writes the results; a rank that raised alone, or timed out in a collective
    that another rank never entered, fails here with both outcomes named (rank 0's own rows may look fine)."""
    oracle = own_oracle("torch", Kind.FORWARD, "every rank ends alike", None, name)
    row = col.row(spec.name, oracle, info.dtype)
    d = metrics.Diff(math.inf, math.inf, disagreement) if disagreement else metrics.Diff(0.0, 0.0)
    col.record(row, spec, info, oracle, (), tuple(spec.outputs), d, d.note, (),
               Raised("", disagreement) if disagreement else None)
