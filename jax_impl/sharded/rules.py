"""Sharding plumbing for ``jit`` with ``NamedSharding``: the formulas on meshes with ``Explicit`` axes.

On ``AxisType.Auto`` axes XLA's partitioner places every intermediate and the formulas run as they are.  On
``Explicit`` axes sharding is part of each array's type, and a contraction over a sharded dimension (the rows
layout's (22), ``(grad_o.T @ a).T``) raises ``ShardingTypeError: Contracting dimensions are sharded``.  The remedy
is JAX's public ``jax.sharding.auto_axes``: each rule body (forward (1)-(3), VJP (18)-(22), JVP (14)-(16)) runs
with the explicit axes switched to auto, and its results are resharded to these types:

* forward: ``o`` like q's rows and v's columns, ``a`` like q's rows and k's rows (a mesh axis used by q's rows is
  dropped from the other dimension: one axis cannot shard two dimensions);
* VJP: each gradient its primal's sharding (a custom_vjp's cotangent must have its primal's type);
* JVP: the tangents the outputs' shardings.

Where no input has an explicit axis (Auto meshes, single devices, inside ``shard_map``, JAX releases without
explicit sharding) these three functions are the formulas themselves.  Helpers for ``shard_map`` code
(``jax_impl.attn_block``, ``jax_impl.sharded.ring``, ``layouts``), each feature-detected for the oldest JAX CI
runs: :func:`shard_map` (``check_vma=True``, or ``check_rep=False`` on the legacy ``shard_map``, whose checker
has no rule for a ``custom_vjp`` call), :func:`match_vma` (inputs cast to one varying-axes type) and
:func:`gather_rows` (row blocks gathered to a replicated array).  Versions: docs/distributed-jax.md.
"""

from __future__ import annotations

import inspect
from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import NamedSharding, PartitionSpec

from .. import formulas

__all__ = ["explicit_axes", "output_specs", "attn_forward", "attn_backward", "attn_jvp", "shard_map", "match_vma",
           "axis_size", "mesh_explicit_axes", "reshard_on", "gather_rows"]

# JAX >= 0.5: jax.typeof and auto_axes.  Older releases have no explicit axes, so there is nothing to do there.
_HAS_EXPLICIT = hasattr(jax, "typeof") and hasattr(jax.sharding, "auto_axes")


def explicit_axes(*arrays) -> Tuple[str, ...]:
    """The explicit mesh axes in the types of ``arrays`` that the rules below switch to auto (``()`` when none, or
    when JAX has no explicit axes).

    Inside a ``shard_map`` body (the types' mesh has manual axes), only the explicit axes that shard a dimension
    of one of ``arrays``: an axis no dimension uses cannot make a contraction fail, and wrapping the rules in
    ``auto_axes`` over it anyway made JAX's second linearization of the ``shard_map`` close over an
    explicit-typed residual ("Closing over inputs to shard_map ... is not implemented"): grad of grad of
    ``vmap(layouts.attn_rows)`` with the batch on "dp" and the rows on "sp" of a 2-D mesh raised.  Outside one,
    every explicit axis of the mesh: under ``jax.vmap`` a batch sharded over an axis is invisible in the
    per-example types, and the formulas need that axis auto all the same (``jax.jvp`` of the whole op on a batch
    sharded over "x" raises without it)."""
    typed = typed_mesh_axes(*arrays)
    if not typed or not any(getattr(jax.typeof(x).sharding.mesh, "manual_axes", ()) for x in arrays
                            if x is not None):
        return typed
    used = {name for x in arrays if x is not None for entry in jax.typeof(x).sharding.spec
            for name in _axis_set(entry)}
    return tuple(name for name in typed if name in used)


def typed_mesh_axes(*arrays) -> Tuple[str, ...]:
    """The explicit axes of the mesh in the types of ``arrays``, whether or not a dimension uses them (``()`` when
    none, or when JAX has no explicit axes)."""
    if not _HAS_EXPLICIT:
        return ()
    axes: list = []
    for x in arrays:
        for name in () if x is None else getattr(jax.typeof(x).sharding.mesh, "explicit_axes", ()):
            if name not in axes:
                axes.append(name)
    return tuple(axes)


def _entries(x) -> Tuple:
    """The two entries of a 2-D array's ``PartitionSpec`` (a spec may be shorter than the rank)."""
    spec = tuple(jax.typeof(x).sharding.spec)
    return spec + (None,) * (2 - len(spec))


def _axis_set(entry) -> set:
    if entry is None:
        return set()
    return {entry} if isinstance(entry, str) else set(entry)


