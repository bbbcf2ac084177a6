"""``python -m benchmarks.gpu_kernels [--quick] [--out DIR | --update-results] [--budget-s S]``: the fused
kernels against their alternatives on one GPU (issue 30), in one command that stays within ``--budget-s``
(default 450 s: the whole run, imports, compiles and timing, is meant to end within 8 minutes on one H100).

Cases: bfloat16 then float32; B·H = 16 heads of n ∈ {1024, 4096, 16384}, d = e = 128; then the long case
n = 131072, B·H = 1 (o-only contenders and SDPA).  Modes: ``fwd`` (the forward as in training: inputs require
grad) and ``fwd+bwd`` (cotangent on o only; the lab's a is returned but gets no cotangent).  Contenders:

=============  ======================================================================================
lab_fused      ``vmap(torch_impl.attn)``, the lab's op (o, a) on the Triton kernels (CUDA only)
lab_aten       the same with ``torch_impl.kernels.use_fused(False)``: ATen, unfused
lab_compile    ``torch.compile`` of the composite ``a = tanh(q kᵀ); (a v, a)``
o_triton       ``torch_impl.attn_o``: o only, Triton, flash-style backward (CUDA only)
o_aten         the composite ``tanh(q kᵀ) v`` in eager ATen (three n×n buffers in its backward)
o_compile      ``torch.compile`` of that composite
sdpa_flash     ``scaled_dot_product_attention`` under ``sdpa_kernel(FLASH_ATTENTION)``: softmax, the speed
               anchor at equal shapes (CUDA float16 / bfloat16 only)
lab_pallas     ``jax.vmap(jax_impl.kernels.attn_fused)`` (JAX GPU backend only)
lab_jit        ``jax.jit`` of the composite (o, a)
o_pallas       ``jax_impl.attn_o`` (JAX GPU backend only)
o_jit          ``jax.jit`` of the composite o
=============  ======================================================================================

A contender that cannot run here is reported ``not run: <reason>``; one that runs out of memory ``OOM`` (caught:
the run goes on); any other failure ``error: <exception>``; whatever is left when the budget is spent
``skipped: <why>``.  torch runs first (every case), then JAX (after ``torch.cuda.empty_cache()``; JAX is told
not to preallocate), so neither framework's allocator pool starves the other; the torch phase may use
``TORCH_SHARE`` of the budget, JAX the rest.

Time: ``measure.time_steps`` (every (contender, mode) step of a case interleaved in shuffled order, CUDA
synchronised), medians; ratios within one framework are paired per repetition (``harness.paired_ratio``), Pallas
against Triton unpaired (``harness.unpaired_ratio``).  Memory: torch, ``torch.cuda.max_memory_allocated`` over
one step above what was allocated before it (the inputs excluded); JAX, XLA's ``memory_analysis()`` of the
compiled step (temp + output bytes).  TFLOP/s: :func:`flops` of what each contender computes (module
``FLOPS_RULE``).  float32 matmuls are pinned to IEEE in both frameworks (``contenders.pinned_fp32_precision``,
JAX ``default_matmul_precision("float32")``), so the Triton float32 dots are IEEE too (no TF32).

Writes ``gpu_kernels.json`` and ``gpu_kernels.md`` into ``--out`` (default: the git-ignored
``benchmarks/scratch/gpu_kernels/`` (``.../quick`` with ``--quick``); ``--update-results``: the committed
``benchmarks/results/``, a full run on CUDA only).  ``--quick``: tiny sizes (B·H = 2, n = 32, d = e = 16;
long case n = 128), a few repetitions, no ``torch.compile``: a seconds-long smoke run on CPU.
"""

from __future__ import annotations

import importlib
import gc
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

if __package__ in (None, ""):           # python benchmarks/gpu_kernels.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch_impl  # noqa: E402
from benchmarks import contenders as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks import measure as M  # noqa: E402

SCRATCH = os.path.join(H.SCRATCH, "gpu_kernels")    # the default; --update-results: H.RESULTS
DEFAULT_BUDGET_S = 450.0
TORCH_SHARE = 0.6          # the torch phase stops starting new work at this fraction of the budget
MODES = ("fwd", "fwd+bwd")
DTYPES = ("bfloat16", "float32")

