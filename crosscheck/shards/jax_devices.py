"""The JAX side of ``--shards``: each layout of ``jax_impl.sharded.layouts.LAYOUTS`` (and the lab's entries under
``jit`` with sharded rows) as a candidate on ``world`` host devices, on an Auto and an Explicit mesh, run by :func:`main` in the
child of ``run_layouts``.

This module imports JAX at its top: only that child imports it, whose ``XLA_FLAGS`` (set by the parent before the
child starts) give JAX its ``world`` host devices.  The parent of the run never imports it: XLA reads the flag
once, when JAX is imported, and the parent's JAX keeps its own devices.
"""

from __future__ import annotations

import dataclasses
import pickle
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jax_impl
from jax_impl.sharded import layouts as ring

from ..errors import first_line
from ..jax_executor import JaxExecutor
from ..jax_oracles import context, hand_jvp
from ..specs import Side, _hand_side
from ..remote.process import run_job
from .payload import Payload, candidate

__all__ = ["jax_side", "JIT_LAYOUTS", "MESH_SUFFIX", "main"]

MESH_SUFFIX = {"auto": "", "explicit": "@explicit"}     # a layout on an Explicit mesh: "ring@explicit"
JIT_LAYOUTS = ("jit_rows", "jit_rows_jvp")              # XLA's partitioner places them: Auto meshes only


def jax_side(layout: str, fn, mesh, world: int) -> Side:
    """The JAX candidate of layout ``fn`` on ``mesh`` (axis "x"), differentiated as the single-device entry.  Whether
    it has a forward-mode rule is asked of JAX once, by lowering a ``jax.jvp`` (else a request that cannot be
    traced would be found request by request, one lowering each): a ``custom_vjp`` layout's JVP rows are skipped
    with JAX's refusal; any other error leaves the rows to run, and fail."""
    name = candidate("jax", layout, world)
    entry = partial(fn, mesh=mesh, axis="x")
    source = f"jax_impl.sharded.layouts.LAYOUTS[{layout!r}] on {world} host devices"
    side = dataclasses.replace(_hand_side("jax", entry, source, key=("sharded", layout, world, fn)),
                               autodiff_probe=None, candidate=name)
    x = jnp.zeros((world, 2))
    try:
        jax.jit(lambda x: hand_jvp(entry)((x, x, x), [(x, x, x)])).lower(x)
    except Exception as exc:                           # noqa: BLE001 - which one is decided just below
        if not _no_forward_mode(exc):                  # any other error is the layout's: its JVP rows fail
            return side
        return dataclasses.replace(side, jvp=None, jvp_missing=f"{name}: no forward-mode rule ({first_line(exc)})")
    return side


def _no_forward_mode(exc: BaseException) -> bool:
    """JAX's refusal to forward-differentiate a ``custom_vjp`` function (what the custom_vjp layouts answer), as
    opposed to a layout whose forward-mode rule exists and fails."""
    return "forward-mode" in str(exc) and "custom_vjp" in str(exc)


def _on_rows(entry):
    """``entry`` with q's rows sharded by a ``NamedSharding`` (k, v replicated; XLA's partitioner places the rest)."""
    def layout(q, k, v, *, mesh, axis="x"):
        rows, whole = NamedSharding(mesh, PartitionSpec(axis)), NamedSharding(mesh, PartitionSpec())
        constrain = jax.lax.with_sharding_constraint
        return entry(constrain(q, rows), constrain(k, whole), constrain(v, whole))
    return layout


def _jit_layouts() -> dict:
    """The lab's JAX entries (``jit_rows``: ``jax_impl.attn``, ``jit_rows_jvp``: ``attn_jvp``) under ``jit``, q's rows
    sharded."""
    return dict(zip(JIT_LAYOUTS, (_on_rows(jax_impl.attn), _on_rows(jax_impl.attn_jvp))))


def _meshes(world: int):
    """The meshes every JAX layout runs on: one 1-D axis "x" of ``world`` devices with Auto axis types (what
    ``jax.sharding.Mesh`` makes) and, where this JAX has explicit sharding (``jax.sharding.AxisType``), the same with
    Explicit axis types (``jax.make_mesh``'s default in recent JAX): XLA partitions the two differently."""
    devices = np.array(jax.devices()[:world])
    yield "auto", Mesh(devices, ("x",))
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is not None and hasattr(axis_type, "Explicit"):
        yield "explicit", Mesh(devices, ("x",), axis_types=(axis_type.Explicit,))


def _mesh_results(payload: Payload, layouts: dict, kind: str, mesh) -> dict:
    """Every layout of ``layouts`` that runs on a ``kind`` mesh, on every case: ``{layout + suffix: [results]}``,
    every program prefetched before the first runs."""
    with context("cpu"):
        executor = JaxExecutor("jax", "cpu", sharding=NamedSharding(mesh, PartitionSpec()))
        try:
            jobs = {}
            for name, fn in layouts.items():
                if kind != "auto" and name in JIT_LAYOUTS:     # with_sharding_constraint: Auto axes only
                    continue
                key = name + MESH_SUFFIX[kind]
                jobs[key] = [payload.job(jax_side(key, fn, mesh, payload.world), cs) for cs in payload.cases]
                for job in jobs[key]:
                    executor.prefetch(job)
            return {key: [run_job(executor, job) for job in layout_jobs] for key, layout_jobs in jobs.items()}
        finally:
            executor.close()


def main(payload_path: str, out_path: str) -> None:
    """The child of ``run_layouts`` for JAX (XLA_FLAGS set by the parent): every layout on every case."""
    with open(payload_path, "rb") as f:
        payload: Payload = pickle.load(f)
    world = payload.world
    if len(jax.devices()) < world:
        raise SystemExit(f"JAX has {len(jax.devices())} devices, {world} asked for")
    layouts = payload.named_layouts("--jax-layouts") or {**ring.LAYOUTS, **_jit_layouts()}
    results = {}
    for kind, mesh in _meshes(world):
        results.update(_mesh_results(payload, layouts, kind, mesh))
    with open(out_path, "wb") as f:
        pickle.dump(results, f)
