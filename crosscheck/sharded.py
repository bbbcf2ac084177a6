"""``--shards N``: the sharded entries of the whole op as one more candidate, compared with the single-device reference.

A *sharded candidate* is the whole op ``attn`` run sharded over ``N`` ranks / devices and gathered back to full
tensors: a :class:`~crosscheck.specs.Side` that the same ``parts`` run on every path and the same ``compare_case``
compares with the reference's autodiff, in rows that name it.  torch: ``N`` gloo ranks spawned from a fresh
interpreter; JAX: ``N`` host devices in one subprocess.  Every rank / the subprocess builds the cases from the
run's seed, so the numbers are the run's.  Layouts, dtypes, shapes, skips and timeouts: docs/crosscheck.md,
"Sharded entries".
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import itertools
import traceback
from typing import Dict, List, Optional, Sequence, Tuple

from .child import run_child
from .errors import first_line

__all__ = ["TIMEOUT_S", "sharded_shapes", "candidate", "CaseSpec",
           "run_layouts", "torch_side", "jax_side", "check"]

TIMEOUT_S = 600                                         # one spawn / subprocess, all layouts and cases
STUCK_S = 30                                            # one collective of a request (tiny tensors)

# (dtype, shape, trial, all_paths, do_jacrev): what a worker needs to rebuild a case (with the run's seed)
CaseSpec = Tuple[str, Tuple[int, int, int], int, bool, bool]


def sharded_shapes(world: int) -> Tuple[List, List]:
    """``(shapes, path shapes)`` on ``world`` ranks / devices: n = world + 1 (uneven shards; every path), n = 2 world
    (even shards), n = 1 (fewer rows than ranks: empty shards) and n = 0."""
    shapes = [(world + 1, 3, 2), (2 * world, 2, 3), (1, 2, 2), (0, 2, 3)]
    return shapes, shapes[:1]


def candidate(fw: str, layout: str, world: int) -> str:
    """The candidate's name in oracle labels: ``"torch sharded rows on 2 ranks"``."""
    return f"{fw} sharded {layout} on {world} {_UNITS[fw]}"


def _job(side, seed: int, cs: CaseSpec):
    """The job of ``side`` on a case of the run (``cs``, with the run's ``seed``)."""
    from .cases import Case, Job
    from .specs import SPECS
    dtype, shape, trial, all_paths, do_jacrev = cs
    return Job(side, SPECS["attn"], Case(SPECS["attn"], dtype, tuple(shape), trial, seed, all_paths), dtype, do_jacrev)


def _run(executor, job) -> dict:
    """The executor's results of ``job``, or ``{"error": text}`` (reported as this layout's failure)."""
    try:
        return executor.run(job)
    except Exception as exc:                           # noqa: BLE001
        return {"error": first_line(exc)}


# --- torch: the candidate on gloo ranks -------------------------------------------------------------------------