# (name, n, batch·heads, d = e, contenders restricted to) per size set; None = every contender
FULL_SIZES = {"bh": 16, "d": 128, "ns": (1024, 4096, 16384), "long": (131072, 1)}
QUICK_SIZES = {"bh": 2, "d": 16, "ns": (32,), "long": (128, 1)}

FLOPS_RULE = ("forward 2n²(d+e)·BH for every contender (4n²d at d = e: (1) and (3)); backward: the lab's op and "
              "the composites 4n²(d+e)·BH (8n²d: (9), (11)-(13)); o-only Triton / Pallas n²(8d+6e)·BH (14n²d, "
              "docs/kernels.md: the dK/dV kernel recomputes X and G_O Vᵀ, the dQ kernel both again); SDPA flash "
              "n²(6d+4e)·BH (10n²d, FlashAttention-2's count: 2.5 × the forward)")


def flops(algo: str, mode: str, n: int, d: int, e: int, bh: int) -> int:
    """FLOPs of one step of ``algo`` ("lab": the lab's op or a composite, autograd's backward (9)-(13);
    "o_only": the Triton / Pallas o-only kernels with their recomputing backward; "sdpa": flash attention)."""
    fwd = 2 * n * n * (d + e) * bh
    if mode == "fwd":
        return fwd
    bwd = {"lab": 4 * n * n * (d + e), "o_only": n * n * (8 * d + 6 * e), "sdpa": n * n * (6 * d + 4 * e)}[algo] * bh
    if mode == "bwd":
        return bwd
    assert mode == "fwd+bwd", mode
    return fwd + bwd


# --------------------------------------------------------------------------------------------- contenders

@dataclass
class Spec:
    name: str
    label: str
    framework: str           # "torch" / "jax"
    algo: str                # for flops(): "lab", "o_only", "sdpa"
    op: str                  # "lab" (returns o, a), "o" (returns o)
    long_case: bool          # runs in the long case (n = 131072, B·H = 1)
    # unavailable(env, case) -> "" or why it cannot run here; build(env, case, mode, cache) -> step
    unavailable: Callable = None
    build: Callable = None


@dataclass
class Env:
    device: str              # torch device: "cuda" or "cpu"
    quick: bool
    compile: bool
    jax_device: object = None
    jax_why: str = ""        # why JAX contenders cannot run at all ("" when they can)
    jax_gpu: bool = False


class _fused_switch:
    """``kernels.use_fused(flag)`` for the duration of one call (steps of both kinds are interleaved)."""

    def __init__(self, flag):
        self.flag = flag

    def __enter__(self):
        from torch_impl import kernels
        self.saved = kernels.fused_enabled()
        kernels.use_fused(self.flag)

    def __exit__(self, *exc):
        from torch_impl import kernels
        kernels.use_fused(self.saved)


def _lab(flag):
    fn = torch.func.vmap(torch_impl.attn)

    def call(q, k, v):
        with _fused_switch(flag):
            return tuple(fn(q, k, v))
    return call


def _attn_o(q, k, v):
    with _fused_switch(True):
        return torch_impl.attn_o(q, k, v)


def _sdpa_flash(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0),
                                                                v.unsqueeze(0))[0]


def torch_step(fn: Callable, op: str, mode: str, x: dict) -> Callable:
    """``fwd``: ``fn(q, k, v)``; ``fwd+bwd``: ``contenders.grad_step`` with the cotangent on o only."""
    q, k, v, go = x["q"], x["k"], x["v"], x["go"]
    if mode == "fwd":
        return lambda: fn(q, k, v)
    return C.grad_step(fn, (q, k, v), lambda out: (out[0] if op == "lab" else out, go))


def _needs_cuda_triton(what):
    def unavailable(env, case):
        if env.device != "cuda":
            return (f"not run: needs CUDA ({what} compiles for a GPU; on {env.device} torch_impl takes ATen, "
                    f"which lab_aten / o_aten already time)")
        from torch_impl import kernels
        x = case.get("torch_inputs")
        if x is None:             # asked before the inputs exist (a case skipped for the budget)
            return ""
        with _fused_switch(True):
            if not kernels.triton_applies(x["q"], x["k"], x["v"]):
                return ("not run: torch_impl.kernels.triton_applies(q, k, v) is False here (triton missing, "
                        "TANH_ATTN_FUSED=0, or d > MAX_HEAD_DIM)")
        return ""
    return unavailable


def _needs_compile(env, case):
    return "" if env.compile else ("not run: left out of --quick (inductor's compile alone outlasts the quick run)"
                                   if env.quick else "not run: --no-compile")


