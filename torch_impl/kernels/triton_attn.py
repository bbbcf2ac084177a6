"""Triton kernels of tanh attention, and their launchers (imported only when triton is; see ``kernels/__init__``).

Every launcher takes q, k, v of one dtype (float16, bfloat16 or float32) on one device, as stacks ``(B, n, ·)``
(batch × heads flattened into B) or single matrices ``(n, ·)`` (then every output is a matrix, no output a view of
another's buffer), and tiles derivation.md section 15 as written there, each program owning the rows it writes:

* ``o_only_forward`` (32) with the mask (37), and ``o_only_backward``: a dK/dV kernel (35) and a dQ kernel (34),
  (33) per tile with G_A = 0 and tiles of A recomputed; no n×n tensor.
* ``fused_forward``, ``fused_backward``: the lab's op ``(o, a)``, the same kernels storing / reading tiles of A.

Constexpr flags leave out what a call does not need (``NEED_*``, ``HAS_GO`` / ``HAS_GA``, ``SAVED_A``, ``CAUSAL``);
``PRECISION`` is ``"ieee"`` for float32 unless TF32 is enabled (``kernels.dot_precision``); ``TANH`` is the tanh
mode per dtype (``tanh_mode``: "exact", "approx", "emulate"); ``UPCAST`` raises bfloat16 dot operands to float32
under ``TRITON_INTERPRET=1``, whose bfloat16 dot is wrong.  Accumulation is float32, outputs in the inputs'
dtype.  Offsets into A and G_A are int64 (n² exceeds int32 from n = 46341 on), the batch offset too.  The grid is
one axis of ``B × tiles`` programs (``_program``), up to ``GRID_LIMIT``.

Launch configurations are data: ``CONFIGS`` maps (arch, dtype, kernel, head width) to ``LaunchConfig`` tuples,
the first the default, all the autotune list (``use_autotune``); ``tiles(block_q, block_k)`` forces tile sizes and
``record_launches(arch)`` captures launches instead of running them (the GPU-static check builds every variant
from that).  The tiling table, the tanh modes and their errors, the configurations' figures: docs/kernels.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["o_only_forward", "o_only_backward", "fused_forward", "fused_backward", "effective_mask",
           "fused_forward_op", "fused_backward_op", "INTERPRET", "MAX_HEAD_DIM", "LaunchConfig", "CONFIGS",
           "ARCHS", "launch_configs", "launch_config", "tiles", "record_launches", "Launch", "perturb_tanh",
           "use_autotune", "autotune_enabled", "tanh_mode", "TANH_APPROX_REL_ERR", "GRID_LIMIT", "proven",
           "UNPROVEN", "dtype_key", "width_of", "table_name", "KERNELS", "DTYPE_KEYS", "WIDTHS", "TRACEABLE", "cuda_arch"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"     # triton reads it at import too
MAX_HEAD_DIM = 256      # d and e are held whole in one tile: larger ones stay on ATen (kernels.triton_applies)
TANH_APPROX_REL_ERR = 2.0 ** -10.987   # PTX ISA, tanh.approx.f32: maximum relative error
GRID_LIMIT = 2 ** 31 - 1               # CUDA: programs on grid axis 0
SMALL_TANH = 0.625                     # |x| below it: the polynomial branch of the exact tanh
# tanh x = x + x³ P(x²) on |x| < SMALL_TANH; P's coefficients from a (re-weighted) least-squares fit of
# (tanh x − x)/x³ in float64, rounded to float32 (the resulting error: docs/kernels.md, "tanh in the kernels")
_P0, _P1, _P2, _P3, _P4 = (tl.constexpr(c) for c in (-0.33333250880241394, 0.1333070695400238,
                                                     -0.05368538573384285, 0.02047804370522499,
                                                     -0.005538809113204479))
_SMALL = tl.constexpr(SMALL_TANH)


# ------------------------------------------------------------------------------------------------ helpers
@triton.jit
def _tanh_and_slope(x, TANH: tl.constexpr, TANH_ERR: tl.constexpr):
    """``(tanh x, 1 − tanh² x)`` by the ``TANH`` mode (``tanh_mode``).  "exact": with t = e^(−2|x|),
    tanh|x| = (1 − t)/(1 + t) and 1 − tanh² x = 4t/(1 + t)² (41) from one exp, x + x³P(x²) for small |x| (the
    form above returns 0 below |x| ≈ 3e-8 and loses relative precision well before)."""
    if TANH == "approx":
        a = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)                                        # (2): one MUFU.TANH
        slope = tl.maximum(1.0 - a * a, 0.0)
    else:
        ax = tl.abs(x)
        t = tl.exp(-2.0 * ax)
        r = 1.0 / (1.0 + t)
        z = x * x
        p = ((((_P4 * z + _P3) * z + _P2) * z + _P1) * z + _P0)
        small = x + x * z * p
        big = (1.0 - t) * r
        a = tl.where(ax < _SMALL, small, tl.where(x < 0, -big, big))           # (2)
        if TANH == "emulate":
            a = tl.minimum(tl.maximum(a * (1.0 + TANH_ERR), -1.0), 1.0)
            slope = tl.maximum(1.0 - a * a, 0.0)
        else:
            slope = 4.0 * t * r * r                                                   # (41)
    return a, slope


@triton.jit
def _tanh(x, TANH: tl.constexpr, TANH_ERR: tl.constexpr):
    a, _ = _tanh_and_slope(x, TANH, TANH_ERR)
    return a


@triton.jit
def _load(ptr, mask, UPCAST: tl.constexpr):
    t = tl.load(ptr, mask=mask, other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _causal(t, offs_q, offs_k, CAUSAL: tl.constexpr):
    """(37)/(38): zero the entries whose key index is after the query index (t is (BQ, BK))."""
    if CAUSAL:
        t = tl.where(offs_q[:, None] >= offs_k[None, :], t, 0.0)
    return t


@triton.jit
def _causal_t(t, offs_k, offs_q, CAUSAL: tl.constexpr):
    """The same for a transposed tile (BK, BQ)."""
    if CAUSAL:
        t = tl.where(offs_q[None, :] >= offs_k[:, None], t, 0.0)
    return t


@triton.jit
def _program(N, BLOCK: tl.constexpr):
    """(tile index, batch index) of this program on the one-axis grid of B × cdiv(N, BLOCK) programs."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(N, BLOCK)
    return pid % tiles, (pid // tiles).to(tl.int64)


# ------------------------------------------------------------------------------------- launch configurations
@dataclass(frozen=True)
class LaunchConfig:
    """How one kernel is launched: query rows per tile, key rows per tile, warps, software-pipelining stages."""
    block_q: int
    block_k: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"{self.block_q}x{self.block_k} w{self.num_warps} s{self.num_stages}"


ARCHS = ("sm_80", "sm_90a")            # the tables below: A100 (and other 8.x), H100 (and later)
# o_: tiles of A recomputed (attn_o); fused_: A stored / read (the lab's op): the names of the Pallas launches
KERNELS = ("o_forward", "fused_forward", "o_dkdv", "fused_dkdv", "o_dq", "fused_dq")
DTYPE_KEYS = ("fp16", "bf16", "fp32", "tf32")
WIDTHS = (64, 128, 256)                # max(d, e) rounded up to a power of two, at least 64


def _table(rows: Dict[Tuple[str, str, str], Dict[int, Sequence[Tuple[int, int, int, int]]]]):
    out = {}
    for (arch, dtypes, kernel), by_width in rows.items():
        for dt in dtypes.split():
            for width, configs in by_width.items():
                out[(arch, dt, kernel, width)] = tuple(LaunchConfig(*c) for c in configs)
    return out


#: (arch, dtype key, kernel, width) → the configurations proven by ``python -m benchmarks.gpu_static`` (no spill,
#: shared memory within the arch's per-block limit, HGMMA on sm_90a for fp16 / bf16 / tf32); the first is the
#: default, all of them the autotune list.  (block_q, block_k, num_warps, num_stages).
CONFIGS: Dict[Tuple[str, str, str, int], Tuple[LaunchConfig, ...]] = _table({
    # d or e above 128 (width 256): no configuration proven (docs/kernels.md, "Launch configurations"): empty,
    # the entries run ATen on a GPU
    # H100: 64-row tiles per warpgroup (wgmma); 4 warps where tanh is computed (8 duplicated its MUFU work)
    ("sm_90a", "fp16 bf16", "o_forward"): {64: [(64, 64, 4, 2)], 128: [(64, 64, 4, 2)], 256: []},
    ("sm_90a", "fp16 bf16", "fused_forward"): {64: [(64, 64, 4, 2)], 128: [(64, 64, 4, 2)], 256: []},
    ("sm_90a", "fp16 bf16", "o_dkdv"): {64: [(32, 64, 4, 2), (32, 64, 4, 1), (64, 64, 4, 1)],
                                        128: [(32, 64, 4, 2), (32, 64, 4, 1)], 256: []},
    ("sm_90a", "fp16 bf16", "fused_dkdv"): {64: [(64, 64, 4, 2), (32, 64, 4, 2)],
                                            128: [(64, 64, 4, 2), (32, 64, 4, 2)], 256: []},
    ("sm_90a", "fp16 bf16", "o_dq"): {64: [(64, 64, 4, 2)], 128: [(64, 64, 4, 2)], 256: []},
    ("sm_90a", "fp16 bf16", "fused_dq"): {64: [(64, 64, 4, 2), (64, 64, 8, 2)], 128: [(64, 64, 4, 2), (64, 64, 8, 2)],
                                          256: []},
    ("sm_90a", "tf32", "o_forward"): {64: [(64, 64, 8, 2)], 128: [(64, 64, 8, 2)], 256: []},
    ("sm_90a", "tf32", "fused_forward"): {64: [(64, 64, 8, 2)], 128: [(64, 64, 8, 2)], 256: []},
    # TF32 dK/dV at d = 128: no candidate tried is spill-free with HGMMA (docs/kernels.md, "Launch
    # configurations"): empty, the entries run ATen (``proven``)
    ("sm_90a", "tf32", "o_dkdv"): {64: [(32, 64, 4, 2), (32, 64, 4, 1), (64, 64, 4, 1)], 128: [], 256: []},
    ("sm_90a", "tf32", "fused_dkdv"): {64: [(32, 64, 4, 2), (32, 64, 4, 1), (64, 64, 4, 1)], 128: [],
                                       256: []},
    ("sm_90a", "tf32", "o_dq"): {64: [(64, 32, 4, 2), (64, 64, 4, 1)], 128: [(64, 32, 4, 2)], 256: []},
    ("sm_90a", "tf32", "fused_dq"): {64: [(64, 64, 8, 2)], 128: [(64, 64, 8, 2)], 256: []},
    # A100: mma.sync; 163 KiB of shared memory per block.  The dK/dV entries (and TF32 o_dq at width 128): from
    # python -m benchmarks.gpu_static --sweep ... --archs sm_80 --shapes 128x128 64x128 128x64 (16x16 64x64 for
    # width 64), clean in every variant at every (d, e) of the width, the dK/dV kernels asked for only G_K or G_V
    # included (docs/kernels.md, "The GPU-static check")

    ("sm_80", "fp16 bf16", "o_forward"): {64: [(64, 64, 4, 2)], 128: [(64, 64, 4, 2)], 256: []},
    ("sm_80", "fp16 bf16", "fused_forward"): {64: [(64, 64, 4, 2)], 128: [(64, 64, 4, 2)], 256: []},
    ("sm_80", "fp16 bf16", "o_dkdv"): {64: [(32, 64, 4, 2), (64, 64, 4, 2), (32, 64, 4, 1)],
                                       128: [(32, 64, 4, 1), (32, 32, 4, 2)], 256: []},
    ("sm_80", "fp16 bf16", "fused_dkdv"): {64: [(32, 64, 4, 2), (32, 64, 4, 1)],
                                           128: [(64, 32, 8, 2), (32, 32, 4, 1), (16, 64, 4, 2)], 256: []},
    ("sm_80", "fp16 bf16", "o_dq"): {64: [(64, 64, 4, 2)], 128: [(32, 64, 4, 2)], 256: []},
    ("sm_80", "fp16 bf16", "fused_dq"): {64: [(32, 64, 4, 2)], 128: [(32, 64, 4, 2)], 256: []},
    ("sm_80", "tf32", "o_forward"): {64: [(64, 64, 4, 2), (32, 64, 4, 2)], 128: [(64, 64, 4, 2)], 256: []},
    ("sm_80", "tf32", "fused_forward"): {64: [(32, 64, 4, 2)], 128: [(32, 64, 4, 2)], 256: []},
    ("sm_80", "tf32", "o_dkdv"): {64: [(64, 32, 4, 2), (32, 32, 4, 2), (16, 64, 4, 2)], 128: [(32, 32, 4, 2)],
                                  256: []},
    ("sm_80", "tf32", "fused_dkdv"): {64: [(16, 64, 4, 2)], 128: [(32, 32, 4, 2)], 256: []},
    ("sm_80", "tf32", "o_dq"): {64: [(64, 64, 4, 2)], 128: [(64, 32, 4, 2), (32, 64, 4, 2)], 256: []},
    ("sm_80", "tf32", "fused_dq"): {64: [(32, 64, 4, 2)], 128: [(32, 64, 4, 2)], 256: []},
    # exact float32 (FFMA, no tensor cores): spill-free only at small tiles; on a GPU its entries run ATen
    # (kernels.triton_applies); these serve the launchers called directly and the interpreter's tile sizes.  The
    # backward kernels at widths 128 / 256 with 8 warps (from a sweep on sm_90a: 4 warps spilled 150-200 B at
    # width 128 and 1.6-2.3 KB at 256); at width 256 the dK/dV and o_dQ kernels still spill 140-180 B, the least
    # of the candidates tried (docs/kernels.md, "The GPU-static check")
    **{(arch, "fp32", kernel): {64: [(16, 32, 4, 1)], 128: [(16, 16, warps, 1)], 256: [wide]}
       for arch in ("sm_80", "sm_90a")
       for kernel, warps, wide in (("o_forward", 4, (16, 16, 4, 1)), ("fused_forward", 4, (16, 16, 4, 1)),
                                   ("o_dkdv", 8, (16, 16, 8, 1)), ("fused_dkdv", 8, (16, 16, 8, 1)),
                                   ("o_dq", 8, (16, 16, 8, 1)), ("fused_dq", 8, (32, 32, 8, 1)))},
})


def launch_configs(arch: str, dtype_key: str, kernel: str, width: int) -> Tuple[LaunchConfig, ...]:
    """The proven configurations of ``kernel`` (``KERNELS``: "o_forward", "o_dkdv", "o_dq" recompute tiles of A,
    the o-only entry's; "fused_forward", "fused_dkdv", "fused_dq" store or read A, the lab's op's) for ``arch``
    ("sm_80", "sm_90a"), a dtype key ("fp16", "bf16", "fp32", "tf32") and a head width (64, 128, 256): the
    default first."""
    try:
        return CONFIGS[(arch, dtype_key, kernel, width)]
    except KeyError:
        raise ValueError(f"triton_attn: no launch configuration for arch={arch!r}, dtype={dtype_key!r}, "
                         f"kernel={kernel!r}, width={width!r}") from None


#: Tiles for a table entry with no proven configuration, where a launch still happens: the interpreter (which
#: runs any tile) and the launchers called directly.  The entries themselves run ATen there (``proven``).
UNPROVEN = LaunchConfig(16, 64, 4, 1)


def proven(arch: str, dtype_key: str, width: int) -> bool:
    """Whether every kernel of (arch, dtype, width) has a proven configuration: where not, ``kernels.
    triton_applies`` sends the entries to ATen on a GPU."""
    return all(CONFIGS.get((arch, dtype_key, kernel, width)) for kernel in KERNELS)


def launch_config(arch: str, dtype_key: str, kernel: str, width: int) -> LaunchConfig:
    """The default of ``launch_configs`` (what runs when autotuning is off)."""
    return launch_configs(arch, dtype_key, kernel, width)[0]


def dtype_key(dtype: torch.dtype, precision: str = "ieee") -> str:
    """"fp16", "bf16", "fp32" (float32, exact dots) or "tf32" (float32 with TF32 dots)."""
    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    return names.get(dtype) or ("tf32" if precision == "tf32" else "fp32")


def width_of(D: int, E: int) -> int:
    """The table's head width for head dimensions d, e."""
    return max(64, _tile(D), _tile(E))


def tanh_mode(dtype: torch.dtype) -> str:
    """The kernels' ``TANH`` for ``dtype`` (docs/kernels.md, "tanh in the kernels"): "exact" for float32,
    "approx" for float16 / bfloat16 on a GPU, "emulate" for them under the interpreter or while ``perturb_tanh``
    is active."""
    if dtype == torch.float32:
        return "exact"
    return "emulate" if INTERPRET or _TANH_ERR.get() != 0.0 else "approx"


_AUTOTUNE = os.environ.get("TANH_ATTN_AUTOTUNE", "0") == "1"
_TILES: contextvars.ContextVar = contextvars.ContextVar("triton_attn_tiles", default=None)
_RECORD: contextvars.ContextVar = contextvars.ContextVar("triton_attn_record", default=None)
_TANH_ERR: contextvars.ContextVar = contextvars.ContextVar("triton_attn_tanh_err", default=0.0)


def use_autotune(flag: bool = True) -> None:
    """Autotune over ``launch_configs`` on the GPU (off by default: the first entry runs, deterministically).
    Never under the interpreter."""
    global _AUTOTUNE
    _AUTOTUNE = bool(flag)


def autotune_enabled() -> bool:
    return _AUTOTUNE and not INTERPRET


@contextlib.contextmanager
def tiles(block_q: Optional[int] = None, block_k: Optional[int] = None):
    """Force tile sizes on every launch in the block (the default's warps and stages kept; autotune off): what
    tests and crosscheck use to give every tile a tail at small n.  Sizes at least 16 (``tl.dot``)."""
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size is not None and (size < 16 or size & (size - 1)):
            raise ValueError(f"tiles: {name} must be a power of two >= 16, got {size}")
    token = _TILES.set((block_q, block_k))
    try:
        yield
    finally:
        _TILES.reset(token)


@contextlib.contextmanager
def perturb_tanh(rel: float):
    """Within the block, float16 / bfloat16 kernels compute tanh as the exact one times ``1 + rel`` and 1 − A²
    from it ("emulate"): the hardware tanh's error bound (``TANH_APPROX_REL_ERR``) made visible to the
    interpreter."""
    token = _TANH_ERR.set(float(rel))
    try:
        yield
    finally:
        _TANH_ERR.reset(token)


class Launch(NamedTuple):
    """One kernel launch as ``record_launches`` captures it."""
    name: str                      # the kernel: "forward", "dkdv", "dq"
    kernel: object                 # the triton.jit function
    entry: str                     # the public launcher: "o_only_forward", "fused_backward", ...
    args: tuple                    # positional arguments as the launch passes them (tensors, strides, sizes)
    constexprs: dict               # every constexpr but BLOCK_Q / BLOCK_K
    configs: Tuple[LaunchConfig, ...]   # what may run: the default first, then the rest of the autotune list
    grid: Tuple[int, ...]          # the default config's grid
    arch: str
    dtype: str                     # dtype key
    width: int


@contextlib.contextmanager
def record_launches(arch: str = "sm_90a"):
    """Capture every launch in the block instead of running it (yields the list of ``Launch``); configurations
    are chosen for ``arch``.  Use meta tensors: nothing is computed, outputs are allocated as usual."""
    if arch not in ARCHS:
        raise ValueError(f"record_launches: arch must be one of {ARCHS}, got {arch!r}")
    found: List[Launch] = []
    token = _RECORD.set((arch, found))
    try:
        yield found
    finally:
        _RECORD.reset(token)


@torch.compiler.assume_constant_result        # read once while tracing: Dynamo need not trace the driver query
def cuda_arch(device: torch.device) -> str:
    """The launch table of a CUDA device: ``"sm_90a"`` from compute capability 9 on, else ``"sm_80"``; without a
    driver (fake CUDA tensors, tracing on a machine without a GPU) the H100's."""
    try:
        major, _ = torch.cuda.get_device_capability(device)
    except (AssertionError, RuntimeError):
        major = 9
    return "sm_90a" if major >= 9 else "sm_80"


def _arch_of(t: Tensor) -> str:
    rec = _RECORD.get()
    if rec is not None:
        return rec[0]
    if t.is_cuda:
        return cuda_arch(t.device)
    return "sm_90a"              # the interpreter: the H100 table's tile sizes (it ignores warps and stages)


_KERNELS = {}                    # name → kernel, filled below the kernels
_TUNED: Dict[str, object] = {}


def _as_config(c: LaunchConfig):
    return triton.Config({"BLOCK_Q": c.block_q, "BLOCK_K": c.block_k}, num_warps=c.num_warps,
                         num_stages=c.num_stages)


def _autotuned(name: str):
    """``triton.autotune`` over every configuration of table entry ``name`` in ``CONFIGS``, pruned per launch to
    those of its (arch, dtype, width) entry, keyed on n, d, e, causal, precision (and the dtypes, which triton
    adds)."""
    if name not in _TUNED:
        every = sorted({c for (_, _, k, _), cs in CONFIGS.items() if k == name for c in cs},
                       key=lambda c: (c.block_q, c.block_k, c.num_warps, c.num_stages))

        def prune(configs, named_args, **kwargs):
            q = named_args["Q"]
            allowed = set(launch_configs(_arch_of(q), dtype_key(q.dtype, kwargs["PRECISION"]), name,
                                         max(64, kwargs["BLOCK_D"], kwargs["BLOCK_E"])))
            return [c for c in configs if LaunchConfig(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps,
                                                       c.num_stages) in allowed]

        tune = triton.autotune([_as_config(c) for c in every],
                               key=["N", "D", "E", "CAUSAL", "PRECISION", "BLOCK_D", "BLOCK_E"],
                               prune_configs_by={"early_config_prune": prune})
        _TUNED[name] = tune(_KERNELS[name.split("_", 1)[1]])
    return _TUNED[name]


def table_name(name: str, constexprs: dict) -> str:
    """The ``KERNELS`` entry of a launch of kernel ``name`` ("forward", "dkdv", "dq") with these flags: "fused_"
    (A stored or read: the lab's op) or "o_" (tiles of A recomputed) before it, as the Pallas launches are named."""
    return ("fused_" if constexprs.get("SAVED_A") or constexprs.get("STORE_A") else "o_") + name


def _launch(name: str, entry: str, B: int, N: int, D: int, E: int, dtype: torch.dtype, precision: str,
            args: tuple, constexprs: dict, block_q: Optional[int], block_k: Optional[int], device_of: Tensor):
    arch, key, width = _arch_of(device_of), dtype_key(dtype, precision), width_of(D, E)
    table = table_name(name, constexprs)
    configs = launch_configs(arch, key, table, width) or (UNPROVEN,)
    forced = _TILES.get() or (None, None)
    block_q, block_k = block_q or forced[0], block_k or forced[1]
    if block_q or block_k:
        c = configs[0]
        configs = (LaunchConfig(block_q or c.block_q, block_k or c.block_k, c.num_warps, c.num_stages),)
    rows = "BLOCK_K" if name == "dkdv" else "BLOCK_Q"

    def programs(tile: int) -> int:
        total = B * triton.cdiv(N, tile)
        if total > GRID_LIMIT:
            raise ValueError(f"triton_attn: {B} stacks × {triton.cdiv(N, tile)} tiles of {tile} rows = {total} "
                             f"programs, over CUDA's grid limit {GRID_LIMIT}")
        return total

    c = configs[0]
    grid = (programs(c.block_k if name == "dkdv" else c.block_q),)
    for other in configs[1:]:
        programs(other.block_k if name == "dkdv" else other.block_q)
    rec = _RECORD.get()
    if rec is not None:
        rec[1].append(Launch(name, _KERNELS[name], entry, args, dict(constexprs), configs, grid, arch, key, width))
        return
    if len(configs) > 1 and autotune_enabled():
        _run(_autotuned(table))[lambda meta: (B * triton.cdiv(N, meta[rows]),)](*args, **constexprs)
    else:
        _run(_KERNELS[name])[grid](*args, **constexprs, BLOCK_Q=c.block_q, BLOCK_K=c.block_k,
                                   num_warps=c.num_warps, num_stages=c.num_stages)


# ------------------------------------------------------------------------------------------------ forward
@triton.jit
def _forward_kernel(Q, K, V, O, A,
                    sqb, sqm, sqd, skb, skn, skd, svb, svn, sve, sob, som, soe, sab, sam, san,
                    N, D, E,
                    CAUSAL: tl.constexpr, STORE_A: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                    TANH: tl.constexpr, TANH_ERR: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per (query tile I, batch b): O_I = Σ_J tanh(Q_I K_Jᵀ) V_J (32), A_IJ stored if STORE_A."""
    pid_q, b = _program(N, BLOCK_Q)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_q < N
    q = _load(Q + b * sqb + offs_q[:, None] * sqm + offs_d[None, :] * sqd,
              row_ok[:, None] & (offs_d[None, :] < D), UPCAST)
    acc = tl.zeros((BLOCK_Q, BLOCK_E), dtype=tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((pid_q + 1) * BLOCK_Q, N)                                 # (37): later key tiles are 0
    for start_k in range(0, hi, BLOCK_K):
        offs_k = start_k + tl.arange(0, BLOCK_K)
        key_ok = offs_k < N
        kt = _load(K + b * skb + offs_k[None, :] * skn + offs_d[:, None] * skd,
                   key_ok[None, :] & (offs_d[:, None] < D), UPCAST)               # K_Jᵀ: (D, BK)
        x = tl.dot(q, kt, input_precision=PRECISION)                              # (1) X_IJ = Q_I K_Jᵀ
        a = _causal(_tanh(x, TANH, TANH_ERR), offs_q, offs_k, CAUSAL)             # (2), (37)
        v = _load(V + b * svb + offs_k[:, None] * svn + offs_e[None, :] * sve,
                  key_ok[:, None] & (offs_e[None, :] < E), UPCAST)
        if STORE_A:
            tl.store(A + b * sab + offs_q[:, None].to(tl.int64) * sam + offs_k[None, :] * san, a.to(A.dtype.element_ty),
                     mask=row_ok[:, None] & key_ok[None, :])
        acc = tl.dot(a.to(v.dtype), v, acc, input_precision=PRECISION)           # (3)/(32) O_I += A_IJ V_J
    tl.store(O + b * sob + offs_q[:, None] * som + offs_e[None, :] * soe, acc.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_e[None, :] < E))


# ----------------------------------------------------------------------------------------------- backward
@triton.jit
def _dkdv_kernel(Q, K, V, GO, A, GA, GK, GV,
                 sqb, sqm, sqd, skb, skn, skd, svb, svn, sve, sgb, sgm, sge, sab, sam, san, sgab, sgam, sgan,
                 sdkb, sdkn, sdkd, sdvb, sdvn, sdve,
                 N, D, E,
                 CAUSAL: tl.constexpr, SAVED_A: tl.constexpr, HAS_GO: tl.constexpr, HAS_GA: tl.constexpr,
                 NEED_K: tl.constexpr, NEED_V: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 TANH: tl.constexpr, TANH_ERR: tl.constexpr,
                 BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per (key tile J, batch b), looping over query tiles I, in transposed tiles (BK, BQ):
    G_V,J = Σ_I A_IJᵀ G_O,I and G_K,J = Σ_I G_X,IJᵀ Q_I (35), G_X,IJ by (33).  A_IJ is read from A when
    SAVED_A (the lab's op), else recomputed from Q_I, K_J (o-only)."""
    pid_k, b = _program(N, BLOCK_K)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    key_ok = offs_k < N
    if not SAVED_A:
        k = _load(K + b * skb + offs_k[:, None] * skn + offs_d[None, :] * skd,
                  key_ok[:, None] & (offs_d[None, :] < D), UPCAST)                # (BK, D)
    if NEED_K and HAS_GO:
        v = _load(V + b * svb + offs_k[:, None] * svn + offs_e[None, :] * sve,
                  key_ok[:, None] & (offs_e[None, :] < E), UPCAST)                # (BK, E)
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_E), dtype=tl.float32)
    lo = 0
    if CAUSAL:
        lo = (pid_k * BLOCK_K) // BLOCK_Q * BLOCK_Q                               # (38): earlier query tiles are 0
    for start_q in range(lo, N, BLOCK_Q):
        offs_q = start_q + tl.arange(0, BLOCK_Q)
        row_ok = offs_q < N
        if NEED_K or not SAVED_A:
            q = _load(Q + b * sqb + offs_q[:, None] * sqm + offs_d[None, :] * sqd,
                      row_ok[:, None] & (offs_d[None, :] < D), UPCAST)            # (BQ, D)
        if SAVED_A:
            at = _load(A + b * sab + offs_q[None, :].to(tl.int64) * sam + offs_k[:, None] * san,
                       row_ok[None, :] & key_ok[:, None], UPCAST).to(tl.float32)  # A_IJᵀ: (BK, BQ)
            slope_t = 1.0 - at * at
        else:
            at, slope_t = _tanh_and_slope(tl.dot(k, tl.trans(q), input_precision=PRECISION), TANH, TANH_ERR)
            at = _causal_t(at, offs_k, offs_q, CAUSAL)
        if HAS_GO:
            go = _load(GO + b * sgb + offs_q[:, None] * sgm + offs_e[None, :] * sge,
                       row_ok[:, None] & (offs_e[None, :] < E), UPCAST)           # (BQ, E)
            if NEED_V:
                dv = tl.dot(at.to(go.dtype), go, dv, input_precision=PRECISION)  # (35) G_V,J += A_IJᵀ G_O,I
        if NEED_K:
            gt = tl.zeros((BLOCK_K, BLOCK_Q), dtype=tl.float32)
            if HAS_GO:
                gt = tl.dot(v, tl.trans(go), input_precision=PRECISION)          # (33) (G_O,I V_Jᵀ)ᵀ
            if HAS_GA:
                gt += _load(GA + b * sgab + offs_q[None, :].to(tl.int64) * sgam + offs_k[:, None] * sgan,
                            row_ok[None, :] & key_ok[:, None], UPCAST).to(tl.float32)   # (33) + G_A,IJᵀ
            gxt = _causal_t(gt * slope_t, offs_k, offs_q, CAUSAL)                  # (33) G_X,IJᵀ, (38)
            dk = tl.dot(gxt.to(q.dtype), q, dk, input_precision=PRECISION)      # (35) G_K,J += G_X,IJᵀ Q_I
    if NEED_K:
        tl.store(GK + b * sdkb + offs_k[:, None] * sdkn + offs_d[None, :] * sdkd, dk.to(GK.dtype.element_ty),
                 mask=key_ok[:, None] & (offs_d[None, :] < D))
    if NEED_V:
        tl.store(GV + b * sdvb + offs_k[:, None] * sdvn + offs_e[None, :] * sdve, dv.to(GV.dtype.element_ty),
                 mask=key_ok[:, None] & (offs_e[None, :] < E))