def torch_side(mesh, layout, world: int, state: dict):
    """The torch candidate of ``layout`` (a ``torch_impl.distributed.Layout``) on ``mesh``, every request through
    ``distributed.run_layout``.  ``state["broken"]``: set when a request raised on this rank (the collectives may be
    out of step); later requests raise at once until the caller has re-synchronised the ranks on a fresh group."""
    def guarded(fn):
        def run(*args):
            if state["broken"]:
                raise RuntimeError(f"not run: an earlier request of this case raised on a rank ({state['broken']})")
            try:
                return fn(*args)
            except Exception as exc:
                state["broken"] = first_line(exc)
                raise
        return run

    import torch
    from torch.distributed.tensor import Replicate, distribute_tensor

    import torch_impl
    from torch_impl import distributed as D

    from .parts import Skip
    from .specs import Side

    name = candidate("torch", layout.name, world)

    def forward(q, k, v):
        out = D.run_layout(mesh, layout, q, k, v, None, None, (False, False, False))
        return out["o"], out["a"]

    def vjp(inputs, requests):
        return [D.run_layout(mesh, layout, *inputs, cots[0], cots[1], tuple(bool(w) for w in wrt))["grads"]
                for wrt, cots in requests]

    def like(full, dt):                                 # a cotangent of dt: replicated where dt is Partial
        placement = dt.placements[0]
        return distribute_tensor(full.detach(), mesh, [Replicate() if placement.is_partial() else placement])

    def vjp_vjp(inputs, g, w):
        """Second order through the sharded backward (``create_graph=True``), taken two ways.  The part w.r.t. the
        inputs as a gradient penalty takes it: the cotangents are constants (a loss linear in the outputs, as
        ``o.sum()``), so a backward that leaves the graph unless its incoming gradient requires grad
        (``once_differentiable``) gives no second order and disagrees with the reference instead of raising.  The
        part w.r.t. the cotangents with cotangents requiring grad.  A layout that refuses ``create_graph=True``
        with ``NotImplementedError`` (on every rank, before any collective) is a skip with its message."""
        dts = D.distribute_inputs(mesh, layout, *inputs, requires_grad=True)
        outs = tuple(layout.fn(*dts))
        consts = tuple(like(c, o) for c, o in zip(g, outs))
        cots = tuple(c.clone().requires_grad_() for c in consts)

        def second(cotangents, wrt):
            grads = torch.autograd.grad(outs, dts, cotangents, create_graph=True)
            pairs = [(gr, like(wi, gr)) for gr, wi in zip(grads, w) if gr is not None and gr.requires_grad]
            if not pairs:                              # no gradient in the graph: its second order is zero
                return (None,) * len(wrt)
            return torch.autograd.grad([p[0] for p in pairs], wrt, [p[1] for p in pairs], allow_unused=True,
                                       retain_graph=True)      # the forward's graph serves both ways

        try:
            both = second(consts, dts) + second(cots, cots)
        except NotImplementedError as exc:             # a documented refusal, the same on every rank
            return Skip(f"{name} refuses second order: {first_line(exc)}")
        return tuple(None if s is None else s.full_tensor().detach() for s in both)

    def inplace_probe(inputs, g):
        """The outcome of a backward after an in-place write on each output (``{"o": ..., "a": ...}``): the
        gradients (full tensors), or ``("raised", message)``.  Judged against the reference's outcome."""
        found = {}
        for i, out_name in enumerate(("o", "a")):
            dts = D.distribute_inputs(mesh, layout, *inputs, requires_grad=True)
            outs = tuple(layout.fn(*dts))
            cots = tuple(like(c, o) for c, o in zip(g, outs))
            outs[i].mul_(0.5)                          # the user's in-place write
            try:
                grads = torch.autograd.grad(outs, dts, cots, allow_unused=True)
            except RuntimeError as exc:
                found[out_name] = ("raised", first_line(exc))
                continue
            found[out_name] = tuple(None if s is None else s.full_tensor().detach().numpy() for s in grads)
        return found

    forward, vjp, vjp_vjp, inplace_probe = (guarded(f) for f in (forward, vjp, vjp_vjp, inplace_probe))
    side = Side(forward=forward, vjp=vjp, jvp=None, reference=torch_impl.attn_reference,
                source=f"torch_impl.distributed layout {layout.name!r} on {world} gloo ranks", forward_is_hand=True,
                jvp_missing=f"{name}: the DTensor layouts and the ring have no forward-mode rule (a tangent on a "
                            f"DTensor is refused)", candidate=name, vjp_vjp=vjp_vjp)
    return side, inplace_probe


def _torch_rank(rank: int, world: int, port: int, payload_path: str, out_path: str) -> None:
    """One gloo rank: every layout on every case; rank 0 writes the results."""
    import datetime

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        with open(payload_path, "rb") as f:
            payload = pickle.load(f)
        from torch_impl import distributed as D

        from .parts import EagerExecutor
        executor = EagerExecutor("torch", "cpu")
        results: Dict[str, List[dict]] = {}
        groups = 0
        for name, layout in (load_layouts(payload["layouts"], "--torch-layouts") or D.sharded_layouts()).items():
            results[name] = []
            side = None
            for cs in payload["cases"]:
                if side is None:                       # a fresh group with a short timeout, a mesh of its own name
                    groups += 1                        # (DTensor caches plans per mesh: a new name, no stale plan)
                    group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=STUCK_S))
                    state = {"broken": None}
                    mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=(f"shards{groups}",))
                    side, probe = torch_side(mesh, layout, world, state)
                job = _job(side, payload["seed"], cs)
                res = _run(executor, job)
                if job.case.all_paths and "error" not in res and not state["broken"]:
                    res["inplace"] = _run_probe(probe, job.case)
                # Every rank's outcome, on the default group: a request that raised on one rank only leaves the
                # others in a collective until STUCK_S, and rank 0 alone writes the results, so a rank whose
                # outcome differs from rank 0's makes the case a failure that names it; then the layout goes on
                # on a fresh group (the old one may be out of step).
                mine = (state["broken"], _outcome(res.get("inplace")))
                every = [None] * world
                dist.all_gather_object(every, mine)
                odd = [(r, o) for r, o in enumerate(every) if o != every[0]]
                if odd:
                    r, (broken, inplace) = odd[0]
                    res["ranks"] = (f"rank {r} raised {broken} while rank 0 "
                                    f"{'raised ' + every[0][0] if every[0][0] else 'did not'}"
                                    if broken != every[0][0] else
                                    f"the in-place probe ended differently on rank {r} ({inplace}) and rank 0 "
                                    f"({every[0][1]})")
                results[name].append(res)
                if any(o[0] for o in every):
                    side = None
        if rank == 0:
            with open(out_path, "wb") as f:
                pickle.dump(results, f)
    except BaseException:
        raise RuntimeError(f"rank {rank}: {traceback.format_exc()}")
    finally:
        dist.destroy_process_group()


