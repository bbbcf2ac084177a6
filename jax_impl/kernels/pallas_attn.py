r"""Fused Pallas kernels for tanh attention: the tiling (32)-(35) of derivation.md, section 15 (docs/kernels-pallas.md).

Entry points, each a custom-derivative function whose first-order rules are ``pl.pallas_call`` kernels:

* :func:`attn_o` -- ``o = tanh(q kᵀ [masked]) v`` for stacks ``(..., n, ·)``, optionally causal; no n×n array,
  forward or backward (the backward recomputes the tiles of A).  Reverse mode (``jax.custom_vjp``).
* :func:`attn_o_jvp` -- the same ``o`` with forward mode only (``jax.custom_jvp``, the tangent kernel (36)).
* :func:`attn_fused` -- the lab's op ``(o, a)`` (2-D, ``jax.custom_vjp``): ``a`` written once, read by tiles.

Their drivers mirror ``torch_impl.kernels`` function for function: :func:`o_only_forward`, :func:`o_only_backward`,
:func:`fused_forward`, :func:`fused_backward` (and :func:`o_only_jvp`, torch_impl's ``o_only_jvp_blocks``).  JAX's
convention: real dtypes only, so (33)-(35) are read with the bars dropped.

**Higher orders.**  Each of the four drivers is a ``jax.custom_jvp`` whose value is its kernels' and whose tangent
is the same step in ``jnp`` from ``jax_impl.formulas`` (linear, so JAX transposes it): gradients of gradients,
Hessian-vector products and higher orders are exact, at the cost of each stack member's n×n ``a`` (and ``G_X``).

**Interpret mode.**  ``interpret=None`` means ``jax.default_backend() == "cpu"``: there the kernels run under
Pallas' interpreter (ordinary XLA on the host: exact for the tiling, masks, padding and equations; nothing about
the GPU).  On a GPU they lower through Pallas' Triton backend, which every ``pallas_call`` selects (:func:`_call`).

Tiles, padding, launch configurations (:class:`LaunchConfig`, :func:`launch_config`) and dtypes: the comments
at each section below; the figures behind the defaults: docs/kernels-pallas.md.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.custom_derivatives import SymbolicZero
from jax.experimental import pallas as pl

import attn_contract
from .. import formulas
from ..output import AttnOutput
from ..validation import FRAMEWORK

__all__ = [
    "attn_o", "attn_o_jvp", "attn_o_reference", "attn_fused", "o_only_forward", "o_only_backward", "o_only_jvp", "fused_forward",
    "fused_backward", "check_stack_inputs",
    "default_interpret", "KERNEL_DTYPES", "KERNEL_MESSAGES", "LaunchConfig", "KERNELS", "launch_config",
    "APPROX_TANH_REL_ERROR",
]

MIN_BLOCK = 16                  # Triton's dot: every dimension of a tile a power of two, at least 16

# The kernels' dtypes: attn_contract.DTYPES without the complex ones.
KERNEL_DTYPES = ("float16", "bfloat16", "float32", "float64")

# Messages of attn_o's stacked contract: attn_contract.STACK_MESSAGES (shared with torch_impl.kernels.o_only;
# "type" and "same_dtype" from attn_contract.MESSAGES), plus "dtype" (no complex here) and "block".  {fn}: the entry.
KERNEL_MESSAGES = {
    **attn_contract.STACK_MESSAGES,
    "dtype": ("{fn}(): argument '{name}' must have a real floating-point dtype (" + ", ".join(KERNEL_DTYPES[:-1])
              + " or " + KERNEL_DTYPES[-1] + "; the kernels have no complex path), got {dtype}"),
    "block": "{fn}(): {name} must be a positive int or None, got {value!r}",
}
_STACK_DIMS = attn_contract.STACK_DIMS


def default_interpret() -> bool:
    """``True`` where the default backend is the CPU: there Pallas can only interpret the kernels."""
    return jax.default_backend() == "cpu"


# --- input checks (before any compute, at trace time) ---------------------------------------------------------

def _check_dtype(fn, names_and_args):
    for name, t in names_and_args:
        dtype = FRAMEWORK.dtype_name(t.dtype)
        if dtype not in KERNEL_DTYPES:
            raise TypeError(KERNEL_MESSAGES["dtype"].format(fn=fn, name=name, dtype=dtype))


def _check_blocks(fn, sizes):
    for name, value in sizes.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(KERNEL_MESSAGES["block"].format(fn=fn, name=name, value=value))


def check_stack_inputs(q, k, v, causal=False, *, fn: str = "attn_o") -> None:
    """The stacked contract of :func:`attn_o`: ``q (..., n, d)``, ``k (..., n, d)``, ``v (..., n, e)`` with the
    same leading dimensions, one real floating dtype; ``causal`` a bool.  Raises ``TypeError`` / ``ValueError``
    naming the argument, in torch_impl's ``check_o_inputs`` order; any size may be 0."""
    args = (q, k, v)
    for name, t in zip(attn_contract.NAMES, args):
        if not isinstance(t, FRAMEWORK.array_types):
            raise TypeError(attn_contract.message("type", fn, name=name, accepted=FRAMEWORK.accepted,
                                                  type=attn_contract.type_name(t)))
        if t.ndim < 2:
            raise ValueError(KERNEL_MESSAGES["ndim"].format(fn=fn, name=name, dims=_STACK_DIMS[name], ndim=t.ndim,
                                                            shape=tuple(t.shape)))
        _check_dtype(fn, [(name, t)])
    if not isinstance(causal, bool):
        raise TypeError(KERNEL_MESSAGES["causal"].format(fn=fn, type=attn_contract.type_name(causal)))
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(KERNEL_MESSAGES["d"].format(fn=fn, q=tuple(q.shape), k=tuple(k.shape)))
    if not (q.shape[:-1] == k.shape[:-1] == v.shape[:-1]):
        raise ValueError(KERNEL_MESSAGES["n"].format(fn=fn, q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape)))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(attn_contract.message("same_dtype", fn, **{n: FRAMEWORK.dtype_name(t.dtype)
                                                                   for n, t in zip(attn_contract.NAMES, args)}))


# --- shapes: tiles and zero padding -----------------------------------------------------------------------------
# Each tile is used as min(block, max(16, next_power_of_2(n))), so a short sequence is not padded to a long tile; n
# is padded with zero rows to a multiple of both tiles, d and e with zero columns to max(16, next_power_of_2(·)).
# Zero padding is exact without a mask (docs/kernels-pallas.md, *Padding*); for attn_fused a padded n costs a copy
# of a (forward) and a padding of a and G_A (backward): choose n a multiple of the tiles to avoid it.

class _Tiles(NamedTuple):
    n: int           # true sequence length
    n_pad: int       # padded to a multiple of both tiles
    bq: int          # query tile
    bk: int          # key tile


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _feature_pad(size: int) -> int:
    return max(MIN_BLOCK, pl.next_power_of_2(size))


def _tiles(n: int, block_q: int, block_k: int) -> _Tiles:
    cap = max(MIN_BLOCK, pl.next_power_of_2(n))
    bq, bk = min(block_q, cap), min(block_k, cap)
    return _Tiles(n, _round_up(n, math.lcm(bq, bk)), bq, bk)