@triton.jit
def _dq_kernel(Q, K, V, GO, A, GA, GQ,
               sqb, sqm, sqd, skb, skn, skd, svb, svn, sve, sgb, sgm, sge, sab, sam, san, sgab, sgam, sgan,
               sdqb, sdqm, sdqd,
               N, D, E,
               CAUSAL: tl.constexpr, SAVED_A: tl.constexpr, HAS_GO: tl.constexpr, HAS_GA: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, TANH: tl.constexpr, TANH_ERR: tl.constexpr,
               BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per (query tile I, batch b), looping over key tiles J: G_Q,I = Σ_J G_X,IJ K_J (34)."""
    pid_q, b = _program(N, BLOCK_Q)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_q < N
    if not SAVED_A:
        q = _load(Q + b * sqb + offs_q[:, None] * sqm + offs_d[None, :] * sqd,
                  row_ok[:, None] & (offs_d[None, :] < D), UPCAST)                # (BQ, D)
    if HAS_GO:
        go = _load(GO + b * sgb + offs_q[:, None] * sgm + offs_e[None, :] * sge,
                   row_ok[:, None] & (offs_e[None, :] < E), UPCAST)               # (BQ, E)
    dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((pid_q + 1) * BLOCK_Q, N)                                 # (38): later key tiles are 0
    for start_k in range(0, hi, BLOCK_K):
        offs_k = start_k + tl.arange(0, BLOCK_K)
        key_ok = offs_k < N
        k = _load(K + b * skb + offs_k[:, None] * skn + offs_d[None, :] * skd,
                  key_ok[:, None] & (offs_d[None, :] < D), UPCAST)                # (BK, D)
        if SAVED_A:
            a = _load(A + b * sab + offs_q[:, None].to(tl.int64) * sam + offs_k[None, :] * san,
                      row_ok[:, None] & key_ok[None, :], UPCAST).to(tl.float32)
            slope = 1.0 - a * a
        else:
            _, slope = _tanh_and_slope(tl.dot(q, tl.trans(k), input_precision=PRECISION), TANH, TANH_ERR)
        g = tl.zeros((BLOCK_Q, BLOCK_K), dtype=tl.float32)
        if HAS_GO:
            vt = _load(V + b * svb + offs_k[None, :] * svn + offs_e[:, None] * sve,
                       key_ok[None, :] & (offs_e[:, None] < E), UPCAST)           # V_Jᵀ: (E, BK)
            g = tl.dot(go, vt, input_precision=PRECISION)                         # (33) G_O,I V_Jᵀ
        if HAS_GA:
            g += _load(GA + b * sgab + offs_q[:, None].to(tl.int64) * sgam + offs_k[None, :] * sgan,
                       row_ok[:, None] & key_ok[None, :], UPCAST).to(tl.float32)  # (33) + G_A,IJ
        gx = _causal(g * slope, offs_q, offs_k, CAUSAL)                           # (33) G_X,IJ, (38)
        dq = tl.dot(gx.to(k.dtype), k, dq, input_precision=PRECISION)            # (34) G_Q,I += G_X,IJ K_J
    tl.store(GQ + b * sdqb + offs_q[:, None] * sdqm + offs_d[None, :] * sdqd, dq.to(GQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < D))


_KERNELS.update(forward=_forward_kernel, dkdv=_dkdv_kernel, dq=_dq_kernel)


# ---------------------------------------------------------------------------------------------- launchers
def effective_mask(grad_o: Optional[Tensor], grad_a: Optional[Tensor], output_mask: Sequence[bool]):
    """The gradients that are computed, of those asked for: G_V reads G_O only (13)/(35); with neither G_O nor
    G_A every gradient is zero.  The others are returned as ``None``."""
    want_q, want_k, want_v = map(bool, output_mask)
    if grad_o is None and grad_a is None:
        return False, False, False
    return want_q, want_k, want_v and grad_o is not None


def _tile(size: int) -> int:
    return max(16, triton.next_power_of_2(max(size, 1)))      # tl.dot needs every tile dimension >= 16


def _strides(t: Optional[Tensor]):
    """(batch, row, column) strides; a matrix (n, ·) has batch stride 0; an absent tensor all 0."""
    if t is None:
        return (0, 0, 0)
    return (0, *t.stride()) if t.dim() == 2 else tuple(t.stride())


def _consts(dtype: torch.dtype, D: int, E: int, precision: str) -> dict:
    return dict(PRECISION=precision, UPCAST=INTERPRET and dtype == torch.bfloat16, TANH=tanh_mode(dtype),
                TANH_ERR=_TANH_ERR.get(), BLOCK_D=_tile(D), BLOCK_E=_tile(E))


def _forward(q, k, v, causal, store_a, precision, block_q, block_k, entry):
    lead = tuple(q.shape[:-2])
    B, (N, D), E = (lead[0] if lead else 1), q.shape[-2:], v.shape[-1]
    o = q.new_empty((*lead, N, E))
    a = q.new_empty((*lead, N, N)) if store_a else None
    if B and N:
        _launch("forward", entry, B, N, D, E, q.dtype, precision,
                (q, k, v, o, a if store_a else o, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
                 *_strides(a), N, D, E),
                dict(CAUSAL=causal, STORE_A=store_a, **_consts(q.dtype, D, E, precision)), block_q, block_k, q)
    return o, a


def _backward(grad_o, grad_a, q, k, v, a, causal, output_mask, precision, block_q, block_k, entry):
    """The two backward kernels; ``a`` given: read tiles of it (the lab's op), else recompute them (o-only)."""
    want_q, want_k, want_v = effective_mask(grad_o, grad_a, output_mask)
    # Shapes from what was saved: q only for G_K, k only for G_Q, v only for G_Q or G_K (fused_backward).
    qk = q if q is not None else k
    base = a if a is not None else q
    lead = tuple(base.shape[:-2])
    B, N = (lead[0] if lead else 1), base.shape[-2]
    D = qk.shape[-1] if qk is not None else 0
    E = (v if v is not None else grad_o).shape[-1] if (v is not None or grad_o is not None) else 0
    dtype = qk.dtype if qk is not None else a.dtype
    gq = k.new_empty((*lead, N, D)) if want_q else None
    gk = q.new_empty((*lead, N, D)) if want_k else None
    gv = grad_o.new_empty((*lead, N, E)) if want_v else None
    if not (B and N) or not (want_q or want_k or want_v):
        return tuple(None if t is None else t.zero_() for t in (gq, gk, gv))
    any_ = next(t for t in (a, q, k, v, grad_o) if t is not None)
    ptr = lambda t: any_ if t is None else t                  # noqa: E731  (a pointer argument never loaded)
    flags = dict(CAUSAL=causal, SAVED_A=a is not None, HAS_GO=grad_o is not None, HAS_GA=grad_a is not None,
                 **_consts(dtype, D, E, precision))
    common = (*_strides(q), *_strides(k), *_strides(v), *_strides(grad_o), *_strides(a), *_strides(grad_a))
    if want_k or want_v:
        _launch("dkdv", entry, B, N, D, E, dtype, precision,
                (ptr(q), ptr(k), ptr(v), ptr(grad_o), ptr(a), ptr(grad_a), ptr(gk), ptr(gv),
                 *common, *_strides(gk), *_strides(gv), N, D, E),
                dict(NEED_K=want_k, NEED_V=want_v, **flags), block_q, block_k, any_)
    if want_q:
        _launch("dq", entry, B, N, D, E, dtype, precision,
                (ptr(q), ptr(k), ptr(v), ptr(grad_o), ptr(a), ptr(grad_a), gq, *common, *_strides(gq), N, D, E),
                flags, block_q, block_k, any_)
    return gq, gk, gv


def o_only_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, *, precision: str = "ieee",
                   block_q: Optional[int] = None, block_k: Optional[int] = None) -> Tensor:
    """``o = tanh(q kᵀ [masked (37)]) v`` on stacks (B, n, ·) or matrices (n, ·): one kernel, no n×n tensor."""
    return _forward(q, k, v, causal, False, precision, block_q, block_k, "o_only_forward")[0]


def o_only_backward(grad_o: Tensor, q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    output_mask: Sequence[bool] = (True, True, True), *, precision: str = "ieee",
                    block_q: Optional[int] = None, block_k: Optional[int] = None
                    ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``(G_Q, G_K, G_V)`` of ``o_only_forward`` by (33)-(35), (38), tiles of A recomputed; ``None`` where
    ``output_mask`` is False.  q and k are always read; v only for G_Q or G_K."""
    return _backward(grad_o, None, q, k, v, None, causal, output_mask, precision, block_q, block_k,
                     "o_only_backward")


def fused_forward(q: Tensor, k: Tensor, v: Tensor, *, precision: str = "ieee", block_q: Optional[int] = None,
                  block_k: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """The lab's op ``(o, a)`` (1)-(3) on stacks (B, n, ·) or matrices: a written once, o accumulated from the
    same tiles; o and a are two buffers."""
    return _forward(q, k, v, False, True, precision, block_q, block_k, "fused_forward")


def fused_backward(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                   v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool] = (True, True, True), *,
                   precision: str = "ieee", block_q: Optional[int] = None, block_k: Optional[int] = None
                   ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(9)-(13) by tiles (33)-(35) from the saved ``a``; ``grad_o`` / ``grad_a`` may be ``None`` (not loaded).
    As ``formulas.attn_backward``: q is read only for G_K, k only for G_Q, v only when G_O reaches q or k."""
    return _backward(grad_o, grad_a, q, k, v, a, False, output_mask, precision, block_q, block_k,
                     "fused_backward")


# --------------------------------------------------------------------------------------------- operators
# ``attn_lab::fused_forward`` / ``attn_lab::fused_backward``: ``torch.library.triton_op`` (torch >= 2.6) makes the
# kernels visible to torch.compile (the function is also the fake kernel: outputs are allocated with torch ops,
# kernels launched through ``wrap_triton``).  Under the interpreter ``wrap_triton`` is used only from torch 2.13
# on (before, it does not run interpreted kernels); elsewhere the raw kernels are launched.  ``TRACEABLE``: whether
# a compiled graph can hold the launches (not interpreted ones: ``wrap_triton`` hands those back unwrapped).
_HAS_TRITON_OP = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
_WRAP = _HAS_TRITON_OP and (not INTERPRET or tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 13))
TRACEABLE = _HAS_TRITON_OP and not INTERPRET


def _run(kernel):
    return torch.library.wrap_triton(kernel) if _WRAP else kernel


def _fused_forward_impl(q: Tensor, k: Tensor, v: Tensor, precision: str) -> Tuple[Tensor, Tensor]:
    return fused_forward(q, k, v, precision=precision)


def _fused_backward_impl(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor],
                         k: Optional[Tensor], v: Optional[Tensor], a: Tensor, need_q: bool, need_k: bool,
                         need_v: bool, precision: str) -> Tuple[Tensor, Tensor, Tensor]:
    """An operator returns tensors: a gradient not computed (``effective_mask``) is an empty tensor."""
    grads = fused_backward(grad_o, grad_a, q, k, v, a, (need_q, need_k, need_v), precision=precision)
    return tuple(a.new_empty(0) if g is None else g for g in grads)


