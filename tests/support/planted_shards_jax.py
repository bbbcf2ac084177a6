"""A deliberately wrong JAX sharded layout, for tests/crosscheck/test_shards.py (``--jax-layouts
tests/support/planted_shards_jax.py:LAYOUTS``): a ring over q, k, v sharded by rows that drops the last hop's
contribution: every block A_IJ is written into a, but the last key block that reaches a device is never added to
its o (32).  Differentiated by JAX's autodiff (no custom rule); n not divisible by the devices is padded as
``jax_impl.sharded.layouts`` does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from functools import partial

from jax_impl import attn, formulas
from jax_impl.sharded import rules
from jax_impl.output import AttnOutput


def _ring_drop_last(q, k, v, axis):
    size, me, width = rules.axis_size(axis), jax.lax.axis_index(axis), k.shape[0]
    q, k, v = rules.match_vma(q, k, v)
    perm = [(i, (i + 1) % size) for i in range(size)]
    o = a = None
    for s in range(size):
        j = (me - s) % size
        o_ij, a_ij = formulas.attn_forward(q, k, v)
        if s < size - 1:                                            # planted: the last hop's block is not added
            o = o_ij if o is None else o + o_ij
        cols = jnp.zeros((q.shape[0], size * width), a_ij.dtype) if a is None else a
        a = jax.lax.dynamic_update_slice_in_dim(cols, a_ij, j * width, axis=1)
        k, v = jax.lax.ppermute(k, axis, perm), jax.lax.ppermute(v, axis, perm)
    return AttnOutput(o, a)


def ring_drop_last(q, k, v, *, mesh, axis="x"):
    if q.shape[0] == 0:                                             # nothing to shard, as jax_impl.sharded.layouts does
        return attn(q, k, v)
    return _padded(q, k, v, mesh=mesh, axis=axis)


@partial(jax.jit, static_argnames=("mesh", "axis"))
def _padded(q, k, v, *, mesh, axis):
    """Pad the rows to a multiple of the devices, shard, run the planted ring, gather the rows and cut back."""
    size, n = mesh.shape[axis], q.shape[0]
    extra = -n % size
    q, k, v = (rules.reshard_on(mesh, jnp.pad(x, ((0, extra), (0, 0))), P(axis)) for x in (q, k, v))

    def local(q, k, v):
        return AttnOutput(*(rules.gather_rows(x, axis) for x in _ring_drop_last(q, k, v, axis)))

    o, a = rules.shard_map(local, mesh=mesh, in_specs=(P(axis),) * 3, out_specs=AttnOutput(P(), P()))(q, k, v)
    return AttnOutput(o[:n], a[:n, :n])


LAYOUTS = {"ring": ring_drop_last}