def _sdpa_unavailable(env, case):
    if env.device != "cuda":
        return f"not run: SDPA's flash backend needs CUDA (device here: {env.device})"
    if case["dtype"] not in ("float16", "bfloat16"):
        return f"not run: SDPA's flash backend takes float16 / bfloat16 only, not {case['dtype']}"
    return ""


def _compiled_build(target, op):
    def build(env, case, mode, cache):
        key = ("compiled", target)
        if key not in cache:          # one compile per case, shared by both modes (inputs require grad in both)
            torch.compiler.reset()
            cache[key] = torch.compile(target, dynamic=False)
        return torch_step(cache[key], op, mode, case["torch_inputs"])
    return build


def _eager_build(fn, op):
    return lambda env, case, mode, cache: torch_step(fn, op, mode, case["torch_inputs"])


def _no_reason(env, case):
    return ""


TORCH_SPECS = [
    Spec("lab_fused", "vmap(torch_impl.attn), Triton fused", "torch", "lab", "lab", False,
         _needs_cuda_triton("the Triton kernel"), _eager_build(_lab(True), "lab")),
    Spec("lab_aten", "vmap(torch_impl.attn), use_fused(False): ATen unfused", "torch", "lab", "lab", False,
         _no_reason, _eager_build(_lab(False), "lab")),
    Spec("o_triton", "torch_impl.attn_o, Triton o-only", "torch", "o_only", "o", True,
         _needs_cuda_triton("the Triton kernel"), _eager_build(_attn_o, "o")),
    Spec("o_aten", "composite tanh(q kᵀ) v, eager ATen", "torch", "lab", "o", True,
         _no_reason, _eager_build(C.composite_o, "o")),
    Spec("sdpa_flash", "scaled_dot_product_attention, flash backend (softmax)", "torch", "sdpa", "o", True,
         _sdpa_unavailable, _eager_build(_sdpa_flash, "o")),
    Spec("lab_compile", "torch.compile of the composite (o, a)", "torch", "lab", "lab", False,
         _needs_compile, _compiled_build(C.composite, "lab")),
    Spec("o_compile", "torch.compile of the composite o", "torch", "lab", "o", True,
         _needs_compile, _compiled_build(C.composite_o, "o")),
]


def _jax_unavailable(pallas: bool):
    def unavailable(env, case):
        if env.jax_why:
            return f"not run: {env.jax_why}"
        if pallas:
            try:
                importlib.import_module("jax_impl.kernels")     # refuses a JAX older than its MIN_JAX
            except ImportError as exc:
                return f"not run: {exc}"
        if pallas and not env.jax_gpu:
            return (f"not run: Pallas kernels are timed on a GPU backend only (JAX's device here: "
                    f"{env.jax_device.platform}; on CPU they run under the interpreter, which is not timed)")
        return ""
    return unavailable


def _jax_fn(name):
    import jax
    import jax.numpy as jnp
    import jax_impl

    if name == "lab_pallas":
        from jax_impl import kernels as jk       # only here: the composites run where the Pallas kernels do not
        fused = jax.vmap(jk.attn_fused)
        return lambda q, k, v: tuple(fused(q, k, v))
    if name == "lab_jit":
        def lab(q, k, v):
            a = jnp.tanh(q @ jnp.swapaxes(k, -1, -2))
            return a @ v, a
        return lab
    if name == "o_pallas":
        return jax_impl.attn_o
    assert name == "o_jit", name
    return lambda q, k, v: jnp.tanh(q @ jnp.swapaxes(k, -1, -2)) @ v


def _jax_build(env, case, mode, cache, spec):
    import jax

    fn = _jax_fn(spec.name)
    x = case["jax_inputs"]
    if mode == "fwd":
        f, args = fn, (x["q"], x["k"], x["v"])
    elif spec.op == "lab":
        def f(q, k, v, go):          # a returned (the op's output) without a cotangent: has_aux
            o, pullback, a = jax.vjp(fn, q, k, v, has_aux=True)
            return o, a, pullback(go)
        args = (x["q"], x["k"], x["v"], x["go"])
    else:
        def f(q, k, v, go):
            o, pullback = jax.vjp(fn, q, k, v)
            return o, pullback(go)
        args = (x["q"], x["k"], x["v"], x["go"])
    step, _, seconds, memory = C.jax_compiled(f, args)
    cache.setdefault("compile_s", {})[(spec.name, mode)] = seconds
    if memory:
        cache.setdefault("peak", {})[(spec.name, mode)] = memory["temp_bytes"] + memory["output_bytes"]
    return step