def _setup_context(ctx, inputs, output):
    q, k, v, precision = inputs
    need_q, need_k = ctx.needs_input_grad[:2]
    ctx.save_for_backward(q if need_k else None, k if need_q else None, v if need_q or need_k else None,
                          output[1])                                         # section 6's save rule
    ctx.precision = precision
    ctx.set_materialize_grads(False)           # an unused output's gradient stays None: no n×n zeros


def _fused_backward_rule(ctx, grad_o, grad_a):
    q, k, v, a = ctx.saved_tensors
    mask = effective_mask(grad_o, grad_a, ctx.needs_input_grad[:3])
    if torch.is_grad_enabled():
        raise NotImplementedError(
            "attn_lab::fused_forward: the fused backward kernels are not differentiable (create_graph=True); "
            "use torch_impl.attn, whose backward runs the differentiable formulas when the graph is kept")
    grads = fused_backward_op(grad_o, grad_a, q, k, v, a, *mask, ctx.precision)
    return (*(g if want else None for g, want in zip(grads, mask)), None)


if _HAS_TRITON_OP:
    fused_forward_op = torch.library.triton_op("attn_lab::fused_forward", _fused_forward_impl, mutates_args=())
    fused_backward_op = torch.library.triton_op("attn_lab::fused_backward", _fused_backward_impl, mutates_args=())
    fused_forward_op.register_autograd(_fused_backward_rule, setup_context=_setup_context)
else:                                          # torch < 2.6: plain functions, same signatures
    fused_forward_op, fused_backward_op = _fused_forward_impl, _fused_backward_impl