def _pad(x: Array, rows: int, cols: int) -> Array:
    """Zero-pad the last two dimensions of ``x`` to ``(rows, cols)`` (no copy when nothing is padded)."""
    pads = [(0, 0)] * (x.ndim - 2) + [(0, rows - x.shape[-2]), (0, cols - x.shape[-1])]
    return x if all(p == (0, 0) for p in pads) else jnp.pad(x, pads)


def _acc_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _precision(dtype):
    # float32 tiles: IEEE products (the Triton lowering reads DEFAULT as TF32).  16-bit inputs: the tensor cores'
    # native products with a float32 accumulator.
    return lax.Precision.HIGHEST if np.dtype(dtype) in (np.float32, np.float64) else None


def _dot(a, b, acc, *, ta=False, tb=False):
    """``a @ b`` (``aᵀ`` with ``ta``, ``bᵀ`` with ``tb``), accumulated in ``acc``'s dtype."""
    dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=_precision(a.dtype), preferred_element_type=acc)


def _div(x, m: int):
    """``x // m`` for a non-negative traced int (the program id's dtype, also under ``jax_enable_x64``)."""
    return lax.div(x, jnp.asarray(m, x.dtype))


def _causal_keep(i, j, bq: int, bk: int):
    """Tile (I, J) of the causal mask: key index <= query index (the rest: a = 0 and no gradient)."""
    rows = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    cols = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    return cols <= rows


# --- launch configuration: tiles and Pallas' Triton options, as data ---------------------------------------------

class LaunchConfig(NamedTuple):
    """One kernel's launch configuration: its query and key tiles and Pallas' Triton options (JAX's
    ``jax/experimental/pallas/ops/gpu/attention.py`` ``BlockSizes`` plus the ``num_warps`` / ``num_stages`` it
    passes through ``compiler_params``; named and ordered as ``torch_impl.kernels.triton_attn.LaunchConfig``).
    ``block_q`` / ``block_k`` are capped by the sequence (shapes section)."""
    block_q: int
    block_k: int
    num_warps: int
    num_stages: int


#: The kernels, by the names of their ``pallas_call`` (``tanh_attn_<kernel>``) and of :func:`launch_config`.
KERNELS = ("o_forward", "o_dkdv", "o_dq", "o_jvp", "fused_forward", "fused_dkdv", "fused_dq")

# Defaults per (kernel, "16" (float16 / bfloat16) or "32" (float32 / float64), widest padded head dimension),
# chosen with benchmarks/gpu_static/pallas_side.py (``--sweep``); the <= 256 column also serves wider heads.  What
# each column was checked on, and the figures behind the choices: docs/kernels-pallas.md, *Launch configurations*.
_FEATURES = (64, 128, 256)
_B = LaunchConfig
_DEFAULTS = {
    # kernel, dtype          d,e <= 64           <= 128              <= 256
    ("o_forward", "16"): (_B(64, 64, 4, 3), _B(64, 64, 4, 3), _B(32, 32, 4, 2)),
    ("o_dkdv", "16"): (_B(64, 64, 4, 2), _B(128, 64, 8, 2), _B(32, 32, 8, 1)),
    ("o_dq", "16"): (_B(64, 64, 4, 2), _B(64, 32, 4, 2), _B(32, 32, 4, 1)),
    ("o_jvp", "16"): (_B(64, 64, 4, 2), _B(64, 32, 4, 2), _B(32, 32, 4, 1)),
    ("fused_forward", "16"): (_B(64, 64, 4, 3), _B(64, 64, 4, 3), _B(32, 32, 4, 2)),
    ("fused_dkdv", "16"): (_B(64, 64, 8, 2), _B(32, 64, 4, 2), _B(32, 32, 8, 1)),
    ("fused_dq", "16"): (_B(64, 64, 4, 2), _B(64, 32, 4, 2), _B(32, 32, 4, 1)),
    ("o_forward", "32"): (_B(32, 32, 4, 2), _B(32, 32, 4, 2), _B(16, 16, 4, 1)),
    ("o_dkdv", "32"): (_B(16, 32, 4, 1), _B(16, 32, 4, 1), _B(16, 16, 4, 1)),
    ("o_dq", "32"): (_B(32, 32, 8, 2), _B(32, 32, 8, 2), _B(16, 16, 8, 1)),
    ("o_jvp", "32"): (_B(16, 16, 8, 1), _B(16, 16, 8, 1), _B(16, 16, 8, 1)),
    ("fused_forward", "32"): (_B(32, 32, 4, 2), _B(32, 32, 4, 2), _B(16, 16, 4, 1)),
    ("fused_dkdv", "32"): (_B(16, 16, 4, 1), _B(16, 16, 4, 1), _B(16, 16, 4, 1)),
    ("fused_dq", "32"): (_B(32, 16, 4, 2), _B(32, 16, 4, 2), _B(16, 16, 4, 1)),
}
del _B


def _width(dtype) -> str:
    return "16" if np.dtype(dtype).itemsize == 2 else "32"