def _run_probe(probe, case):
    """The in-place probe on the case's inputs and both-output cotangent, or ``{"error": text}``."""
    from .torch_oracles import to_native
    conv = lambda xs: tuple(None if a is None else to_native(a, "cpu") for a in xs)     # noqa: E731
    try:
        return probe(conv(case.inputs), conv(case.second[0]))
    except Exception as exc:                           # noqa: BLE001
        return {"error": first_line(exc)}


def _outcome(inplace) -> Optional[tuple]:
    """What every rank must agree on of an in-place probe: which writes raised, and with what."""
    if inplace is None or "error" in inplace:
        return None if inplace is None else ("error", inplace["error"])
    return tuple((k, v[1] if _raised(v) else "gradients") for k, v in sorted(inplace.items()))


def _raised(outcome) -> bool:
    return isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[0], str) and outcome[0] == "raised"


def load_layouts(text: str, option: str) -> Optional[dict]:
    """The dict of layouts named by ``MODULE:ATTR`` (a module or a .py file), or None for ``""``."""
    from .impls import resolve
    return dict(resolve(text, option)) if text else None


def _spawn_torch(payload: dict, payload_path: str, out_path: str) -> None:
    """Every torch layout on ``world`` gloo ranks, one spawn, with a deadline; rank 0 writes the results.  Runs in the
    subprocess of :func:`run_layouts` (started with ``-c``: the forkserver has no main module to import)."""
    from .ranks import run_ranks
    try:
        run_ranks(_torch_rank, payload["world"], (payload_path, out_path), timeout_s=payload["timeout"], preload=(
            "torch", "torch.distributed.tensor", "torch_impl", "torch_impl.distributed", "crosscheck.sharded"))
    except TimeoutError as exc:
        raise SystemExit(str(exc)) from None


# --- JAX: the candidate on host devices, in a subprocess --------------------------------------------------------

def jax_side(layout: str, fn, mesh, world: int):
    """The JAX candidate of layout ``fn`` on ``mesh`` (axis "x"), differentiated as the single-device entry.  Whether
    it has a forward-mode rule is asked of JAX once, by lowering a ``jax.jvp`` (else a request that cannot be
    traced would be found request by request, one lowering each): without one, its JVP rows are skipped."""
    from functools import partial

    import jax
    import jax.numpy as jnp

    from .jax_oracles import hand_jvp
    from .specs import _hand_side
    name = candidate("jax", layout, world)
    entry = partial(fn, mesh=mesh, axis="x")
    side = dataclasses.replace(_hand_side("jax", entry, f"jax_impl.ring.LAYOUTS[{layout!r}] on {world} host devices",
                                          key=("sharded", layout, world, fn)), autodiff_probe=None, candidate=name)
    x = jnp.zeros((world, 2))
    try:
        jax.jit(lambda x: hand_jvp(entry)((x, x, x), [(x, x, x)])).lower(x)
    except Exception as exc:                           # noqa: BLE001 - JvpUnsupported or any tracing error
        return dataclasses.replace(side, jvp=None, jvp_missing=f"{name}: no forward-mode rule ({first_line(exc)})")
    return side