JAX_SPECS = [
    Spec("lab_pallas", "jax.vmap(jax_impl.kernels.attn_fused), Pallas fused", "jax", "lab", "lab", False,
         _jax_unavailable(True)),
    Spec("lab_jit", "jax.jit of the composite (o, a)", "jax", "lab", "lab", False, _jax_unavailable(False)),
    Spec("o_pallas", "jax_impl.attn_o, Pallas o-only", "jax", "o_only", "o", True, _jax_unavailable(True)),
    Spec("o_jit", "jax.jit of the composite o", "jax", "lab", "o", True, _jax_unavailable(False)),
]
for _s in JAX_SPECS:
    _s.build = (lambda s: lambda env, case, mode, cache: _jax_build(env, case, mode, cache, s))(_s)

SPECS = TORCH_SPECS + JAX_SPECS


# --------------------------------------------------------------------------------------------- OOM

def is_oom(exc: BaseException) -> bool:
    """torch's ``OutOfMemoryError`` (CUDA or a fake one), or an allocator failure by its message (XLA's
    ``RESOURCE_EXHAUSTED``, cuBLAS / Triton allocation failures)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return any(s in text for s in ("out of memory", "Out of memory", "RESOURCE_EXHAUSTED", "OUT_OF_MEMORY"))


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _failure(exc: BaseException) -> str:
    if is_oom(exc):
        return "OOM"
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"error: {type(exc).__name__}: {first}"


# --------------------------------------------------------------------------------------------- one case

def make_case(dtype: str, n: int, bh: int, d: int, long: bool) -> dict:
    return {"key": f"{dtype},n={n},bh={bh}", "dtype": dtype, "n": n, "bh": bh, "d": d, "e": d, "long": long,
            "results": {}}


def _torch_inputs(case: dict, device: str) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, case["dtype"])
    shape = (case["bh"], case["n"], case["d"])
    scale = case["d"] ** -0.25          # q kᵀ of order one: tanh not saturated
    q, k = ((torch.randn(shape, generator=gen, device=device) * scale).to(dt).requires_grad_() for _ in range(2))
    v, go = (torch.randn(shape, generator=gen, device=device).to(dt) for _ in range(2))
    return {"q": q, "k": k, "v": v.requires_grad_(), "go": go}


def _jax_inputs(case: dict, dev) -> dict:
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 4)
    shape = (case["bh"], case["n"], case["d"])
    dt = getattr(jnp, case["dtype"])
    scale = case["d"] ** -0.25
    out = {name: jax.device_put((jax.random.normal(key, shape, jnp.float32) * (scale if name in "qk" else 1.0))
                                .astype(dt), dev) for name, key in zip(("q", "k", "v", "go"), keys)}
    jax.block_until_ready(out)
    return out


Timing = M.Timing          # what each framework's phase of the run times with


def run_case(case: dict, specs: List[Spec], env: Env, timing: Timing, deadline: float, framework: str) -> None:
    """Fill ``case["results"][name][mode]`` for ``specs`` (one framework): first call (compile / JIT included),
    peak memory, then every step that ran timed together by ``measure.time_steps``."""
    device = env.device if framework == "torch" else "jax"   # time_steps synchronises torch CUDA only
    if framework == "jax":
        if not env.jax_why:
            case["jax_inputs"] = _jax_inputs(case, env.jax_device)
    else:
        case["torch_inputs"] = _torch_inputs(case, env.device)
    steps, cache = {}, {}
    for spec in specs:
        res = case["results"].setdefault(spec.name, {})
        why = spec.unavailable(env, case)
        for mode in MODES:
            r = res.setdefault(mode, {})
            r["flops"] = flops(spec.algo, mode, case["n"], case["d"], case["e"], case["bh"])
            if why:
                r["status"] = why
                continue
            if time.perf_counter() > deadline:
                r["status"] = "skipped: over the time budget (--budget-s)"
                continue
            try:
                step = spec.build(env, case, mode, cache)
                out, first_s = M.timed_first_call(step, device)
                del out
                r["first_call_s"] = first_s
                if framework == "torch":
                    # CPU: None (the profiler-based measure.step_memory costs more than the quick run)
                    r["peak_bytes"] = M.cuda_peak(step) if env.device == "cuda" else None
                    r["peak_source"] = "torch.cuda.max_memory_allocated above the step's start" \
                        if env.device == "cuda" else None
                else:
                    r["compile_s"] = cache.get("compile_s", {}).get((spec.name, mode))
                    r["peak_bytes"] = cache.get("peak", {}).get((spec.name, mode))
                    r["peak_source"] = "XLA memory_analysis: temp + output bytes"
                r["status"] = "ok"
                steps[(spec.name, mode)] = step
            except Exception as exc:  # noqa: BLE001 - one contender's failure must not end the run
                r["status"] = _failure(exc)
                step = None
            if r["status"] != "ok":   # released once the exception (its traceback holds the step's tensors) is gone
                _release(env.device)
    _time(case, steps, timing, device, env.device)
    case.pop("torch_inputs", None)
    case.pop("jax_inputs", None)
    del steps, cache
    _release(env.device)


def _time(case: dict, steps: dict, timing: Timing, sync_device: str, device: str) -> None:
    if not steps:
        return
    groups, measured = [steps], None
    try:
        measured = [timing.time(steps, sync_device)]
    except Exception:  # noqa: BLE001 - e.g. OOM from the allocator's fragmentation: time each step alone (below)
        pass
    if measured is None:
        _release(device)
        groups, measured = [], []
        for key, step in steps.items():
            try:
                measured.append(timing.time({key: step}, sync_device, budget_s=timing.budget_s / len(steps)))
                groups.append({key: step})
            except Exception as exc:  # noqa: BLE001
                fail = _failure(exc)
                case["results"][key[0]][key[1]]["status"] = fail + (": while timing" if fail == "OOM" else
                                                                    " (while timing)")
            _release(device)
    for group_id, (group, t) in enumerate(zip(groups, measured)):
        for (name, mode) in group:
            r = case["results"][name][mode]
            samples = t["samples"][(name, mode)]
            s = H.summarize(samples)
            r.update(median_s=s["median"], q1_s=s["q1"], q3_s=s["q3"], reps=s["n"], inner=t["inner"][(name, mode)],
                     samples=samples, group=f"{'jax' if sync_device == 'jax' else 'torch'}{group_id}",
                     tflops=r["flops"] / s["median"] / 1e12 if s["median"] > 0 else None)


# --------------------------------------------------------------------------------------------- ratios

# (name, numerator, denominator, what it says); time ratios, per case and mode
RATIOS = [
    ("lab: ATen unfused / Triton fused", "lab_aten", "lab_fused", "speed-up of the fused lab op over ATen"),
    ("lab: torch.compile / Triton fused", "lab_compile", "lab_fused", "speed-up of the fused lab op over inductor"),
    ("lab: Triton fused / SDPA flash", "lab_fused", "sdpa_flash", "the lab op against the softmax anchor"),
    ("o-only: Triton / SDPA flash", "o_triton", "sdpa_flash", "o-only against the softmax anchor"),
    ("o-only: ATen unfused / Triton", "o_aten", "o_triton", "speed-up of o-only over the eager composite"),
    ("o-only: torch.compile / Triton", "o_compile", "o_triton", "speed-up of o-only over inductor"),
    ("lab: Pallas / Triton", "lab_pallas", "lab_fused", "Pallas against Triton (unpaired: other process phase)"),
    ("o-only: Pallas / Triton", "o_pallas", "o_triton", "Pallas against Triton (unpaired)"),
    ("lab: jax.jit composite / Pallas", "lab_jit", "lab_pallas", "speed-up of Pallas over XLA"),
    ("o-only: jax.jit composite / Pallas", "o_jit", "o_pallas", "speed-up of Pallas over XLA"),
]


def ratio(num: dict, den: dict) -> Optional[dict]:
    """``num`` time over ``den`` time: paired per repetition (``harness.paired_ratio``) when both were timed in
    the same ``time_steps`` group, else the quartiles of ``num`` over the median of ``den``; ``None`` unless
    both ran."""
    if not (num and den and num.get("status") == "ok" and den.get("status") == "ok"
            and num.get("samples") and den.get("samples")):
        return None
    if num.get("group") == den.get("group") and len(num["samples"]) == len(den["samples"]):
        return dict(H.paired_ratio(num["samples"], den["samples"]), paired=True)
    return H.unpaired_ratio(num["samples"], den["samples"])


def case_ratios(case: dict) -> List[dict]:
    out = []
    for name, num, den, what in RATIOS:
        for mode in MODES:
            n_r, d_r = case["results"].get(num, {}).get(mode), case["results"].get(den, {}).get(mode)
            if n_r is None or d_r is None:
                continue          # a contender this case does not have (the long case's lab op)
            r = ratio(n_r, d_r)
            entry = {"name": name, "mode": mode, "numerator": num, "denominator": den, "what": what}
            if r is None:
                entry["why_not"] = "; ".join(f"{c}: {x.get('status')}" for c, x in ((num, n_r), (den, d_r))
                                             if x.get("status") != "ok")
            else:
                entry.update(r)
            out.append(entry)
    return out


def _find(cases, dtype, n, bh=None):
    for c in cases:
        if c["dtype"] == dtype and c["n"] == n and (bh is None or c["bh"] == bh):
            return c
    return None


def targets(cases: List[dict], sizes: dict) -> List[dict]:
    """Issue 30's targets, each with the figures measured in this run (reported, never asserted)."""
    ns, (long_n, long_bh) = sizes["ns"], sizes["long"]
    mid = list(ns[-2:])         # n = 4096 and 16384 in a full run

    def pick(dtype, n, name, mode="fwd+bwd"):
        c = _find(cases, dtype, n, long_bh if n == long_n else None)
        if c is None:
            return None, "case not run"
        r = next((x for x in c.get("ratios", []) if x["name"] == name and x["mode"] == mode), None)
        if r is None:
            return None, "no such ratio"
        return (r["median"], "") if "median" in r else (None, r.get("why_not", ""))

    out = []

    def add(target, name, where, bound, better):
        measured = []
        for dtype, n in where:
            value, why = pick(dtype, n, name)
            measured.append({"dtype": dtype, "n": n, "ratio": value, "why_not": why,
                             "met": None if value is None else (value >= bound if better == ">=" else value <= bound)})
        out.append({"target": target, "ratio": name, "bound": f"{better} {bound}", "measured": measured})

    add("fused lab op fwd+bwd ≥ 1.7× faster than ATen unfused (bf16)", "lab: ATen unfused / Triton fused",
        [("bfloat16", n) for n in mid], 1.7, ">=")
    add("o-only fwd+bwd within 1.25× of SDPA flash at equal shapes", "o-only: Triton / SDPA flash",
        [("bfloat16", n) for n in (*ns, long_n)], 1.25, "<=")
    add("Pallas within 1.3× of Triton (lab op)", "lab: Pallas / Triton", [(dt, n) for dt in DTYPES for n in ns],
        1.3, "<=")
    add("Pallas within 1.3× of Triton (o-only)", "o-only: Pallas / Triton",
        [(dt, n) for dt in DTYPES for n in (*ns, long_n)], 1.3, "<=")
    long_runs = []
    for dtype in DTYPES:
        c = _find(cases, dtype, long_n, long_bh)
        st = (lambda name: c["results"].get(name, {}).get("fwd+bwd", {}).get("status") if c else "case not run")
        fast, slow = st("o_triton"), st("o_aten")
        f, s = _short(fast), _short(slow)
        decided = f in ("ok", "OOM") and s in ("ok", "OOM")    # both ran, or ran out of memory
        long_runs.append({"dtype": dtype, "n": long_n, "o_triton": fast, "o_aten": slow,
                          "met": (f == "ok" and s == "OOM") if decided else None})
    out.append({"target": f"o-only runs at n = {long_n}, B·H = {long_bh} where the unfused path runs out of memory",
                "ratio": None, "bound": "o_triton ok, o_aten OOM", "measured": long_runs})
    return out