def output_specs(q: Array, k: Array, v: Array) -> Tuple[PartitionSpec, PartitionSpec]:
    """The sharding rule of (1)-(3): ``(spec of o, spec of a)`` from the specs of q, k, v.

    o (m, e) takes q's row entry and v's column entry; a (m, n) takes q's row entry and k's row entry.  An entry
    that shares a mesh axis with q's rows is dropped (replicated), since one axis cannot shard two dimensions:
    with q, k, v all sharded over rows, a is sharded over rows only (and XLA gathers k and v for the forward; the
    ring of ``jax_impl.sharded.ring`` is the layout that does not)."""
    q_rows, _ = _entries(q)
    k_rows, _ = _entries(k)
    _, v_cols = _entries(v)
    taken = _axis_set(q_rows)
    o_cols = None if _axis_set(v_cols) & taken else v_cols
    a_cols = None if _axis_set(k_rows) & taken else k_rows
    return PartitionSpec(q_rows, o_cols), PartitionSpec(q_rows, a_cols)


def _sharding(like: Array, spec: PartitionSpec) -> NamedSharding:
    return NamedSharding(jax.typeof(like).sharding.mesh, spec)


def _on_auto_axes(fn, args, out_sharding, axes):
    """``fn(*args)`` with the mesh axes ``axes`` auto inside, its results resharded to ``out_sharding``.

    Every array ``fn`` reads must be in ``args`` (not closed over): ``auto_axes`` converts its arguments' types
    to the auto mesh, and an array closed over would keep its explicit type."""
    return jax.sharding.auto_axes(fn, axes=axes, out_sharding=out_sharding)(*args)


def attn_forward(q: Array, k: Array, v: Array) -> Tuple[Array, Array]:
    """:func:`jax_impl.formulas.attn_forward` (1)-(3), with o, a sharded by :func:`output_specs` on explicit
    axes."""
    axes = explicit_axes(q, k, v)
    if not axes:
        return formulas.attn_forward(q, k, v)
    o_spec, a_spec = output_specs(q, k, v)
    out = (_sharding(q, o_spec), _sharding(q, a_spec))
    return _on_auto_axes(formulas.attn_forward, (q, k, v), out, axes)


def attn_backward(grad_o: Optional[Array], grad_a: Optional[Array], q: Array, k: Array, v: Array, a: Array,
                  output_mask: Sequence[bool] = (True, True, True)
                  ) -> Tuple[Optional[Array], Optional[Array], Optional[Array]]:
    """:func:`jax_impl.formulas.attn_backward` (18)-(22), each gradient with its primal's sharding on explicit
    axes."""
    axes = explicit_axes(q, k, v, a, grad_o, grad_a)
    if not axes:
        return formulas.attn_backward(grad_o, grad_a, q, k, v, a, output_mask)
    # The gradients the formulas return (the others are None, for which auto_axes wants no sharding):
    # G_V needs G_O (22); G_Q and G_K need Ĝ_A (18), i.e. either cotangent.
    reach = (grad_a is not None or grad_o is not None,) * 2 + (grad_o is not None,)
    present = [r and m for r, m in zip(reach, output_mask)]
    out = tuple(jax.typeof(x).sharding if p else None for x, p in zip((q, k, v), present))

    def backward(grad_o, grad_a, q, k, v, a):
        return formulas.attn_backward(grad_o, grad_a, q, k, v, a, output_mask)

    return _on_auto_axes(backward, (grad_o, grad_a, q, k, v, a), out, axes)


def attn_jvp(q: Array, k: Array, v: Array, a: Array, q_dot: Optional[Array], k_dot: Optional[Array],
             v_dot: Optional[Array]) -> Tuple[Array, Array]:
    """:func:`jax_impl.formulas.attn_jvp` (14)-(16), the tangents sharded like the outputs on explicit axes."""
    axes = explicit_axes(q, k, v, a, q_dot, k_dot, v_dot)
    if not axes:
        return formulas.attn_jvp(q, k, v, a, q_dot, k_dot, v_dot)
    o_spec, a_spec = output_specs(q, k, v)
    out = (_sharding(q, o_spec), _sharding(q, a_spec))
    return _on_auto_axes(formulas.attn_jvp, (q, k, v, a, q_dot, k_dot, v_dot), out, axes)


# --- shard_map plumbing ----------------------------------------------------------------------------------------

