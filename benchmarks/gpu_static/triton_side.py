"""The Triton side of the GPU-static check: every launch ``torch_impl.kernels.triton_attn``'s launchers make,
captured from the launchers themselves, compiled for each arch with the launch's exact specialisation and
options, and assembled by ``cubin.analyse_ptx``.

How the variants are found: each public launcher (``o_only_forward``, ``o_only_backward``, ``fused_forward``,
``fused_backward``) runs on meta tensors inside ``triton_attn.record_launches(arch)`` for every dtype (float16,
bfloat16, float32 with exact and with TF32 dots), causal or not, every ``output_mask`` and every combination of
absent cotangents, and the (d, e) of ``SHAPES``.  Each recorded ``Launch`` carries its kernel, positional
arguments, constexprs and the configurations it may run (the default first, then the autotune list); the
launch's specialisation (pointer alignment, strides of 1 as constants, 16-divisible sizes) is computed by triton's
own binder for a ``GPUTarget`` of that arch, as ``JITFunction.run`` would on the GPU.  A flag a launcher starts
passing shows up here without a list to update.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["capture", "jobs", "rows", "compile_job", "in_check_scope", "SHAPES", "CHECK_SHAPES", "CHECK_ARCHS",
           "CHECK_DTYPES", "ARCH_CAPS"]

ARCH_CAPS = {"sm_80": 80, "sm_90a": 90, "sm_100a": 100}
SHAPES = [(16, 16), (64, 64), (128, 128), (256, 256), (64, 128), (128, 64), (16, 256)]   # (d, e), full run
CHECK_SHAPES = [(64, 64), (128, 128)]                                                      # --check
CHECK_ARCHS = ("sm_80", "sm_90a")
CHECK_DTYPES = ("fp16", "bf16", "tf32")      # exact float32 runs ATen on a GPU (kernels.triton_applies)
N = 4096                                  # sequence length of the meta inputs (does not enter the code)
B = 2


def _dtype_cases():
    import torch
    return [("fp16", torch.float16, "ieee"), ("bf16", torch.bfloat16, "ieee"), ("fp32", torch.float32, "ieee"),
            ("tf32", torch.float32, "tf32")]


def capture(arch: str, shapes: Sequence[Tuple[int, int]]) -> list:
    """Every launch the launchers make for ``arch`` over the dtypes, flags and ``shapes`` (meta tensors)."""
    import itertools
    import torch
    from torch_impl.kernels import triton_attn as T
    launches = []
    masks = [m for m in itertools.product((False, True), repeat=3) if any(m)]
    with T.record_launches(arch) as rec:
        for (_, dtype, precision), (d, e) in itertools.product(_dtype_cases(), shapes):
            mk = lambda *s: torch.empty(*s, device="meta", dtype=dtype)      # noqa: E731
            q, k, v, go = mk(B, N, d), mk(B, N, d), mk(B, N, e), mk(B, N, e)
            a, ga = mk(B, N, N), mk(B, N, N)
            for causal in (False, True):
                T.o_only_forward(q, k, v, causal, precision=precision)
                for mask in masks:
                    T.o_only_backward(go, q, k, v, causal, mask, precision=precision)
            T.fused_forward(q, k, v, precision=precision)
            for (g_o, g_a), mask in itertools.product(((go, ga), (go, None), (None, ga)), masks):
                T.fused_backward(g_o, g_a, q, k, v, a, mask, precision=precision)
        launches.extend(rec)
    return launches


def _variant(launch) -> str:
    """The launch's ``KERNELS`` name (the Pallas launch's too), then its flags: "o_dkdv GO need-KV causal"."""
    c = launch.constexprs
    from torch_impl.kernels import triton_attn as T
    parts = [T.table_name(launch.name, c)]
    if launch.name != "forward":
        parts += [flag for flag, on in (("GO", c["HAS_GO"]), ("GA", c["HAS_GA"])) if on]
        if launch.name == "dkdv":
            parts.append("need-" + "K" * c["NEED_K"] + "V" * c["NEED_V"])
    if c["CAUSAL"]:
        parts.append("causal")
    return " ".join(parts)


def _entries(launch) -> dict:
    c = launch.constexprs
    return {k: v for k, v in c.items() if k not in ("BLOCK_D", "BLOCK_E", "UPCAST")}


def jobs(arch: str, shapes, check: bool, candidates: Optional[Sequence] = None, kinds=None,
         dtypes: Optional[Sequence[str]] = None, subsets: bool = True) -> List[dict]:
    """One picklable job per (distinct launch variant, configuration) for ``arch``: what ``compile_job`` needs
    (signature, constexprs, attrs by triton's binder for that target) and the row's description.
    ``candidates``: compile these ``LaunchConfig`` instead of the launch's own list (the sweep), only for the
    variants whose table entry is in ``kinds`` when given.  ``dtypes``: only these dtype keys (default: all but
    "fp32" with ``check`` or ``candidates``, all otherwise).  ``subsets`` False: not the dK/dV kernels asked for one
    of G_K, G_V where both could be computed (by default they are in: a launch of its own, whose registers
    differ)."""
    from torch_impl.kernels import triton_attn as T
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget("cuda", ARCH_CAPS[arch], 32)
    backend = make_backend(target)
    binders = {}
    rec_arch = arch if arch in T.ARCHS else "sm_90a"     # sm_100a: the H100 table's configurations
    out, seen = [], set()
    for launch in capture(rec_arch, shapes):
        kernel = launch.kernel
        if kernel not in binders:
            binders[kernel] = create_function_from_signature(kernel.signature, kernel.params, backend)
        d, e = launch.args[-2], launch.args[-1]
        fast = check or candidates is not None
        # --check (and the sweep) leave out exact float32 (its entries run ATen on a GPU: kernels.triton_applies)
        if launch.dtype not in (dtypes or (CHECK_DTYPES if fast else T.DTYPE_KEYS)):
            continue
        if not subsets and launch.name == "dkdv" and not (
                launch.constexprs["NEED_K"] and launch.constexprs["NEED_V"]) and launch.constexprs["HAS_GO"]:
            continue
        table = T.table_name(launch.name, launch.constexprs)
        if candidates is None and not T.launch_configs(launch.arch, launch.dtype, table, launch.width):
            continue        # no proven configuration: the entries run ATen on a GPU (triton_attn.proven)
        configs = launch.configs[:1] if check else launch.configs
        if candidates is not None:
            if kinds is not None and table not in kinds:
                continue
            configs = tuple(candidates)
        for i, cfg in enumerate(configs):
            kwargs = dict(launch.constexprs, BLOCK_Q=cfg.block_q, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages)
            bound, spec, options = binders[kernel](*launch.args, **kwargs)
            options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, options)
            key = (launch.name, repr(sorted(signature.items())), repr(sorted(constexprs.items())),
                   repr(sorted(attrs.items())), cfg)
            if key in seen:
                continue
            seen.add(key)
            out.append(dict(
                name=launch.name, arch=arch, signature=signature, constexprs=constexprs, attrs=attrs,
                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                row=dict(framework="triton", entry=launch.entry, kernel=kernel.__name__, variant=_variant(launch),
                         flags=_entries(launch), dtype=launch.dtype, d=d, e=e,
                         causal=bool(launch.constexprs["CAUSAL"]),
                         config=dict(block_q=cfg.block_q, block_k=cfg.block_k, num_warps=cfg.num_warps,
                                     num_stages=cfg.num_stages),
                         default=i == 0 and candidates is None, arch=arch,
                         table=table)))
    return out


def compile_job(job: dict) -> dict:
    """Compile one job with triton for its target, assemble its PTX, and return its row (schema in
    ``benchmarks.gpu_static``)."""
    import contextlib
    import io
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torch_impl.kernels import triton_attn as T
    from .cubin import SHARED_LIMIT, analyse_cubin, analyse_ptx, mufu_per_element
    row = dict(job["row"])
    row.pop("table", None)
    row = dict(row, in_check=False, compiled=False, error=None, registers=None, spill_store_bytes=None,
               spill_load_bytes=None, stack_bytes=None, shared_bytes=None, shared_limit=SHARED_LIMIT[job["arch"]],
               mma={}, mufu={}, ffma=None, mufu_per_element=None, problems=[], seconds=None)
    start = time.perf_counter()
    try:
        kernel = T._KERNELS[job["name"]]
        src = ASTSource(fn=kernel, signature=job["signature"], constexprs=job["constexprs"], attrs=job["attrs"])
        log = io.StringIO()
        knobs.nvidia.dump_ptxas_log = True            # triton prints its own ptxas -v log: read it
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=GPUTarget("cuda", ARCH_CAPS[job["arch"]], 32),
                                      options=job["options"])
        if "Compiling entry function" in log.getvalue():
            fig = analyse_cubin(compiled.asm["cubin"], job["arch"], log.getvalue())
        else:               # triton's cache answered (no ptxas run, no log): assemble its PTX the same way
            fig = analyse_ptx(compiled.asm["ptx"], job["arch"])
    except Exception as exc:                      # noqa: BLE001 - the row reports it
        text = str(exc).strip().splitlines()
        row["error"] = f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
        row["seconds"] = round(time.perf_counter() - start, 2)
        row["problems"] = [f"does not compile: {row['error']}"]
        return row
    cfg = row["config"]
    tanh_tile = job["name"] == "forward" or not row["flags"].get("SAVED_A", False)
    row.update(compiled=True, registers=fig["registers"], spill_store_bytes=fig["spill_store_bytes"],
               spill_load_bytes=fig["spill_load_bytes"], stack_bytes=fig["stack_bytes"],
               shared_bytes=int(compiled.metadata.shared) + fig["shared_static_bytes"], mma=fig["mma"],
               mufu=fig["mufu"], ffma=fig["ffma"],
               mufu_per_element=(round(mufu_per_element(fig, cfg["num_warps"], cfg["block_q"] * cfg["block_k"]), 3)
                                 if tanh_tile else None),
               seconds=round(time.perf_counter() - start, 2))
    row["problems"] = problems(row)
    return row


#: Problems measured and accepted for now, each with its reason: (arch, dtype, d, e, variant, "BMxBNwWsS") →
#: reason.  A matching row keeps its figures and problems, is marked ``known``, and does not fail ``--check``;
#: a row not listed (or a listed one whose problems change) does.  Fill it from a run, never by hand-guessing.
KNOWN_PROBLEMS: Dict[tuple, str] = {}


def _known_key(row: dict) -> tuple:
    c = row["config"]
    return (row["arch"], row["dtype"], row["d"], row["e"], row["variant"],
            f"{c['block_q']}x{c['block_k']}w{c['num_warps']}s{c['num_stages']}")


def problems(row: dict) -> List[str]:
    """The regressions a row shows (empty: clean)."""
    out = []
    if not row["compiled"]:
        return [f"does not compile: {row['error']}"]
    spill = (row["spill_store_bytes"] or 0) + (row["spill_load_bytes"] or 0)
    if spill:
        out.append(f"spills {row['spill_store_bytes']} B stored / {row['spill_load_bytes']} B loaded per thread")
    if row["shared_bytes"] > row["shared_limit"]:
        out.append(f"shared memory {row['shared_bytes'] / 1024:.0f} KiB > {row['shared_limit'] / 1024:.0f} KiB")
    if row["arch"] == "sm_90a" and row["dtype"] in ("fp16", "bf16", "tf32") and not row["mma"].get("HGMMA"):
        out.append("no HGMMA (wgmma) on sm_90a")
    if (row["dtype"] in ("fp16", "bf16") and row["mufu_per_element"] is not None
            and row["mufu_per_element"] > 1.0 + 1e-9):
        out.append(f"{row['mufu_per_element']:g} MUFU operations per score element (target 1)")
    return out


def _fresh_cache() -> None:
    """An empty triton cache for the workers (forked after this): every row is a real build whose ptxas log is
    read (a cache hit has none; ``compile_job`` then re-assembles, which is the fallback, not the rule)."""
    import tempfile
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpu_static_cache_")
    try:
        from triton import knobs
        knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
    except (ImportError, AttributeError):          # pragma: no cover - older triton: the variable suffices
        pass


def in_check_scope(row: dict) -> bool:
    """Whether a row is one ``--check`` compiles: a default configuration at ``CHECK_SHAPES`` on ``CHECK_ARCHS`` in
    ``CHECK_DTYPES`` (every flag set, the dK/dV kernels asked for only one of G_K, G_V included)."""
    return bool(row["default"] and (row["d"], row["e"]) in CHECK_SHAPES and row["arch"] in CHECK_ARCHS
                and row["dtype"] in CHECK_DTYPES)


def rows(check: bool, archs: Iterable[str] = ("sm_80", "sm_90a", "sm_100a"), workers: int = 2,
         progress=None, shapes=None, dtypes=None, subsets: bool = True) -> List[dict]:
    """Every row of the Triton side: ``check`` the fast subset (default configurations at d = e in
    ``CHECK_SHAPES``, sm_80 and sm_90a), else every variant and configuration of ``SHAPES`` for ``archs``."""
    archs = [a for a in archs if not (check and a == "sm_100a")]
    all_jobs = []
    for arch in archs:
        all_jobs += jobs(arch, shapes or (CHECK_SHAPES if check else SHAPES), check, dtypes=dtypes, subsets=subsets)
    # the subset marker: default configurations at the check shapes on sm_80 / sm_90a
    out: List[dict] = []
    _fresh_cache()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, row in enumerate(pool.map(compile_job, all_jobs, chunksize=1)):
            row["in_check"] = in_check_scope(row)
            if row["arch"] == "sm_100a" and not row["compiled"]:
                row["problems"] = []       # reported, not a regression: the bundled toolchain's limits there
            row["known"] = KNOWN_PROBLEMS.get(_known_key(row)) if row["problems"] else None
            out.append(row)
            if progress is not None:
                progress(i + 1, len(all_jobs), row)
    return out


def sweep(archs: Sequence[str], dtypes: Optional[Sequence[str]], shapes: Sequence[Tuple[int, int]], kinds: Sequence[str],
          candidates: Sequence, workers: int = 2, progress=None) -> Dict[tuple, List]:
    """Compile every variant (the dK/dV kernels asked for one of G_K, G_V included) of the table entries ``kinds``
    at each (d, e) of ``shapes`` with each candidate configuration; return {(arch, dtype, kind, width):
    [configurations clean in every variant at every shape of that width]} in candidate order (how
    ``triton_attn.CONFIGS`` is chosen)."""
    from torch_impl.kernels import triton_attn as T
    all_jobs = []
    for arch in archs:
        all_jobs += jobs(arch, shapes, False, candidates, set(kinds), dtypes=dtypes)
    bad, seen = set(), set()
    _fresh_cache()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, (job, row) in enumerate(zip(all_jobs, pool.map(compile_job, all_jobs, chunksize=1))):
            c = row["config"]
            key = (row["arch"], row["dtype"], job["row"]["table"], T.width_of(row["d"], row["e"]),
                   (c["block_q"], c["block_k"], c["num_warps"], c["num_stages"]))
            seen.add(key)
            if row["problems"]:
                bad.add(key)
            if progress is not None:
                progress(i + 1, len(all_jobs), row)
    out: Dict[tuple, List] = {}
    for arch, dtype, kind, width, cfg in sorted(seen):
        out.setdefault((arch, dtype, kind, width), [])
    for cand in candidates:
        cfg = (cand.block_q, cand.block_k, cand.num_warps, cand.num_stages)
        for key in out:
            if key + (cfg,) in seen and key + (cfg,) not in bad:
                out[key].append(cfg)
    return out