# --------------------------------------------------------------------------------------------- report

def _short(status: Optional[str]) -> str:
    """"ok", "OOM", or the word before the reason ("not run", "skipped", "error")."""
    return (status or "?").split(":")[0]


def _fmt_cell(r: dict) -> str:
    st = r.get("status", "?")
    if st != "ok":
        return _short(st)
    ms = f"{r['median_s'] * 1e3:.3f}" if r.get("median_s") is not None else "?"
    tf = f"{r['tflops']:.3g}" if r.get("tflops") is not None else "–"
    peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") is not None else "–"
    return f"{ms} ms, {tf} TFLOP/s, {peak} GiB"


def markdown(res: dict) -> str:
    meta = res["meta"]
    lines = [f"# Fused kernels on {meta['device_name']}", "",
             f"{meta['date']}; torch {meta['torch']}, triton {meta.get('triton')}, JAX {meta.get('jax')} "
             f"({meta.get('jax_device')}); Python {meta['python']}; "
             f"{'quick (tiny sizes)' if meta['quick'] else 'full'} "
             f"run, {meta['elapsed_s']:.0f} s of a {meta['budget_s']:.0f} s budget. float32 matmuls IEEE "
             f"(torch {meta.get('fp32_precision')}, JAX default_matmul_precision float32).", "",
             f"Each cell: median time, TFLOP/s by the contender's own FLOP count ({FLOPS_RULE}), peak memory "
             f"(torch: CUDA allocator peak above the step's start; JAX: XLA's memory analysis, temp + output). "
             f"`fwd` is the forward as in training (inputs require grad); `fwd+bwd` takes the cotangent of o only.",
             ""]
    for case in res["cases"]:
        lines += [f"## {case['dtype']}, n = {case['n']}, B·H = {case['bh']}, d = e = {case['d']}", ""]
        lines += H.md_table(["contender", *MODES], ([name, *(_fmt_cell(modes.get(m, {})) for m in MODES)]
                                                    for name, modes in case["results"].items()))
        reasons = {}
        for name, modes in case["results"].items():
            for m in MODES:
                st = modes.get(m, {}).get("status", "?")
                if st not in ("ok", "OOM"):
                    reasons.setdefault(st, []).append(f"{name} {m}")
        if reasons:
            lines += [""] + [f"* {', '.join(who)}: {why}" for why, who in reasons.items()]
        rs = [r for r in case.get("ratios", []) if "median" in r]
        if rs:
            lines += [""] + H.md_table(["ratio (time / time)", "mode", "median", "IQR", "paired"], (
                [r["name"], r["mode"], f"{r['median']:.2f}", f"{r['q1']:.2f}–{r['q3']:.2f}",
                 "yes" if r.get("paired") else "no"] for r in rs))
        lines.append("")
    lines += ["## Targets (issue 30), as measured in this run", ""]
    for t in res["targets"]:
        parts = []
        for m in t["measured"]:
            if t["ratio"] is None:
                parts.append(f"{m['dtype']}: o_triton {_short(m['o_triton'])}, o_aten {_short(m['o_aten'])}"
                             + ("" if m["met"] is None else f" ({'met' if m['met'] else 'not met'})"))
            elif m["ratio"] is None:
                parts.append(f"{m['dtype']} n={m['n']}: not measured")
            else:
                parts.append(f"{m['dtype']} n={m['n']}: {m['ratio']:.2f} ({'met' if m['met'] else 'not met'})")
        lines.append(f"* {t['target']} [{t['ratio'] or t['bound']}{' ' + t['bound'] if t['ratio'] else ''}]: "
                     + "; ".join(parts))
    if res.get("notes"):
        lines += ["", "Notes:", *[f"* {n}" for n in res["notes"]]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = H.parser("python -m benchmarks.gpu_kernels", __doc__, raw=True)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions, no torch.compile (CPU smoke)")
    H.out_or_update(p, out_help="output directory (default: benchmarks/scratch/gpu_kernels[/quick])",
                    update_help="write the committed benchmarks/results/gpu_kernels.{json,md} (a full run on CUDA)")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"whole-run budget in seconds (default {DEFAULT_BUDGET_S:.0f}; quick 120): what is left "
                        f"when it is spent is reported skipped")
    p.add_argument("--device", default=None, help="cuda (default where torch has it) or cpu")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile contenders")
    p.add_argument("--no-jax", action="store_true", help="leave out the JAX contenders")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu"):
        p.error(f"--device: '{args.device}' is neither cuda nor cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda, but this torch ({torch.__version__}) has no usable CUDA")
    if args.update_results and (args.quick or args.device != "cuda" or args.no_compile or args.no_jax
                                or args.budget_s is not None):
        p.error("--update-results writes the committed results, a full run's on CUDA: leave out --quick, "
                "--budget-s, --no-compile and --no-jax, on a machine with a GPU (or give --out DIR)")
    if args.budget_s is None:
        args.budget_s = 120.0 if args.quick else DEFAULT_BUDGET_S
    args.out = H.chosen_out(args, H.RESULTS, os.path.join(SCRATCH, "quick") if args.quick else SCRATCH)
    return args


