"""A deliberately wrong JAX sharded layout, for tests/test_crosscheck_shards.py (``--jax-layouts
tests/support/planted_shards_jax.py:LAYOUTS``): a ring over q, k, v sharded by rows that drops the last hop's
contribution: every block A_IJ is written into a, but the last key block that reaches a device is never added to
its o (32).  Differentiated by JAX's autodiff (no custom rule); n not divisible by the devices is padded as
``jax_impl.ring``'s layouts do."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jax_impl import formulas, sharding
from jax_impl.core import AttnOutput
from jax_impl.ring import _sharded


def _ring_drop_last(q, k, v, axis):
    size, me, width = sharding.axis_size(axis), jax.lax.axis_index(axis), k.shape[0]
    q, k, v = sharding.match_vma(q, k, v)
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
    return _sharded(lambda q, k, v: _ring_drop_last(q, k, v, axis), (P(axis),) * 3, q, k, v, mesh, axis)


LAYOUTS = {"ring": ring_drop_last}