def shard_map(f, *, mesh, in_specs, out_specs):
    """``f`` mapped over ``mesh``: ``jax.shard_map(..., check_vma=True)`` (JAX >= 0.6: the varying-axes checker
    on), else ``jax.experimental.shard_map.shard_map(..., check_rep=False)`` (JAX 0.4.30, whose check_rep=True has
    no replication rule for a ``custom_vjp`` call and raises NotImplementedError; the gradients of replicated
    inputs are summed over the devices either way, by shard_map's transpose)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=True)
    from jax.experimental.shard_map import shard_map as legacy_shard_map   # JAX 0.4.30
    return legacy_shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def mesh_explicit_axes(mesh) -> Tuple[str, ...]:
    """The axes of ``mesh`` of type ``AxisType.Explicit`` (``()`` on JAX releases without them)."""
    return tuple(getattr(getattr(mesh, "abstract_mesh", mesh), "explicit_axes", ()))


def reshard_on(mesh, x: Array, spec: PartitionSpec) -> Array:
    """``x`` resharded to ``spec`` on a mesh with explicit axes, where ``shard_map`` requires its inputs' types to
    match its ``in_specs`` and a slice must keep a whole shard per device; on Auto axes XLA reshards by itself,
    and ``x`` is returned as it is."""
    if not mesh_explicit_axes(mesh):
        return x
    return jax.sharding.reshard(x, NamedSharding(mesh, spec))


def _has_all_gather_to() -> bool:
    try:
        return "to" in inspect.signature(jax.lax.all_gather).parameters
    except (TypeError, ValueError):                                # pragma: no cover -- a signature-less builtin
        return False


_ALL_GATHER_INVARIANT = _has_all_gather_to()                      # JAX >= 0.8: all_gather(..., to="invarying")


def gather_rows(x: Array, axis_name) -> Array:
    """Inside ``shard_map``: the row blocks of ``x`` along ``axis_name`` stacked in device order, the same on
    every device and typed so (invariant), so it may leave the ``shard_map`` with ``out_specs=P()``.

    ``jax.lax.all_gather(..., tiled=True, to="invarying")`` (its transpose is each device's slice of the
    cotangent: no communication); on JAX releases without ``to``, a ``psum`` of the block placed in zeros at
    its rows (the same result; an all-reduce moves twice an all-gather's bytes)."""
    if _ALL_GATHER_INVARIANT:
        return jax.lax.all_gather(x, axis_name, tiled=True, to="invarying")
    rows = x.shape[0]
    zeros, x = match_vma(jnp.zeros((axis_size(axis_name) * rows,) + x.shape[1:], x.dtype), x)
    placed = jax.lax.dynamic_update_slice_in_dim(zeros, x, jax.lax.axis_index(axis_name) * rows, axis=0)
    return jax.lax.psum(placed, axis_name)


def axis_size(axis_name) -> int:
    """The number of devices along the ``shard_map`` axis ``axis_name`` (a Python int)."""
    if hasattr(jax.lax, "axis_size"):
        return jax.lax.axis_size(axis_name)
    return jax.lax.psum(1, axis_name)                              # JAX 0.4.30: a constant, folded statically


def _varying_axes(x) -> frozenset:
    """The ``shard_map`` axes ``x`` varies over: ``jax.typeof(x).manual_axis_type.varying`` (JAX 0.10), or
    ``jax.typeof(x).vma`` (JAX 0.6 - 0.9)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def match_vma(*arrays):
    """``arrays`` cast to one type: each varying over every ``shard_map`` axis that any of them varies over.

    Inside ``shard_map`` with ``check_vma=True`` an array's type records the mesh axes it varies over (``vma``).
    A ``custom_vjp`` bwd rule must return cotangents of its primals' types, but the gradient of a replicated k
    computed from a varying q varies.  Casting k to varying *before* the custom rule (``jax.lax.pcast(...,
    to="varying")``) states what the math is: each device uses k in its own block, and JAX's transpose of that
    cast sums the blocks' gradients over the axis (a ``psum``: (35), Σ over query blocks).  Without vma types
    (JAX < 0.6) the arrays are returned as they are.

    A matrix is cast transposed (``_to_varying``): the psum then runs on the gradient's transpose, G_Kᵀ = Qᵀ G_X
    (d, n) and G_Vᵀ = G_Oᵀ A (e, n), and XLA keeps those products, which read the (m, n) G_X and A by rows,
    transposing only the small summed result.  Cast as it is, the psum takes G_K (n, d) and G_V (n, e), and XLA
    folds the formulas' transposes into dots that contract G_X's and A's rows, a slower kernel on CPU (figures:
    docs/distributed-jax.md, "Benchmark")."""
    if not (hasattr(jax, "typeof") and hasattr(jax.lax, "pcast")):
        return arrays
    vmas = [_varying_axes(x) for x in arrays]
    union = frozenset().union(*vmas)
    return tuple(x if vma == union else _to_varying(x, tuple(union - vma)) for x, vma in zip(arrays, vmas))


def _to_varying(x: Array, axes) -> Array:
    """``jax.lax.pcast(x, axes, to="varying")``, done on the transpose of a matrix (see ``match_vma``)."""
    if x.ndim < 2:
        return jax.lax.pcast(x, axes, to="varying")
    return jnp.swapaxes(jax.lax.pcast(jnp.swapaxes(x, -1, -2), axes, to="varying"), -1, -2)
