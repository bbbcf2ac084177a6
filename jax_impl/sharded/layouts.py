"""The JAX layouts on global arrays over a mesh, each a function of the lab's contract (``check_inputs`` on global
shapes) and a mesh axis, run as one ``shard_map`` inside its own ``jit``:

* :func:`attn_rows` -- q sharded over rows, k and v replicated (``in_specs=(P(axis), P(), P())``): every device
  runs :func:`jax_impl.attn_block` on its rows, eq. (32) with a single key block.  Forward: no collective.
  Backward: G_Q none; G_K and G_V are sums over the row blocks (35), one all-reduce.  Memory per device: all of
  k and v.
* :func:`ring_attn` -- q, k, v all sharded over rows, k/v blocks passed round the ring
  (``jax_impl.sharded.ring.ring_attn_local``): P - 1 hops forward, P + 1 collective-permutes backward.
* :func:`ring_attn_jvp` -- the ring with the hand-written JVP (forward mode too).
* ``attn_ring`` / ``attn_ring_jvp`` -- the former names of ``ring_attn`` / ``ring_attn_jvp`` (one ring name in both
  frameworks, as ``torch_impl.sharded.ring.ring_attn``): deprecated aliases that warn.

n not divisible by the number of devices P: q, k, v are padded with zero rows up to a multiple of P and the
results cut back (exact: a zero key row gives ``a = tanh(0) = 0``, nothing added to o; padded query rows are
dropped).  (torch's layouts are DTensor placements read by one entry instead: ``torch_impl.sharded.layouts``;
docs/distributed.md compares the two.)
"""

from __future__ import annotations

import functools
import warnings
from functools import partial

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import PartitionSpec as P

from . import rules
from ..output import AttnOutput
from ..validation import check_inputs
from .blocks import attn_block, attn_block_jvp
from .ring import ring_attn_local, ring_attn_local_jvp

__all__ = ["attn_rows", "ring_attn", "ring_attn_jvp", "attn_ring", "attn_ring_jvp", "LAYOUTS"]


# --- global entry points: a layout each ----------------------------------------------------------------------------

def _axis(mesh, axis) -> int:
    if axis not in mesh.axis_names:
        raise ValueError(f"attn(): mesh has no axis {axis!r}; its axes are {tuple(mesh.axis_names)}")
    return mesh.shape[axis]


def _pad_rows(x: Array, multiple: int) -> Array:
    extra = -x.shape[0] % multiple
    return x if extra == 0 else jnp.pad(x, ((0, extra), (0, 0)))


def _local(layout: str, axis):
    """The per-device function of ``layout`` (on local shards, inside ``shard_map``)."""
    if layout == "rows":
        return attn_block
    if layout == "ring":
        return lambda q, k, v: ring_attn_local(q, k, v, axis)
    return lambda q, k, v: ring_attn_local_jvp(q, k, v, axis)


def _specs(layout: str, axis):
    return (P(axis), P(), P()) if layout == "rows" else (P(axis),) * 3


@partial(jax.jit, static_argnames=("layout", "mesh", "axis"))
def _run(q: Array, k: Array, v: Array, *, layout: str, mesh, axis) -> AttnOutput:
    """The layout on global arrays, as one ``jit``: pad, shard, map, cut.

    A ``jit`` of its own, so the entries also run outside the caller's ``jit`` (eagerly, a ``shard_map`` of a
    custom rule with symbolic zeros cannot run, and an eager pad on an Explicit mesh places its result on one
    device); inside the caller's ``jit`` it is inlined.

    n not divisible by P: q, k, v (those sharded over rows) are zero-padded to a multiple of P, and the shards of o
    and a are gathered inside the ``shard_map`` (``all_gather`` to a replicated result, or a ``psum`` of each block
    placed in zeros where ``all_gather`` has no ``to="invarying"``) and cut back to n rows outside.  The cut is
    not a reshard of the row-sharded results to replicated followed by a slice: XLA's CPU backend miscompiles
    that pattern next to the ring's packed hops (jaxlib 0.10.2; docs/upstream-repros/xla_cpu_ring_pad_cut.py)."""
    specs = _specs(layout, axis)
    size = mesh.shape[axis]
    n = q.shape[0]
    inputs = [rules.reshard_on(mesh, _pad_rows(x, size) if spec == P(axis) else x, spec)
              for x, spec in zip((q, k, v), specs)]
    local = _local(layout, axis)
    if n % size == 0:
        return rules.shard_map(local, mesh=mesh, in_specs=specs,
                                  out_specs=AttnOutput(P(axis), P(axis)))(*inputs)

    def gathered(q, k, v):
        return AttnOutput(*(rules.gather_rows(x, axis) for x in local(q, k, v)))

    o, a = rules.shard_map(gathered, mesh=mesh, in_specs=specs, out_specs=AttnOutput(P(), P()))(*inputs)
    return AttnOutput(o[:n], a[:n, :n])