def _jax_env(env: Env, skip: bool) -> None:
    if skip:
        env.jax_why = "--no-jax"
        return
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # torch and JAX share the GPU in turn
    try:
        import jax  # noqa: F401
        import jax_impl  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        env.jax_why = f"JAX not available ({type(exc).__name__}: {exc})"
        return
    dev, why = C.jax_device(env.device)
    if dev is None:
        env.jax_why = why
        return
    env.jax_device, env.jax_gpu = dev, dev.platform == "gpu"


def _meta(args, env: Env) -> dict:
    meta = {"date": H.date_utc(),
            "python": platform.python_version(), "torch": torch.__version__, "quick": args.quick,
            "budget_s": args.budget_s, "device": env.device,
            "device_name": torch.cuda.get_device_name(0) if env.device == "cuda" else platform.processor() or "cpu",
            "flops_rule": FLOPS_RULE, "modes": list(MODES)}
    try:
        import triton
        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        meta["triton"] = None
    if not env.jax_why or env.jax_device is not None:
        import jax
        meta["jax"] = jax.__version__
        meta["jax_device"] = C.describe_jax_device(env.jax_device) if env.jax_device is not None else None
    return meta


def plan_cases(sizes: dict) -> List[dict]:
    """bfloat16 first (the targets are bf16), the long case after each dtype's regular sizes."""
    cases = []
    for dtype in DTYPES:
        cases += [make_case(dtype, n, sizes["bh"], sizes["d"], False) for n in sizes["ns"]]
        cases.append(make_case(dtype, *sizes["long"], sizes["d"], True))
    return cases