def launch_config(kernel: str, dtype, d: int, e: int) -> LaunchConfig:
    """The launch configuration ``kernel`` (one of :data:`KERNELS`) uses for inputs of ``dtype`` with head
    dimensions ``d`` (q, k) and ``e`` (v) when the entry is given no ``block_q`` / ``block_k`` / ``num_warps`` /
    ``num_stages``: a config the GPU-static check compiled spill-free for sm_90a."""
    if kernel not in KERNELS:
        raise ValueError(f"launch_config(): kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    width = max(_feature_pad(d), _feature_pad(e))
    column = next((c for c, f in enumerate(_FEATURES) if width <= f), len(_FEATURES) - 1)
    return _DEFAULTS[kernel, _width(dtype)][column]


class _Config(NamedTuple):          # hashable: a nondiff (static) argument of the custom-derivative functions
    causal: bool
    block_q: Optional[int]          # None: the kernel's default (launch_config); else the caller's, for all
    block_k: Optional[int]
    num_warps: Optional[int]
    num_stages: Optional[int]
    interpret: bool


def _config(fn, causal, block_q, block_k, num_warps, num_stages, interpret) -> _Config:
    """The entries' static arguments, checked (naming the argument) and made hashable."""
    sizes = dict(block_q=block_q, block_k=block_k, num_warps=num_warps, num_stages=num_stages)
    _check_blocks(fn, sizes)
    return _Config(bool(causal), *(None if x is None else int(x) for x in sizes.values()), _resolve(interpret))


def _launch(kernel: str, cfg: _Config, dtype, d: int, e: int) -> LaunchConfig:
    """``kernel``'s configuration: the default for (dtype, d, e), with every field the caller gave in its place."""
    default = launch_config(kernel, dtype, d, e)
    return LaunchConfig(*(given if given is not None else dflt
                        for given, dflt in zip((cfg.block_q, cfg.block_k, cfg.num_warps, cfg.num_stages), default)))


def _triton_params(num_warps: int, num_stages: int):
    """``compiler_params`` selecting Pallas' Triton backend with these options, under the first of these names the
    installed JAX has, else the plain dict the oldest supported JAX reads (which JAX has which: docs/kernels-pallas.md,
    *Launch configurations*).  Without it JAX may lower with Mosaic GPU, which these kernels do not fit."""
    import importlib
    for module, name in (("jax.experimental.pallas.triton", "CompilerParams"),
                         ("jax.experimental.pallas.triton", "TritonCompilerParams"),
                         ("jax.experimental.pallas.gpu", "TritonCompilerParams")):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            cls = None
        if cls is not None:
            return cls(num_warps=num_warps, num_stages=num_stages)
    return dict(triton=dict(num_warps=num_warps, num_stages=num_stages))


def _call(kernel: str, body, bs: LaunchConfig, interpret: bool, **kwargs):
    """``pl.pallas_call`` of one of :data:`KERNELS` on Pallas' Triton backend with ``bs``'s options."""
    return pl.pallas_call(body, interpret=interpret, name=f"tanh_attn_{kernel}",
                          compiler_params=_triton_params(bs.num_warps, bs.num_stages), **kwargs)


# --- tanh in the kernels -------------------------------------------------------------------------------------------

#: Maximum relative error of the GPU's ``tanh.approx.f32`` (one MUFU.TANH), per the PTX ISA: 2^-10.987.
APPROX_TANH_REL_ERROR = 2.0 ** -10.987


def _approx_tanh():
    import importlib
    for module in ("jax.experimental.pallas.triton", "jax.experimental.pallas.gpu"):
        try:
            fn = getattr(importlib.import_module(module), "approx_tanh", None)
        except ImportError:
            fn = None
        if fn is not None:
            return fn
    raise NotImplementedError(f"this JAX ({jax.__version__}) has no Pallas approx_tanh: pass interpret=True")


def _fast_tanh(dtype, interpret: bool) -> bool:
    """Hardware tanh (one MUFU.TANH per score, ``tanh.approx.f32``) for float16 / bfloat16 inputs on the GPU: its
    relative error 2^-10.987 is below bfloat16's half ulp 2^-9 and about float16's 2^-11, and ``a`` is rounded to
    the input dtype before its product with ``v`` anyway.  float32 / float64 keep the accurate tanh (libdevice's
    ``tanhf``), and the interpreter always does (it cannot run inline assembly)."""
    return (not interpret) and np.dtype(dtype).itemsize == 2


def _tanh(x, fast: bool):
    """``tanh x`` of a float32 (float64) score tile: ``jnp.tanh`` (relative precision to an ulp at every |x|,
    also where ``tanh x ≈ x`` is tiny), or the hardware one where :func:`_fast_tanh` allows it."""
    return _approx_tanh()(x) if fast else jnp.tanh(x)


# --- the kernels: one tile loop per direction, for both ops (as torch_impl's triton_attn) ------------------------
# Refs carry no batch dimension (BlockSpec's None squeezes it); program_id(0) is the batch, program_id(1) the tile.
# Static flags specialise each body: ``causal`` (the mask (37); o only), ``store_a`` (the forward writes A: the lab's
# op), ``saved_a`` (the backward reads A's tiles instead of recomputing them: the lab's op), ``has_go`` / ``has_ga``
# (which cotangents are given; o only: G_O alone).  An absent ref is not an argument at all.

def _g_x(a, acc_t, go, v, ga):
    """(33) on one tile: ``G_X,IJ = (G_O,I V_Jᵀ + G_A,IJ) ⊙ (1 − A_IJ²)``, either cotangent possibly absent."""
    g_hat = None if go is None else _dot(go, v, acc_t, tb=True)
    if ga is not None:
        g_hat = ga.astype(acc_t) if g_hat is None else g_hat + ga
    a = a.astype(acc_t)
    return g_hat * (1 - a * a)


def _take(refs, *given):
    """Split a kernel's refs: the next ref for each flag that is set, ``None`` for each that is not."""
    return [refs.pop(0) if flag else None for flag in given]


def _forward_kernel(*refs, bk: int, n_k: int, causal: bool, store_a: bool, fast_tanh: bool):
    refs = list(refs)
    q_ref, k_ref, v_ref, o_ref = refs[:4]
    (a_ref,) = _take(refs[4:], store_a)
    i = pl.program_id(1)
    bq = q_ref.shape[0]
    q = q_ref[...]
    acc_t = _acc_dtype(q.dtype)

    def body(j, acc):
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        v = v_ref[keys, :]
        a = _tanh(_dot(q, k_ref[keys, :], acc_t, tb=True), fast_tanh)   # (32): X_IJ = Q_I K_Jᵀ, A_IJ = tanh X_IJ
        if causal:
            a = jnp.where(_causal_keep(i, j, bq, bk), a, 0)
        a = a.astype(v.dtype)
        if a_ref is not None:
            a_ref[:, keys] = a.astype(a_ref.dtype)                  # a written once, tile by tile
        return acc + _dot(a, v, acc_t)                              # (32): O_I += A_IJ V_J, from the same tile

    # Causal: key tiles past the diagonal are all masked; the loop stops at the last tile touching it (never with
    # store_a: those tiles of a would stay unwritten).
    stop = _div((i + 1) * bq + bk - 1, bk) if causal else n_k
    acc = lax.fori_loop(0, stop, body, jnp.zeros(o_ref.shape, acc_t))
    o_ref[...] = acc.astype(o_ref.dtype)


def _dkdv_kernel(*refs, bq: int, n_q: int, causal: bool, saved_a: bool, has_go: bool, has_ga: bool,
                 fast_tanh: bool):
    refs = list(refs)
    q_ref, k_ref, v_ref = refs[:3]
    a_ref, go_ref, ga_ref, dk_ref, dv_ref = _take(refs[3:], saved_a, has_go, has_ga, True, has_go)
    j = pl.program_id(1)
    bk = k_ref.shape[0]
    k, v = k_ref[...], v_ref[...]
    acc_t = _acc_dtype(k.dtype)

    def body(i, carry):
        dk, dv = carry
        queries = pl.ds(pl.multiple_of(i * bq, bq), bq)
        q = q_ref[queries, :]
        if a_ref is not None:
            a = a_ref[queries, :]                                   # tile (I, J) of a, read once
        else:
            a = _tanh(_dot(q, k, acc_t, tb=True), fast_tanh)       # (32), recomputed
        go = None if go_ref is None else go_ref[queries, :]
        ga = None if ga_ref is None else ga_ref[queries, :]
        g_x = _g_x(a, acc_t, go, v, ga)                             # (33)
        if causal:
            keep = _causal_keep(i, j, bq, bk)
            a, g_x = jnp.where(keep, a, 0), jnp.where(keep, g_x, 0)  # masked: a = 0 and no gradient
        dk = dk + _dot(g_x.astype(q.dtype), q, acc_t, ta=True)      # (35): G_K,J += G_X,IJᵀ Q_I
        if go is not None:
            dv = dv + _dot(a.astype(go.dtype), go, acc_t, ta=True)  # (35): G_V,J += A_IJᵀ G_O,I
        return dk, dv

    # Causal: query tiles above the diagonal see none of these keys; the loop starts at the first touching it.
    start = _div(j * bk, bq) if causal else 0
    dv0 = jnp.zeros(dv_ref.shape, acc_t) if dv_ref is not None else jnp.zeros((), acc_t)
    dk, dv = lax.fori_loop(start, n_q, body, (jnp.zeros(dk_ref.shape, acc_t), dv0))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    if dv_ref is not None:
        dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(*refs, bk: int, n_k: int, causal: bool, saved_a: bool, has_go: bool, has_ga: bool,
               fast_tanh: bool):
    refs = list(refs)
    q_ref, k_ref, v_ref = refs[:3]
    a_ref, go_ref, ga_ref, dq_ref = _take(refs[3:], saved_a, has_go, has_ga, True)
    i = pl.program_id(1)
    bq = q_ref.shape[0]
    q = None if a_ref is not None else q_ref[...]                   # Q_I only to recompute A
    go = None if go_ref is None else go_ref[...]
    acc_t = _acc_dtype(q_ref.dtype)

    def body(j, dq):
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        k = k_ref[keys, :]
        if a_ref is not None:
            a = a_ref[:, keys]                                      # tile (I, J) of a, read once
        else:
            a = _tanh(_dot(q, k, acc_t, tb=True), fast_tanh)       # (32), recomputed
        ga = None if ga_ref is None else ga_ref[:, keys]
        g_x = _g_x(a, acc_t, go, v_ref[keys, :], ga)                # (33)
        if causal:
            g_x = jnp.where(_causal_keep(i, j, bq, bk), g_x, 0)
        return dq + _dot(g_x.astype(k.dtype), k, acc_t)              # (34): G_Q,I += G_X,IJ K_J

    stop = _div((i + 1) * bq + bk - 1, bk) if causal else n_k
    dq = lax.fori_loop(0, stop, body, jnp.zeros(dq_ref.shape, acc_t))
    dq_ref[...] = dq.astype(dq_ref.dtype)


# --- the launches: one pallas_call per direction, on (b, n, ·) stacks, any n (padding here) ----------------------

def _rows(b, f):                    # a tile of rows: index map over the grid (batch, tile)
    return pl.BlockSpec((None, b, f), lambda s, t: (s, t, 0))


def _whole(n, f):                   # the whole sequence of one stack member, looped over inside the kernel
    return pl.BlockSpec((None, n, f), lambda s, t: (s, 0, 0))


def _strip_rows(b, n):              # a strip of rows of an (n, n) array: rows of tile I, all columns
    return pl.BlockSpec((None, b, n), lambda s, t: (s, t, 0))


def _strip_cols(n, b):              # a strip of columns: all rows, the columns of tile J
    return pl.BlockSpec((None, n, b), lambda s, t: (s, 0, t))


def _resolve(interpret):
    return default_interpret() if interpret is None else bool(interpret)


def _forward_call(kernel: str, q, k, v, cfg, *, store_a: bool):
    """The forward kernel (32) as launch ``kernel`` on ``(b, n, ·)`` stacks: ``o``, and ``a`` with ``store_a``."""
    b, n, d = q.shape
    e = v.shape[-1]
    bs = _launch(kernel, cfg, q.dtype, d, e)
    t = _tiles(n, bs.block_q, bs.block_k)
    dp, ep = _feature_pad(d), _feature_pad(e)
    qp, kp, vp = _pad(q, t.n_pad, dp), _pad(k, t.n_pad, dp), _pad(v, t.n_pad, ep)
    out_specs, out_shape = [_rows(t.bq, ep)], [jax.ShapeDtypeStruct((b, t.n_pad, ep), q.dtype)]
    if store_a:
        out_specs.append(_strip_rows(t.bq, t.n_pad))
        out_shape.append(jax.ShapeDtypeStruct((b, t.n_pad, t.n_pad), q.dtype))
    outs = _call(
        kernel,
        functools.partial(_forward_kernel, bk=t.bk, n_k=t.n_pad // t.bk, causal=cfg.causal, store_a=store_a,
                          fast_tanh=_fast_tanh(q.dtype, cfg.interpret)),
        bs, cfg.interpret,
        grid=(b, t.n_pad // t.bq),
        in_specs=[_rows(t.bq, dp), _whole(t.n_pad, dp), _whole(t.n_pad, ep)],
        out_specs=out_specs,
        out_shape=out_shape,
    )(qp, kp, vp)
    o = outs[0][:, :n, :e]
    return (o, outs[1][:, :n, :n]) if store_a else o


def _backward_call(prefix: str, g_o, g_a, q, k, v, a, cfg):
    """The backward kernels (33)-(35) as launches ``<prefix>dkdv`` and ``<prefix>dq`` on ``(b, n, ·)`` stacks:
    ``(g_q, g_k, g_v)``.  ``a`` ``None``: its tiles recomputed (o only); else read (the lab's op).  ``g_o`` /
    ``g_a`` ``None``: absent (``g_v`` is then ``None`` without ``g_o``)."""
    b, n, d = q.shape
    e = v.shape[-1]
    dp, ep = _feature_pad(d), _feature_pad(e)
    flags = dict(causal=cfg.causal, saved_a=a is not None, has_go=g_o is not None, has_ga=g_a is not None,
                 fast_tanh=_fast_tanh(q.dtype, cfg.interpret))

    def padded(bs):                 # each kernel its own configuration, so its own padding of n
        t = _tiles(n, bs.block_q, bs.block_k)
        args = [_pad(q, t.n_pad, dp), _pad(k, t.n_pad, dp), _pad(v, t.n_pad, ep)]
        args += [_pad(x, t.n_pad, f) for x, f in ((a, t.n_pad), (g_o, ep), (g_a, t.n_pad)) if x is not None]
        return t, args

    def optional(*specs):           # the specs of a, G_O, G_A, where given
        return [s for s, x in zip(specs, (a, g_o, g_a)) if x is not None]

    kernel = prefix + "dkdv"
    bs = _launch(kernel, cfg, q.dtype, d, e)
    t, args = padded(bs)
    out_specs, out_shape = [_rows(t.bk, dp)], [jax.ShapeDtypeStruct((b, t.n_pad, dp), k.dtype)]
    if g_o is not None:
        out_specs.append(_rows(t.bk, ep))
        out_shape.append(jax.ShapeDtypeStruct((b, t.n_pad, ep), v.dtype))
    dkdv = _call(
        kernel,
        functools.partial(_dkdv_kernel, bq=t.bq, n_q=t.n_pad // t.bq, **flags),
        bs, cfg.interpret,
        grid=(b, t.n_pad // t.bk),
        in_specs=[_whole(t.n_pad, dp), _rows(t.bk, dp), _rows(t.bk, ep),
                  *optional(_strip_cols(t.n_pad, t.bk), _whole(t.n_pad, ep), _strip_cols(t.n_pad, t.bk))],
        out_specs=out_specs,
        out_shape=out_shape,
    )(*args)
    kernel = prefix + "dq"
    bs = _launch(kernel, cfg, q.dtype, d, e)
    t, args = padded(bs)
    dq = _call(
        kernel,
        functools.partial(_dq_kernel, bk=t.bk, n_k=t.n_pad // t.bk, **flags),
        bs, cfg.interpret,
        grid=(b, t.n_pad // t.bq),
        in_specs=[_rows(t.bq, dp), _whole(t.n_pad, dp), _whole(t.n_pad, ep),
                  *optional(_strip_rows(t.bq, t.n_pad), _rows(t.bq, ep), _strip_rows(t.bq, t.n_pad))],
        out_specs=_rows(t.bq, dp),
        out_shape=jax.ShapeDtypeStruct((b, t.n_pad, dp), q.dtype),
    )(*args)
    g_v = dkdv[1][:, :n, :e] if g_o is not None else None
    return dq[:, :n, :d], dkdv[0][:, :n, :d], g_v


# --- o only: drivers -------------------------------------------------------------------------------------------

_STATIC = ("causal", "block_q", "block_k", "num_warps", "num_stages", "interpret")


@functools.partial(jax.jit, static_argnames=_STATIC)
def o_only_forward(q: Array, k: Array, v: Array, *, causal: bool = False, block_q: Optional[int] = None,
                   block_k: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                   interpret: Optional[bool] = None) -> Array:
    """Forward kernel of :func:`attn_o` on ``(b, n, d), (b, n, d), (b, n, e)``: ``o (b, n, e)``, eq. (32).

    Grid (b, query tiles); each program keeps ``Q_I`` and loops over key tiles (up to the diagonal when
    ``causal``) accumulating ``tanh(Q_I K_Jᵀ) V_J``.  No input checks (see :func:`attn_o`).

    A ``jax.custom_jvp`` (module docstring, *Higher orders*): its tangent is :func:`_o_forward_tangent`, (14)-(16)
    with the mask (39)."""
    return _o_forward_diff(q, k, v, _config("o_only_forward", causal, block_q, block_k, num_warps, num_stages,
                                            interpret))


def _o_forward_kernel_call(q, k, v, cfg):
    return _forward_call("o_forward", q, k, v, cfg, store_a=False)


@functools.partial(jax.jit, static_argnames=_STATIC)
def o_only_backward(g_o: Array, q: Array, k: Array, v: Array, *, causal: bool = False,
                    block_q: Optional[int] = None, block_k: Optional[int] = None, num_warps: Optional[int] = None,
                    num_stages: Optional[int] = None, interpret: Optional[bool] = None
                    ) -> Tuple[Array, Array, Array]:
    """Backward kernels of :func:`attn_o`: ``(g_q, g_k, g_v)`` from ``g_o (b, n, e)``, eqs. (33)-(35).

    Two kernels, neither storing a tile of ``A``, ``Ĝ_A`` or ``G_X`` outside registers: grid (b, key tiles)
    looping over query tiles for ``G_K,J`` and ``G_V,J`` (35), and grid (b, query tiles) looping over key tiles
    for ``G_Q,I`` (34); each recomputes ``A_IJ = tanh(Q_I K_Jᵀ)`` (32).  Two kernels instead of atomics: each
    output tile is owned by one program.  Under ``jit`` an unused ``g_q`` drops the second kernel.

    A ``jax.custom_jvp`` (*Higher orders*): its tangent is ``jax.jvp`` of :func:`_o_backward_formulas`, (18)-(22)
    with the mask (37)-(38)."""
    return _o_backward_diff(g_o, q, k, v, _config("o_only_backward", causal, block_q, block_k, num_warps,
                                                  num_stages, interpret))


def _o_backward_kernel_call(g_o, q, k, v, cfg):
    return _backward_call("o_", g_o, None, q, k, v, None, cfg)


# --- o only: derivatives of the drivers (second order by autodiff of the formulas) ------------------------------
# The custom_jvp rules of the module docstring's *Higher orders*: the kernels' values, the formulas' tangents.

def _causal_mask(n: int) -> Array:
    return jnp.tril(jnp.ones((n, n), bool))                          # (37): M_ij = [j <= i]


def _scores_and_a(q, k, causal):
    """(1), (2) / (37) for one stack member: ``a = M ⊙ tanh(q kᵀ)``, and the mask (``None`` without one)."""
    mask = _causal_mask(q.shape[0]) if causal else None
    a = jnp.tanh(q @ k.T)                                            # (1), (2)
    return (a if mask is None else jnp.where(mask, a, 0)), mask      # (37)


def _o_forward_tangent(q, k, v, q_dot, k_dot, v_dot, causal):
    """Ȯ of ``o = (M ⊙ tanh(q kᵀ)) v`` on ``(b, n, ·)`` stacks: (14), (39), (16) from ``jax_impl.formulas``."""
    def one(q, k, v, q_dot, k_dot, v_dot):
        a, mask = _scores_and_a(q, k, causal)
        a_dot = formulas.tanh_jvp(formulas.scores_jvp(q, k, q_dot, k_dot), a)       # (14), (15)
        if mask is not None:
            a_dot = jnp.where(mask, a_dot, 0)                                        # (39)
        return formulas.mix_jvp(a, v, a_dot, v_dot)                                  # (16)
    return jax.vmap(one)(q, k, v, q_dot, k_dot, v_dot)


def _o_backward_formulas(g_o, q, k, v, causal):
    """What :func:`o_only_backward`'s kernels compute, in ``jnp`` on ``(b, n, ·)`` stacks: (18)-(22) from
    ``jax_impl.formulas`` (no ``G_A``: ``a`` is not returned) with the mask (37)-(38), the n×n ``a`` and ``G_X``
    of each stack member materialised.  Differentiable by JAX (section 9: its derivative is (23)-(27))."""
    def one(g_o, q, k, v):
        a, mask = _scores_and_a(q, k, causal)                                        # (37)
        g_a, g_v = formulas.mix_vjp(g_o, a, v)                                       # (18), (22)
        g_x = formulas.tanh_vjp(g_a, a)                                              # (19)
        if mask is not None:
            g_x = jnp.where(mask, g_x, 0)                                            # (38)
        g_q, g_k = formulas.scores_vjp(g_x, q, k)                                    # (20), (21)
        return g_q, g_k, g_v
    return jax.vmap(one)(g_o, q, k, v)


def _exact(fn):
    """Run ``fn`` with float32 matmuls at full precision (as the kernels' ``Precision.HIGHEST``; on a GPU the
    default would be TF32)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)
    return wrapped


_o_forward_diff = jax.custom_jvp(_o_forward_kernel_call, nondiff_argnums=(3,))


@_o_forward_diff.defjvp
@_exact
def _o_forward_diff_jvp(cfg, primals, tangents):
    # The value through the custom_jvp again (not the bare kernel): a third-order transform differentiates this
    # rule, and must meet this rule again rather than pallas_call's own (untransposable) JVP.
    return _o_forward_diff(*primals, cfg), _o_forward_tangent(*primals, *tangents, cfg.causal)


_o_backward_diff = jax.custom_jvp(_o_backward_kernel_call, nondiff_argnums=(4,))


@_o_backward_diff.defjvp
@_exact
def _o_backward_diff_jvp(cfg, primals, tangents):
    # The values from the kernels; the tangent is JAX's JVP of the formulas (its primal part is dead code).
    _, out_dot = jax.jvp(functools.partial(_o_backward_formulas, causal=cfg.causal), primals, tangents)
    return _o_backward_diff(*primals, cfg), out_dot                   # the value: as in _o_forward_diff_jvp


# --- o only: the custom_vjp entry -----------------------------------------------------------------------------

def _sizes(cfg: _Config, *, causal: bool = True) -> dict:
    """``cfg`` as the drivers' keyword arguments (the entries call the drivers by their module names, so a
    replaced driver, e.g. crosscheck's planted bug, is the one that runs)."""
    kw = cfg._asdict()
    if not causal:
        del kw["causal"]
    return kw


def _o_primal(q, k, v, cfg: _Config):
    return o_only_forward(q, k, v, **_sizes(cfg))


_attn_o_vjp = jax.custom_vjp(_o_primal, nondiff_argnums=(3,))


def _attn_o_fwd(q, k, v, cfg):
    return _o_primal(q, k, v, cfg), (q, k, v)                        # residuals: the inputs only (no n×n)


def _attn_o_bwd(cfg, residuals, g_o):
    return o_only_backward(g_o, *residuals, **_sizes(cfg))


_attn_o_vjp.defvjp(_attn_o_fwd, _attn_o_bwd)


def attn_o(q: Array, k: Array, v: Array, *, causal: bool = False, block_q: Optional[int] = None,
           block_k: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
           interpret: Optional[bool] = None) -> Array:
    r"""Tanh attention, output only, by fused Pallas kernels: ``o = tanh(q kᵀ) v`` (eqs. (1)-(3) tiled as (32)).

    .. math::
        O = \tanh(Q K^\top \odot M)\, V, \qquad M_{ij} = [\,j \le i\,] \text{ if causal, else } 1

    (masked entries have ``a = 0`` and carry no gradient).  Neither the forward nor the backward builds an n×n
    array: the backward recomputes tiles of ``a`` from ``q`` and ``k`` ((33)-(35), :func:`o_only_backward`);
    the residuals are ``q``, ``k``, ``v``.

    Args:
      q: ``(..., n, d)``.  k: ``(..., n, d)``.  v: ``(..., n, e)``: the same leading dimensions (no
        broadcasting), one real floating dtype (float16, bfloat16, float32, float64); any size may be 0.
      causal: a bool; mask the entries whose key index is after the query index.
      block_q, block_k: the query and key tiles (static; powers of two on a GPU); num_warps, num_stages: Pallas'
        Triton options.  Each ``None`` (the default) takes every kernel's own value from
        :func:`launch_config` (configs the GPU-static check compiled spill-free); a given one applies to
        every kernel the entry runs.
      interpret: the module docstring's *Interpret mode* (``None``: :func:`default_interpret`).
    Returns:
      ``o`` of shape ``(..., n, e)``, differentiable in reverse mode (``jax.grad``, ``jax.vjp``; ``jit`` and
      ``vmap`` work).  **No forward mode**: ``attn_o`` is a ``jax.custom_vjp``, so ``jax.jvp`` / ``jax.jacfwd``
      raise JAX's ``TypeError`` ("can't apply forward-mode autodiff (jvp) to a custom_vjp function"; use
      :func:`attn_o_jvp`).  The gradient is differentiable again, by ``jax.grad`` (a gradient penalty) and by
      ``jax.jvp`` (Hessian-vector products, ``jax.hessian``): *Higher orders* in the module docstring.
    Raises:
      TypeError / ValueError naming the offending argument, before any compute.
    """
    check_stack_inputs(q, k, v, causal, fn="attn_o")
    cfg = _config("attn_o", causal, block_q, block_k, num_warps, num_stages, interpret)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    *batch, n, _ = q.shape
    e = v.shape[-1]
    if 0 in (n, e) or 0 in batch:
        return jnp.zeros((*batch, n, e), q.dtype)                   # empty sums: o = 0 (or nothing to compute)
    flat = [x.reshape(math.prod(batch), *x.shape[-2:]) for x in (q, k, v)]   # -1 fails for d = 0
    return _attn_o_vjp(*flat, cfg).reshape(*batch, n, e)


def attn_o_reference(q: Array, k: Array, v: Array, *, causal: bool = False) -> Array:
    """The composite ``tanh(q kᵀ [masked (37)]) v`` of ``jnp`` ops (n×n), differentiated by JAX: the oracle of
    :func:`attn_o` and :func:`attn_o_jvp` (``torch_impl.kernels.o_only.attn_o_reference``'s mirror).  Same checks."""
    check_stack_inputs(q, k, v, causal, fn="attn_o")
    a = jnp.tanh(q @ jnp.swapaxes(k, -1, -2))
    if causal:
        n = q.shape[-2]
        a = jnp.where(jnp.tril(jnp.ones((n, n), bool)), a, jnp.zeros_like(a))
    return a @ v


# --- o only, forward mode: the JVP (36) by tiles --------------------------------------------------------------------
# The tangent kernel reads the primals and the tangents and writes ȯ only; o comes from the forward kernel, a call
# of its own on the primals alone.  So the primal output never depends on a tangent: jax.jacfwd (the tangents
# batched by vmap, the primal not) and jax.linearize (the primal known, the tangent staged out) both work, which a
# single kernel writing o and ȯ together did not allow.

def _jvp_kernel(*refs, bk: int, n_k: int, causal: bool, has: Tuple[bool, bool, bool], fast_tanh: bool):
    refs = list(refs)
    q_ref, k_ref, v_ref = refs[:3]
    rest = refs[3:]
    qd_ref, kd_ref, vd_ref = (rest.pop(0) if given else None for given in has)
    (od_ref,) = rest
    i = pl.program_id(1)
    bq = q_ref.shape[0]
    q = q_ref[...]
    qd = None if qd_ref is None else qd_ref[...]
    acc_t = _acc_dtype(q.dtype)

    def body(j, od):
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        k, v = k_ref[keys, :], v_ref[keys, :]
        a = _tanh(_dot(q, k, acc_t, tb=True), fast_tanh)           # (32)
        keep = _causal_keep(i, j, bq, bk) if causal else None
        if keep is not None:
            a = jnp.where(keep, a, 0)
        if qd is not None or kd_ref is not None:
            x_dot = jnp.zeros(a.shape, acc_t)
            if qd is not None:
                x_dot = x_dot + _dot(qd, k, acc_t, tb=True)         # (36): Q̇_I K_Jᵀ
            if kd_ref is not None:
                x_dot = x_dot + _dot(q, kd_ref[keys, :], acc_t, tb=True)   # (36): Q_I K̇_Jᵀ
            a_dot = (1 - a * a) * x_dot                             # (36): Ȧ_IJ (masked: a = 0 but Ȧ must be 0)
            if keep is not None:
                a_dot = jnp.where(keep, a_dot, 0)
            od = od + _dot(a_dot.astype(v.dtype), v, acc_t)         # (36): Ȯ_I += Ȧ_IJ V_J
        if vd_ref is not None:
            od = od + _dot(a.astype(v.dtype), vd_ref[keys, :], acc_t)   # (36): Ȯ_I += A_IJ V̇_J
        return od

    stop = _div((i + 1) * bq + bk - 1, bk) if causal else n_k
    od = lax.fori_loop(0, stop, body, jnp.zeros(od_ref.shape, acc_t))
    od_ref[...] = od.astype(od_ref.dtype)


def _o_tangent_kernel_call(q, k, v, q_dot, k_dot, v_dot, cfg):
    """ȯ (36) on ``(b, n, ·)`` stacks by the tangent kernel; a ``None`` tangent is a zero (its terms not
    compiled); all ``None``: zeros."""
    b, n, d = q.shape
    e = v.shape[-1]
    has = (q_dot is not None, k_dot is not None, v_dot is not None)
    if not any(has):
        return jnp.zeros((b, n, e), q.dtype)
    if _width(q.dtype) == "32" and v_dot is not None and (has[0] or has[1]):
        # 32-bit: Σ_J A_IJ V̇_J is the forward kernel on (q, k, v̇); the tangent kernel keeps the Ȧ terms (one
        # kernel with all five FFMA products spills: docs/kernels-pallas.md).  16-bit kernels keep the one kernel.
        return (_o_tangent_kernel_call(q, k, v, q_dot, k_dot, None, cfg)
                + _forward_call("o_forward", q, k, v_dot, cfg, store_a=False))
    bs = _launch("o_jvp", cfg, q.dtype, d, e)
    t = _tiles(n, bs.block_q, bs.block_k)
    dp, ep = _feature_pad(d), _feature_pad(e)
    args = [_pad(q, t.n_pad, dp), _pad(k, t.n_pad, dp), _pad(v, t.n_pad, ep)]
    specs = [_rows(t.bq, dp), _whole(t.n_pad, dp), _whole(t.n_pad, ep)]
    for tangent, spec, f in ((q_dot, _rows(t.bq, dp), dp), (k_dot, _whole(t.n_pad, dp), dp),
                             (v_dot, _whole(t.n_pad, ep), ep)):
        if tangent is not None:
            args.append(_pad(tangent, t.n_pad, f))
            specs.append(spec)
    o_dot = _call(
        "o_jvp",
        functools.partial(_jvp_kernel, bk=t.bk, n_k=t.n_pad // t.bk, causal=cfg.causal, has=has,
                          fast_tanh=_fast_tanh(q.dtype, cfg.interpret)),
        bs, cfg.interpret,
        grid=(b, t.n_pad // t.bq),
        in_specs=specs,
        out_specs=_rows(t.bq, ep),
        out_shape=jax.ShapeDtypeStruct((b, t.n_pad, ep), q.dtype),
    )(*args)
    return o_dot[:, :n, :e]


@functools.partial(jax.jit, static_argnames=_STATIC)
def o_only_jvp(q: Array, k: Array, v: Array, q_dot: Optional[Array], k_dot: Optional[Array],
               v_dot: Optional[Array], *, causal: bool = False, block_q: Optional[int] = None,
               block_k: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
               interpret: Optional[bool] = None) -> Tuple[Array, Array]:
    """``(o, o_dot)`` of :func:`attn_o_jvp` on ``(b, n, ·)`` stacks: ``o`` by the forward kernel (32), ``ȯ`` by
    the tangent kernel (36).

    The tangent kernel: grid (b, query tiles), a loop over key tiles as :func:`o_only_forward`, recomputing
    ``A_IJ`` per tile for ``Ȯ_I = Σ_J (Ȧ_IJ V_J + A_IJ V̇_J)``.  A ``None`` tangent is a zero: its terms are not
    compiled.  Mirrors ``torch_impl``'s ``o_only_jvp_blocks``."""
    cfg = _config("o_only_jvp", causal, block_q, block_k, num_warps, num_stages, interpret)
    return _o_forward_diff(q, k, v, cfg), _o_tangent_kernel_call(q, k, v, q_dot, k_dot, v_dot, cfg)


# The tangent kernel behind a custom_vjp that is never differentiated: reverse mode of attn_o_jvp then stops at
# JAX's clear "Transpose rule (for reverse-mode differentiation) for 'custom_vjp_call' not implemented" instead
# of an internal assertion inside pallas_call's transpose.  vmap (jacfwd) and evaluation go through unchanged.
_o_tangent = jax.custom_vjp(_o_tangent_kernel_call, nondiff_argnums=(6,))


def _o_tangent_fwd(q, k, v, q_dot, k_dot, v_dot, cfg):
    return _o_tangent_kernel_call(q, k, v, q_dot, k_dot, v_dot, cfg), None


def _o_tangent_bwd(cfg, residuals, g):
    raise NotImplementedError("attn_o_jvp() has no reverse mode (its tangent kernel is not transposed): use attn_o")


_o_tangent.defvjp(_o_tangent_fwd, _o_tangent_bwd)

_attn_o_jvp = jax.custom_jvp(_o_primal, nondiff_argnums=(3,))


def _attn_o_jvp_rule(cfg, primals, tangents):
    dots = [None if isinstance(t, SymbolicZero) else t for t in tangents]
    # The primal from the primals alone (the forward kernel); the tangent from primals and tangents.
    return _o_primal(*primals, cfg), _o_tangent(*primals, *dots, cfg)


_attn_o_jvp.defjvp(_attn_o_jvp_rule, symbolic_zeros=True)


def attn_o_jvp(q: Array, k: Array, v: Array, *, causal: bool = False, block_q: Optional[int] = None,
               block_k: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
               interpret: Optional[bool] = None) -> Array:
    r""":func:`attn_o` with forward mode instead of reverse mode: a ``jax.custom_jvp`` whose rule runs the forward
    kernel for ``o`` and a tangent kernel for ``ȯ`` by tiles, eq. (36) (:func:`o_only_jvp`); no n×n array.

    Same arguments, result and errors as :func:`attn_o`.  Supports ``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``
    (first order; the primal output depends on the primals only).  **No reverse mode**: the tangent kernel's
    is not transposed, so ``jax.grad`` / ``jax.vjp`` raise JAX's ``NotImplementedError`` ("Transpose rule (for
    reverse-mode differentiation) for 'custom_vjp_call' not implemented"); use :func:`attn_o`."""
    check_stack_inputs(q, k, v, causal, fn="attn_o_jvp")
    cfg = _config("attn_o_jvp", causal, block_q, block_k, num_warps, num_stages, interpret)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    *batch, n, _ = q.shape
    e = v.shape[-1]
    if 0 in (n, e) or 0 in batch:
        return jnp.zeros((*batch, n, e), q.dtype)
    flat = [x.reshape(math.prod(batch), *x.shape[-2:]) for x in (q, k, v)]
    return _attn_o_jvp(*flat, cfg).reshape(*batch, n, e)


# --- the lab's op, fused: drivers (2-D; a leading batch of 1 inside) -------------------------------------------

_FUSED_STATIC = ("block_q", "block_k", "num_warps", "num_stages", "interpret")


@functools.partial(jax.jit, static_argnames=_FUSED_STATIC)
def fused_forward(q: Array, k: Array, v: Array, *, block_q: Optional[int] = None, block_k: Optional[int] = None,
                  num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                  interpret: Optional[bool] = None) -> Tuple[Array, Array]:
    """Forward kernel of :func:`attn_fused` on ``(n, d), (n, d), (n, e)``: ``(o (n, e), a (n, n))``, eq. (32).

    Grid (query tiles,); each program loops over key tiles, writes ``A_IJ`` into its strip of ``a`` and adds
    ``A_IJ V_J`` to ``O_I`` from the same tile.  No input checks (see :func:`attn_fused`).

    A ``jax.custom_jvp`` (*Higher orders*): its tangents ``(ȯ, ȧ)`` are ``jax_impl.formulas.attn_jvp`` (14)-(16) on
    the kernel's ``a``."""
    return _fused_forward_diff(q, k, v, _config("fused_forward", False, block_q, block_k, num_warps, num_stages,
                                                interpret))


def _fused_forward_kernel_call(q, k, v, cfg):
    o, a = _forward_call("fused_forward", q[None], k[None], v[None], cfg, store_a=True)
    return o[0], a[0]


@functools.partial(jax.jit, static_argnames=_FUSED_STATIC)
def fused_backward(g_o: Optional[Array], g_a: Optional[Array], q: Array, k: Array, v: Array, a: Array, *,
                   block_q: Optional[int] = None, block_k: Optional[int] = None, num_warps: Optional[int] = None,
                   num_stages: Optional[int] = None, interpret: Optional[bool] = None
                   ) -> Tuple[Array, Array, Optional[Array]]:
    """Backward kernels of :func:`attn_fused`: ``(g_q, g_k, g_v)``, eqs. (33)-(35) reading the saved ``a``.

    ``g_o`` / ``g_a`` may be ``None`` (a symbolic zero): the kernels are specialised on which are given, so an
    absent ``g_a`` is never read (nor built) and an absent ``g_o`` drops ``G_O V_Jᵀ`` from (33) and ``G_V``
    altogether (returned as ``None``).  ``Ĝ_A`` and ``G_X`` exist per tile only.  Kernels as in
    :func:`o_only_backward`, with ``a``'s tiles read instead of recomputed: grid over key tiles for ``G_K``,
    ``G_V`` (35) (reading a strip of columns of ``a``), grid over query tiles for ``G_Q`` (34) (a strip of
    rows).  Both ``None``: zero ``g_q``, ``g_k`` and ``g_v = None``.

    A ``jax.custom_jvp`` in all six arguments (*Higher orders*): its tangent is ``jax.jvp`` of
    ``jax_impl.formulas.attn_backward`` (18)-(22)."""
    if g_o is None and g_a is None:
        return jnp.zeros_like(q), jnp.zeros_like(k), None
    return _fused_backward_diff(g_o, g_a, q, k, v, a, _config("fused_backward", False, block_q, block_k, num_warps,
                                                              num_stages, interpret))


def _fused_backward_kernel_call(g_o, g_a, q, k, v, a, cfg):
    one = [None if x is None else x[None] for x in (g_o, g_a, q, k, v, a)]
    g_q, g_k, g_v = _backward_call("fused_", *one, cfg)
    return g_q[0], g_k[0], None if g_v is None else g_v[0]


# --- the lab's op, fused: derivatives of the drivers (second order by autodiff of the formulas) -----------------
# As for attn_o (*Higher orders*), with a, G_A and G_X whole n×n arrays.

_fused_forward_diff = jax.custom_jvp(_fused_forward_kernel_call, nondiff_argnums=(3,))


@_fused_forward_diff.defjvp
@_exact
def _fused_forward_diff_jvp(cfg, primals, tangents):
    o, a = _fused_forward_diff(*primals, cfg)                        # the value: as in _o_forward_diff_jvp
    return (o, a), formulas.attn_jvp(*primals, a, *tangents)          # (14)-(16) on the kernel's a


_fused_backward_diff = jax.custom_jvp(_fused_backward_kernel_call, nondiff_argnums=(6,))


@_fused_backward_diff.defjvp
@_exact
def _fused_backward_diff_jvp(cfg, primals, tangents):
    # g_o / g_a may be None (an empty pytree: no tangent either); formulas.attn_backward skips their terms as the
    # kernels do, so the tangent has the values' structure (g_v None without g_o).
    _, out_dot = jax.jvp(formulas.attn_backward, primals, tangents)   # (18)-(22), differentiated by JAX
    return _fused_backward_diff(*primals, cfg), out_dot


# --- the lab's op, fused: the custom_vjp entry ---------------------------------------------------------------

def _fused_primal(q, k, v, cfg: _Config):
    return AttnOutput(*fused_forward(q, k, v, **_sizes(cfg, causal=False)))


_attn_fused_vjp = jax.custom_vjp(_fused_primal, nondiff_argnums=(3,))


def _attn_fused_fwd(q, k, v, cfg):
    # symbolic_zeros=True: the primal arguments arrive as CustomVJPPrimal(value, perturbed).
    q, k, v = q.value, k.value, v.value
    out = _fused_primal(q, k, v, cfg)
    return out, (q, k, v, out.a)                                    # residuals: the inputs and the output a


def _none_if_zero(t):
    return None if isinstance(t, SymbolicZero) else t


def _attn_fused_bwd(cfg, residuals, cotangent: AttnOutput):
    # An output that does not reach the loss arrives as a SymbolicZero, never as an n×n array of zeros.
    # g_v is None without g_o: a zero cotangent to custom_vjp.
    return fused_backward(_none_if_zero(cotangent.o), _none_if_zero(cotangent.a), *residuals,
                          **_sizes(cfg, causal=False))


_attn_fused_vjp.defvjp(_attn_fused_fwd, _attn_fused_bwd, symbolic_zeros=True)


def attn_fused(q: Array, k: Array, v: Array, *, block_q: Optional[int] = None, block_k: Optional[int] = None,
               num_warps: Optional[int] = None, num_stages: Optional[int] = None,
               interpret: Optional[bool] = None) -> AttnOutput:
    r"""The lab's op ``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` by fused Pallas kernels (eqs. (1)-(3) as (32)).

    The forward writes ``a`` once and accumulates ``o`` from the same tiles (:func:`fused_forward`); the
    backward (``jax.custom_vjp`` with ``symbolic_zeros=True``) reads ``a`` and, only when the loss uses ``a``,
    ``G_A`` by tiles, and never stores ``Ĝ_A`` or ``G_X`` (:func:`fused_backward`, (33)-(35)).  Residuals:
    ``q``, ``k``, ``v`` and the output ``a`` (no copy).

    Args:
      q: ``(n, d)``.  k: ``(n, d)``.  v: ``(n, e)``: the lab's contract (``attn_contract``, messages naming
        ``attn_fused()``) with real floating dtypes only (float16, bfloat16, float32, float64).  Batch with
        ``jax.vmap``.
      block_q, block_k, num_warps, num_stages, interpret: as :func:`attn_o`.
    Returns:
      ``AttnOutput(o, a)``, reverse-mode differentiable; no forward mode (``custom_vjp``).  The gradient is
      differentiable again, by ``jax.grad`` (gradient penalties, with losses of ``o``, ``a`` or both) and by
      ``jax.jvp`` (Hessian-vector products): *Higher orders* in the module docstring.
    """
    attn_contract.check(FRAMEWORK, q, k, v, fn="attn_fused")
    _check_dtype("attn_fused", zip(attn_contract.NAMES, (q, k, v)))
    cfg = _config("attn_fused", False, block_q, block_k, num_warps, num_stages, interpret)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    n, e = q.shape[0], v.shape[1]
    if n == 0:
        return AttnOutput(jnp.zeros((0, e), q.dtype), jnp.zeros((0, 0), q.dtype))
    return _attn_fused_vjp(q, k, v, cfg)