def _jit_layouts() -> dict:
    """The lab's JAX entries (``jit_rows``: ``jax_impl.attn``, ``jit_rows_jvp``: ``attn_jvp``) under ``jit``, q's rows
    sharded by a ``NamedSharding`` (k, v replicated; XLA's partitioner places the rest)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    import jax_impl

    def on_rows(entry):
        def layout(q, k, v, *, mesh, axis="x"):
            rows, whole = NamedSharding(mesh, PartitionSpec(axis)), NamedSharding(mesh, PartitionSpec())
            constrain = jax.lax.with_sharding_constraint
            return entry(constrain(q, rows), constrain(k, whole), constrain(v, whole))
        return layout

    return dict(zip(JIT_LAYOUTS, (on_rows(jax_impl.attn), on_rows(jax_impl.attn_jvp))))


MESH_SUFFIX = {"auto": "", "explicit": "@explicit"}     # a layout on an Explicit mesh: "ring@explicit"
JIT_LAYOUTS = ("jit_rows", "jit_rows_jvp")              # XLA's partitioner places them: Auto meshes only


def _meshes(jax, np, world: int):
    """The meshes every JAX layout runs on: one 1-D axis "x" of ``world`` devices with Auto axis types (what
    ``jax.sharding.Mesh`` makes) and, where this JAX has explicit sharding (``jax.sharding.AxisType``), the same with
    Explicit axis types (``jax.make_mesh``'s default in recent JAX): XLA partitions the two differently."""
    devices = np.array(jax.devices()[:world])
    yield "auto", jax.sharding.Mesh(devices, ("x",))
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is not None and hasattr(axis_type, "Explicit"):
        yield "explicit", jax.sharding.Mesh(devices, ("x",), axis_types=(axis_type.Explicit,))


def _jax_main(payload: dict, payload_path: str, out_path: str) -> None:
    """The JAX subprocess (XLA_FLAGS set by the parent): every layout on every case."""
    import jax
    import numpy as np

    from jax_impl import ring

    from .jax_executor import JaxExecutor
    from .jax_oracles import context

    world = payload["world"]
    if len(jax.devices()) < world:
        raise SystemExit(f"JAX has {len(jax.devices())} devices, {world} asked for")
    layouts = load_layouts(payload["layouts"], "--jax-layouts") or {**ring.LAYOUTS, **_jit_layouts()}
    results = {}
    for kind, mesh in _meshes(jax, np, world):
        with context("cpu"):
            executor = JaxExecutor("jax", "cpu", sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
            try:
                jobs = {}
                for name, fn in layouts.items():
                    if kind != "auto" and name in JIT_LAYOUTS:     # with_sharding_constraint: Auto axes only
                        continue
                    key = name + MESH_SUFFIX[kind]
                    jobs[key] = [_job(jax_side(key, fn, mesh, world), payload["seed"], cs) for cs in payload["cases"]]
                    for job in jobs[key]:
                        executor.prefetch(job)
                results.update({key: [_run(executor, job) for job in layout_jobs] for key, layout_jobs in jobs.items()})
            finally:
                executor.close()
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


def run_layouts(fw: str, world: int, seed: int, cases: Sequence[CaseSpec], timeout: float = TIMEOUT_S,
                layouts: str = "") -> Dict[str, List[dict]]:
    """Every layout of ``fw`` on ``world`` gloo ranks / JAX host devices: ``{layout: [results per case]}``, from
    ``main(FW, PAYLOAD, OUT)`` in a fresh interpreter with a timeout (this package first on PYTHONPATH)."""
    env = dict(os.environ)
    if fw == "jax":                                    # N host devices: XLA reads the flag when JAX is imported
        flags = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                         if not f.startswith("--xla_force_host_platform_device_count"))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={world}".strip()
    payload = {"seed": seed, "world": world, "cases": list(cases), "timeout": timeout, "layouts": layouts}
    return run_child("crosscheck.sharded:main", [fw], payload, f"--shards {world}: the {fw} subprocess", timeout + 30,
                     env)


def main(fw: str, payload_path: str, out_path: str) -> None:
    """The subprocess of :func:`run_layouts`."""
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    {"torch": _spawn_torch, "jax": _jax_main}[fw](payload, payload_path, out_path)


# --- in the run: cases out, rows in ----------------------------------------------------------------------------

_UNITS = {"torch": "ranks", "jax": "devices"}


def check(config, col, progress=None) -> None:
    """Run every sharded layout of every framework of ``config`` on ``config.shards`` ranks / devices and add their
    rows to ``col`` (a :class:`~crosscheck.compare.Collector`), each case compared by ``compare_case``."""
    from .cases import Case
    from .compare import compare_case, jacrev_size
    from .frameworks import get
    from .parts import Failed
    from .results import Oracle
    from .specs import SPECS, Side

    world, spec = config.shards, SPECS["attn"]
    all_shapes, paths = sharded_shapes(world)
    todo = []                                          # (CaseSpec, Case, jacrev size)
    dtypes = list(config.dtypes)
    for dtype, shape, trial in itertools.product(dtypes, all_shapes, range(config.trials)):
        case = Case(spec, dtype, shape, trial, config.seed, shape in paths)
        size = jacrev_size(spec, case, shape, dtype)
        todo.append(((dtype, shape, trial, shape in paths, 0 < size <= config.jacrev_max_elements), case, size))
    for fw in config.frameworks:
        if progress is not None:
            progress(0, 1, f"sharded {fw} on {world} {_UNITS[fw]}")
        by_layout = run_layouts(fw, world, config.seed, [t[0] for t in todo], layouts=getattr(config, f"{fw}_layouts"))
        names = get(fw).autodiff
        for layout, results in by_layout.items():
            name = candidate(fw, layout, world)
            stub = Side(forward=None, vjp=None, jvp=None, reference=None, source=name, forward_is_hand=True,
                        candidate=name)
            for (cs, case, size), res in zip(todo, results):
                dtype, shape, trial = cs[0], tuple(cs[1]), cs[2]
                info = (dtype, shape, trial, spec.input_shapes(*shape))
                if "error" in res:                     # nothing of this case could be compared
                    failed = Failed(RuntimeError(), spec.inputs)
                    failed.error, failed.text = res["error"], f"raised {res['error']}"
                    col.compare(spec, info, Oracle(f"{name} impl vs {fw} reference", fw, candidate=name), "forward",
                                failed, None, "", spec.outputs)
                    continue
                compare_case(col, spec, {fw: stub}, case, dtype, shape, trial, {fw: res}, size)
                info = (dtype, shape, trial, spec.input_shapes(*shape))
                if "inplace" in res:
                    _compare_inplace(col, spec, name, case, info, res["inplace"])
                if fw == "torch":
                    _compare_ranks(col, spec, name, info, res.get("ranks"))
                if case.all_paths and "hvp" not in res:
                    col.skip(spec.name, Oracle(f"{name} hand HVP vs {names['hvp']}", fw, candidate=name), "hvp", dtype,
                             f"{name}: no forward-mode rule, which the forward-over-reverse HVP needs")


def _reference_inplace(case) -> dict:
    """The single-device reference on the in-place probe (``torch_side``'s ``inplace_probe``), per output:
    ``(raises, gradients)``: whether autograd refuses the backward after ``out.mul_(0.5)`` (its saved tensor was
    modified), and the gradients of the same program written out of place (``out * 0.5``), which a layout that
    does not raise must give."""
    import torch

    import torch_impl

    from .torch_oracles import to_native
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
        found[out_name] = (_raised(runs[0]), tuple(None if g is None else g.detach().numpy() for g in runs[1]))
    return found


def _compare_inplace(col, spec, name: str, case, info, found: dict) -> None:
    """Rows ``<candidate> backward after an in-place write vs torch reference``: after ``out.mul_(0.5)`` on each
    output, a layout either raises where the reference raises (autograd's version counter: a saved tensor was
    modified), or gives the gradients of the program written out of place; raising where the reference does not,
    or any other gradient (a backward that read a modified saved tensor), disagrees."""
    import math

    from . import metrics
    from .results import Oracle
    oracle = Oracle(f"{name} backward after an in-place write vs torch reference", "torch", candidate=name)
    row = col.row(spec.name, oracle, "vjp", info[0])
    expected, every = _reference_inplace(case), ",".join(spec.inputs)
    for out in ("o", "a"):
        got, (raises, want), where = found.get(out, found.get("error")), expected[out], f"{out}.mul_(0.5) before the backward"
        if not isinstance(got, tuple):                 # the probe itself failed
            diffs = [(every, metrics.Diff(math.inf, math.inf, f"the in-place probe raised {got}"))]
        elif _raised(got):
            diffs = [(every, metrics.Diff(0.0, 0.0) if raises else metrics.Diff(
                math.inf, math.inf, f"raised {got[1]}; the reference computes the gradients"))]
        else:
            diffs = [(inp, metrics.diff(g, w)) for inp, g, w in zip(spec.inputs, got, want)]
        for inp, d in diffs:
            d = dataclasses.replace(d, note=f"{where}: {d.note}" if d.note else where)
            col._record(row, spec, info, oracle, "vjp", inp, ",".join(spec.outputs), d, d.note, "")


def _compare_ranks(col, spec, name: str, info, disagreement: Optional[str]) -> None:
    """One row per case, ``<candidate> every rank ends alike``: the ranks compare what they raised (or that they
    did not) after every case, and rank 0 writes the results; a rank that raised alone, or timed out in a collective
    that another rank never entered, fails here with both outcomes named (rank 0's own rows may look fine)."""
    import math

    from . import metrics
    from .results import Oracle
    oracle = Oracle(f"{name} every rank ends alike", "torch", candidate=name)
    row = col.row(spec.name, oracle, "forward", info[0])
    d = metrics.Diff(math.inf, math.inf, disagreement) if disagreement else metrics.Diff(0.0, 0.0)
    col._record(row, spec, info, oracle, "forward", "-", ",".join(spec.outputs), d, d.note, "", disagreement or "")