def run(args) -> dict:
    t_start = time.perf_counter()
    env = Env(device=args.device, quick=args.quick, compile=not (args.quick or args.no_compile))
    _jax_env(env, args.no_jax)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    timing = (Timing(budget_s=0.02, min_reps=2, max_reps=3, sample_s=0.0) if args.quick
              else Timing(budget_s=3.0, min_reps=3, max_reps=15, sample_s=0.02))
    cases = plan_cases(sizes)
    notes = []
    phases = [("torch", TORCH_SPECS, t_start + TORCH_SHARE * args.budget_s),
              ("jax", JAX_SPECS, t_start + args.budget_s)]
    with C.pinned_fp32_precision():
        fp32 = C.torch_fp32_precision()
        for framework, specs, deadline in phases:
            if framework == "jax" and env.device == "cuda":
                torch.cuda.empty_cache()            # torch's cached blocks back to the device for JAX
            for case in cases:
                chosen = [s for s in specs if s.long_case or not case["long"]]
                if time.perf_counter() > deadline:
                    for s in chosen:
                        for mode in MODES:
                            r = case["results"].setdefault(s.name, {}).setdefault(mode, {})
                            r["flops"] = flops(s.algo, mode, case["n"], case["d"], case["e"], case["bh"])
                            r["status"] = (s.unavailable(env, case)
                                           or f"skipped: over the {framework} phase's time budget")
                    continue
                print(f"[{time.perf_counter() - t_start:6.1f} s] {framework} {case['key']}", flush=True)
                run_case(case, chosen, env, timing, deadline, framework)
    if any(r.get("status", "").startswith("skipped") for c in cases for m in c["results"].values()
           for r in m.values()):
        notes.append(f"some cases were skipped: the run reached its --budget-s of {args.budget_s:.0f} s "
                     f"(torch phase: {TORCH_SHARE:.0%} of it); rerun with a larger --budget-s to fill them")
    for case in cases:
        case["ratios"] = case_ratios(case)
    meta = _meta(args, env)
    meta["fp32_precision"] = fp32
    meta["elapsed_s"] = time.perf_counter() - t_start
    return {"meta": meta, "cases": cases, "targets": targets(cases, sizes), "notes": notes}


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run(args)
    H.write_json(res, os.path.join(args.out, "gpu_kernels.json"), default=H.numpy_default)
    text = markdown(res)
    H.write_text(os.path.join(args.out, "gpu_kernels.md"), text)
    print(text)
    print(f"written: {os.path.join(args.out, 'gpu_kernels.json')}, gpu_kernels.md "
          f"({res['meta']['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