def _sharded(layout: str, q, k, v, mesh, axis) -> AttnOutput:
    check_inputs(q, k, v)                                           # the lab's contract on global shapes
    _axis(mesh, axis)
    q, k, v = (jnp.asarray(x) for x in (q, k, v))
    # the whole op with the layout's derivative rules (ring_jvp: the custom_jvp one, forward mode too); the block
    # contract with m = n, whose rules are jax_impl.attn's / attn_jvp's (check_inputs ran above)
    whole = attn_block_jvp if layout == "ring_jvp" else attn_block
    if q.shape[0] == 0:
        return whole(q, k, v)        # empty: nothing to shard or move (XLA's partitioner rejects 0-row shards)
    try:
        return _run(q, k, v, layout=layout, mesh=mesh, axis=axis)
    except Exception as err:                                        # noqa: BLE001 -- re-raised unless the case below
        if not _axis_taken_by_vmap(err, mesh, axis, q, k, v):
            raise
    # jax.vmap over a batch sharded along ``axis`` itself (Explicit axes): the axis is vmapped away, so the rows
    # cannot be sharded over it (JAX refuses the shard_map).  Each device holds whole problems of the batch: the
    # whole op per problem is the data-parallel layout, and needs no communication.
    return whole(q, k, v)


def _axis_taken_by_vmap(err: Exception, mesh, axis, *arrays) -> bool:
    """Whether ``err``, raised while tracing the layout's ``shard_map``, is JAX refusing ``axis`` in its specs
    because a ``jax.vmap`` batch is sharded along that Explicit axis.  JAX says so in a ValueError naming the
    axis ("in_specs argument must refer to an axis marked as manual", "vmapped away explicit mesh axis", or a
    DuplicateSpecError of the batched reshard); the axis is Explicit on ``mesh`` and in the inputs' types (not
    Manual: the caller's own ``shard_map`` over ``axis`` is a different error, re-raised)."""
    if not (isinstance(err, ValueError) or type(err).__name__ == "DuplicateSpecError"):
        return False
    return (axis in rules.mesh_explicit_axes(mesh) and axis in rules.typed_mesh_axes(*arrays)
            and repr(axis) in str(err))


def attn_rows(q: Array, k: Array, v: Array, *, mesh, axis="x") -> AttnOutput:
    """Tanh attention with q's rows sharded along ``mesh`` axis ``axis`` and k, v replicated (see the module
    docstring).  Global arrays in, global ``AttnOutput(o, a)`` out (o and a sharded over rows; replicated when n
    is not divisible by the axis size).  Runs under ``jax.jit`` or eagerly."""
    return _sharded("rows", q, k, v, mesh, axis)


def ring_attn(q: Array, k: Array, v: Array, *, mesh, axis="x") -> AttnOutput:
    """Tanh attention with q, k, v sharded over rows along ``mesh`` axis ``axis``, k/v blocks passed round a
    ring (``jax_impl.sharded.ring``).  Global arrays in, global ``AttnOutput(o, a)`` out (sharded over rows;
    replicated when n is not divisible by the axis size).  Runs under ``jax.jit`` or eagerly."""
    return _sharded("ring", q, k, v, mesh, axis)


def ring_attn_jvp(q: Array, k: Array, v: Array, *, mesh, axis="x") -> AttnOutput:
    """:func:`ring_attn` with the hand-written JVP (:func:`ring_attn_local_jvp`): forward mode too (at n = 0 by
    ``jax_impl.attn_jvp``)."""
    return _sharded("ring_jvp", q, k, v, mesh, axis)


#: Every sharded layout by name, each ``f(q, k, v, *, mesh, axis)`` on global arrays: what a checker compares with
#: ``jax_impl.attn_reference``.
LAYOUTS = {"rows": attn_rows, "ring": ring_attn, "ring_jvp": ring_attn_jvp}


def _deprecated(new, old: str):
    """``new`` under its former name ``old``, warning (``DeprecationWarning``) on each call."""
    @functools.wraps(new)
    def alias(*args, **kwargs):
        warnings.warn(f"jax_impl: {old}() is deprecated, use jax_impl.sharded.layouts.{new.__name__}() (the ring's "
                      f"name in both frameworks)", DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = old
    return alias


attn_ring = _deprecated(ring_attn, "attn_ring")
attn_ring_jvp = _deprecated(ring_attn_jvp, "attn_ring_jvp")
