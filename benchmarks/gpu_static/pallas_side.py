"""The Pallas side of the GPU-static check: every ``jax_impl.kernels`` entry lowered for CUDA, its kernels compiled.

``rows(check)`` lowers each entry (``attn_o`` forward and gradient, causal or not; ``attn_o_jvp``; ``attn_fused``
and its VJP; bfloat16, float16, float32) with ``jax.export.export(jax.jit(f), platforms=["cuda"])`` under the
installed JAX's default configuration (``interpret=False``, no GPU needed), takes every ``__gpu$xla.gpu.triton``
custom call out of the lowered module, turns the Triton-dialect module its ``backend_config`` carries (MLIR
bytecode, with the ``num_warps`` / ``num_stages`` the kernel asked for) into text, and compiles that with the
installed triton for sm_90a (and sm_80 in the full run), reading the figures with :func:`cubin.analyse_ptx`.
That is an approximation of what XLA's own Triton does with the module (same IR, same options; XLA's Triton
version may differ), good enough for registers, spills, shared memory and the instruction mix.

One row per (entry, kernel, dtype, d = e, arch) in the schema of ``benchmarks/gpu_static/__init__.py``; a
lowering failure is one row with ``kernel`` ``None`` and the error's first line.  A kernel appearing in several
entries (the forward inside the gradient) is compiled once per configuration and reported under its first entry.

Needs the ``.venv-gpu`` venv (``jax-cuda13-plugin`` / ``jax-cuda13-pjrt`` installed ``--no-deps``) and
``JAX_PLATFORMS=cpu``.  ``python -m benchmarks.gpu_static.pallas_side [--check] [--sweep KERNEL]`` prints the rows
(``--sweep``: every candidate configuration of one kernel at d = e = 128, for choosing the defaults in
``jax_impl/kernels/pallas_attn.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import itertools
import json
import os
import sys
import tempfile
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from . import cubin
from .triton_side import SHAPES as _TRITON_SHAPES

__all__ = ["rows", "lower", "triton_modules", "compile_module", "ENTRIES", "sweep"]

N = 1024                            # sequence length of the lowered entries (a multiple of every tile)
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
CHECK_ARCHS = ("sm_90a",)
FULL_ARCHS = ("sm_90a", "sm_80")
CHECK_SHAPES = ((128, 128),)       # (d, e) of --check
FULL_SHAPES = tuple(_TRITON_SHAPES)   # (d, e) of the full run: the Triton side's
TRITON_TARGET = "__gpu$xla.gpu.triton"


def _jax():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    return jax, jnp


# --- the entries -------------------------------------------------------------------------------------------------

def _entries(jax, jnp, K, sizes: dict) -> Dict[str, Tuple[Callable, Callable]]:
    """name → (function, argument shapes as a function of (dtype, d, e)); ``sizes``: block_q ... overrides."""
    kw = dict(interpret=False, **sizes)

    def s3(dt, *f):
        return [jax.ShapeDtypeStruct((1, N, x), dt) for x in f]

    def s2(dt, *f):
        return [jax.ShapeDtypeStruct((N, x), dt) for x in f]

    def o_grad(causal):
        def f(q, k, v, g):
            _, vjp = jax.vjp(lambda *x: K.attn_o(*x, causal=causal, **kw), q, k, v)
            return vjp(g)
        return f

    def o_jvp(causal):
        def f(q, k, v, qd, kd, vd):
            return jax.jvp(lambda *x: K.attn_o_jvp(*x, causal=causal, **kw), (q, k, v), (qd, kd, vd))
        return f

    def fused_vjp(q, k, v, go, ga):
        _, vjp = jax.vjp(lambda *x: tuple(K.attn_fused(*x, **kw)), q, k, v)
        return vjp((go, ga))

    out = {}
    for causal in (False, True):
        tag = " causal" if causal else ""
        out[f"attn_o{tag}"] = (functools.partial(lambda c, q, k, v: K.attn_o(q, k, v, causal=c, **kw), causal),
                               lambda dt, d, e: s3(dt, d, d, e))
        out[f"attn_o grad{tag}"] = (o_grad(causal), lambda dt, d, e: s3(dt, d, d, e, e))
        out[f"attn_o_jvp{tag}"] = (o_jvp(causal), lambda dt, d, e: s3(dt, d, d, e, d, d, e))
    out["attn_fused"] = (lambda q, k, v: tuple(K.attn_fused(q, k, v, **kw)), lambda dt, d, e: s2(dt, d, d, e))
    out["attn_fused vjp"] = (fused_vjp,
                             lambda dt, d, e: s2(dt, d, d, e) + [jax.ShapeDtypeStruct((N, e), dt),
                                                                 jax.ShapeDtypeStruct((N, N), dt)])
    return out


ENTRIES = ("attn_o", "attn_o grad", "attn_o_jvp", "attn_o causal", "attn_o grad causal", "attn_o_jvp causal",
           "attn_fused", "attn_fused vjp")


# --- lowering and the embedded Triton modules ----------------------------------------------------------------------

def lower(fn, args):
    """``jax.export`` of ``jax.jit(fn)`` for CUDA (the Triton custom call allowed): the Exported object."""
    jax, _ = _jax()
    checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_TARGET)]
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)


def _ir_context():
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib.triton import dialect as tt_dialect
    ctx = jmlir.make_ir_context()
    tt_dialect.register_dialect(ctx)
    ctx.load_all_available_dialects()
    return ctx


def triton_modules(exported) -> List[dict]:
    """Each ``__gpu$xla.gpu.triton`` custom call of the lowered module: ``name``, ``ttir`` (the Triton-dialect
    module as text), ``num_warps``, ``num_stages``, ``grid``."""
    from jax._src.lib.mlir import ir
    found: List[dict] = []
    with _ir_context():
        module = ir.Module.parse(exported.mlir_module())

        def walk(op):
            for region in op.regions:
                for block in region:
                    for inner in block:
                        if (inner.name == "stablehlo.custom_call"
                                and ir.StringAttr(inner.attributes["call_target_name"]).value == TRITON_TARGET):
                            cfg = ir.DictAttr(inner.attributes["mhlo.backend_config"])
                            tt = ir.Module.parse(ir.StringAttr(cfg["ir"]).value_bytes)
                            found.append(dict(
                                name=ir.StringAttr(cfg["name"]).value,
                                ttir=tt.operation.get_asm(enable_debug_info=False),
                                num_warps=ir.IntegerAttr(cfg["num_warps"]).value,
                                num_stages=ir.IntegerAttr(cfg["num_stages"]).value,
                                grid=tuple(ir.IntegerAttr(cfg[f"grid_{a}"]).value for a in "xyz")))
                        walk(inner)
        walk(module.operation)
    return found


def compile_module(ttir: str, arch: str, num_warps: int, num_stages: int) -> dict:
    """Compile a Triton-dialect module (text) with the installed triton for ``arch``; figures as
    :func:`cubin.analyse_ptx` plus ``shared_bytes`` (Triton's dynamic shared memory + the static part)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    cc = int(arch[3:].rstrip("af"))
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")      # triton 3.9's default, without its warning
    log = io.StringIO()
    # As triton_side: triton's own cubin and the -v log of its own ptxas run (its flags), read, not re-assembled;
    # always compiled (a cache hit would run no ptxas, so print no log).
    saved = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = True, True
    try:
        with tempfile.TemporaryDirectory(prefix="pallas_static_") as tmp:
            path = os.path.join(tmp, "kernel.ttir")
            with open(path, "w") as f:
                f.write(ttir)
            with contextlib.redirect_stdout(log):
                compiled = triton.compile(path, target=GPUTarget("cuda", cc, 32),
                                          options={"num_warps": num_warps, "num_stages": num_stages})
    finally:
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = saved
    fig = cubin.analyse_cubin(compiled.asm["cubin"], arch, log.getvalue())
    fig["shared_bytes"] = int(compiled.metadata.shared) + fig.get("shared_static_bytes", 0)
    return fig


# --- rows ----------------------------------------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _row(**kw) -> dict:
    from . import ROW_KEYS
    row = {k: None for k in ROW_KEYS}
    row.update(framework="pallas", problems=[])
    row.update(kw)
    return row


def _problems(row: dict) -> List[str]:
    out = []
    if not row["compiled"]:
        out.append(f"does not compile: {row['error']}")
        return out
    if row["spill_store_bytes"] or row["spill_load_bytes"]:
        out.append(f"spills {row['spill_store_bytes']} B stores / {row['spill_load_bytes']} B loads per thread")
    if row["shared_bytes"] is not None and row["shared_bytes"] > row["shared_limit"]:
        out.append(f"shared memory {row['shared_bytes']} B over the {row['arch']} limit {row['shared_limit']} B")
    if row["arch"] == "sm_90a" and row["dtype"] in ("bf16", "fp16") and not row["mma"].get("HGMMA"):
        out.append("no HGMMA (wgmma) in a 16-bit sm_90a kernel")
    return out


def _kernel_rows(entry: str, dtype: str, d: int, e: int, archs, in_check: bool, sizes: dict, seen: set,
                 default: bool) -> List[dict]:
    jax, jnp = _jax()
    from jax_impl import kernels as K
    from jax_impl.kernels import pallas_attn as P
    fn, shapes = _entries(jax, jnp, K, sizes)[entry]
    causal = "causal" in entry
    base = dict(entry=entry, dtype=dtype, d=d, e=e, causal=causal, default=default)
    start = time.perf_counter()
    try:
        exported = lower(fn, shapes(getattr(jnp, DTYPES[dtype]), d, e))
        modules = triton_modules(exported)
    except Exception as exc:  # noqa: BLE001 - the row reports it
        row = _row(**base, in_check=in_check, kernel=None, variant=f"{entry} lowering", flags={}, arch="any",
                   compiled=False,
                   error=_first_line(exc), seconds=round(time.perf_counter() - start, 2))
        row["problems"] = _problems(row)
        return [row]
    out = []
    for mod in modules:
        kernel = mod["name"].removeprefix("tanh_attn_")
        bs = P.launch_config(kernel, DTYPES[dtype], d, e)._replace(
            **{k: v for k, v in sizes.items() if v is not None})
        key = (kernel, dtype, d, e, causal, bs, mod["num_warps"], mod["num_stages"], mod["ttir"])
        if key in seen:
            continue
        seen.add(key)
        config = dict(block_q=bs.block_q, block_k=bs.block_k, num_warps=mod["num_warps"],
                      num_stages=mod["num_stages"])
        flags = dict(causal=causal, fast_tanh=P._fast_tanh(DTYPES[dtype], False))
        for arch in archs:
            t0 = time.perf_counter()
            row = _row(**base, in_check=in_check and arch in CHECK_ARCHS, kernel=mod["name"],
                       variant=f"{kernel}{' causal' if causal else ''}", flags=flags, config=config, arch=arch,
                       shared_limit=cubin.SHARED_LIMIT[arch])
            try:
                fig = compile_module(mod["ttir"], arch, mod["num_warps"], mod["num_stages"])
            except Exception as exc:  # noqa: BLE001 - the row reports it
                row.update(compiled=False, error=_first_line(exc))
            else:
                row.update(compiled=True, error=None, **{k: fig.get(k) for k in (
                    "registers", "spill_store_bytes", "spill_load_bytes", "stack_bytes", "shared_bytes", "mma",
                    "mufu", "ffma")})
                # One loop iteration handles one (block_q, block_k) tile of scores (forward, dq, jvp: keys; dkdv:
                # queries, the same tile transposed).
                row["mufu_per_element"] = round(cubin.mufu_per_element(fig, mod["num_warps"],
                                                                        bs.block_q * bs.block_k), 3)
            row["problems"] = _problems(row)
            row["seconds"] = round(time.perf_counter() - t0, 2)
            out.append(row)
    return out


def rows(check: bool) -> List[dict]:
    """Every entry × dtype (× ``FULL_SHAPES`` and sm_80 in the full run; d = e = 128 on sm_90a with ``check``)
    lowered for CUDA with its default configurations and its kernels compiled: rows of the shared schema."""
    archs, shapes = (CHECK_ARCHS, CHECK_SHAPES) if check else (FULL_ARCHS, FULL_SHAPES)
    seen: set = set()
    out: List[dict] = []
    for (d, e), entry, dtype in itertools.product(shapes, ENTRIES, DTYPES):
        out += _kernel_rows(entry, dtype, d, e, archs, in_check=(d, e) in CHECK_SHAPES, sizes={}, seen=seen,
                            default=True)
    return out


SWEEP = dict(block_q=(16, 32, 64, 128), block_k=(16, 32, 64, 128), num_warps=(4, 8), num_stages=(1, 2, 3))


def sweep(entry: str, dtype: str, d: int = 128, arch: str = "sm_90a",
          space: Optional[dict] = None) -> List[dict]:
    """Rows of ``entry`` at every configuration of ``space`` (default :data:`SWEEP`), for choosing defaults."""
    space = space or SWEEP
    out: List[dict] = []
    seen: set = set()
    for values in itertools.product(*space.values()):
        sizes = dict(zip(space, values))
        out += _kernel_rows(entry, dtype, d, d, (arch,), in_check=False, sizes=sizes, seen=seen, default=False)
    return out


def _summary(row: dict) -> str:
    c = row["config"] or {}
    cfg = f"{c.get('block_q')}x{c.get('block_k')} w{c.get('num_warps')} s{c.get('num_stages')}" if c else "-"
    if not row["compiled"]:
        return f"{row['entry']:20} {row['kernel'] or '-':28} {row['dtype']} d={row['d']} {row['arch']}: {row['error']}"
    return (f"{row['entry']:20} {row['kernel']:28} {row['dtype']} d={row['d']:<3} {row['arch']:6} {cfg:16} "
            f"regs {row['registers']:3} spill {row['spill_store_bytes']:5} smem {row['shared_bytes']:6} "
            f"mma {row['mma']} mufu {row['mufu']} /elt {row['mufu_per_element']}"
            + (f"  PROBLEMS: {'; '.join(row['problems'])}" if row["problems"] else ""))


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="the fast subset (d = e = 128, sm_90a)")
    parser.add_argument("--sweep", metavar="ENTRY", help="every candidate config of one entry (d = e = 128)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(list(argv) if argv is not None else None)
    out = sweep(args.sweep, args.dtype, args.d) if args.sweep else rows(args.check)
    for row in out:
        print(_summary(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    bad = [r for r in out if r["problems"] and (r["in_check"] or not args.check)]
    print(f"{len(out)} rows, {len(bad)} with problems", file=sys.stderr)
    return 1 if bad and not args.sweep else 0


if __name__ == "__main__":
    sys.exit(main())
