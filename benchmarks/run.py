"""Command line: ``python -m benchmarks`` from the repository root.

    --quick            few-second smoke run (n=2 and n=256, float32, no torch.compile, few repetitions)
    --sizes S[,S...]   each ``N`` (d=e=64) or ``NxDxE``; default 2x3x4,64,256,1024,4096,2048x256x256
    --dtypes D[,D...]  float32,float64 by default
    --out DIR          results directory: results.json, results.png, report.md.  Default: the git-ignored
                       benchmarks/scratch/ (full/, quick/ or partial/; ``--threads N``: .../threadsN, ``--device
                       cuda``: .../cuda), so no run replaces the committed results unless asked to
    --update-results   write the committed benchmarks/results/ (threadsN/, cuda/ likewise); only for a full run
                       (every default size, dtype, budget, contender and the plot): the run the README shows
    --budget SECONDS   timing budget per (size, dtype) case; repetitions = budget / (one round), clamped
    --no-compile / --no-jax    leave those contenders out (reported as skipped)
    --threads N        torch.set_num_threads(N) (and single-threaded XLA for N=1); default: libraries' defaults
    --device cuda      torch and JAX contenders on CUDA (peak via torch.cuda.max_memory_allocated); default cpu.
                       JAX runs on the device given (its GPU backend for cuda) or is left out, saying why
    --batched BxN[,...]  batched cases (d=e=64, float32; benchmarks/batched.py); default 8x1024,32x256 in a
                       full run, none with --quick or --sizes; ``none`` skips them
    --no-sharded / --sharded  leave out / add the sharded case (benchmarks/sharded.py: each layout on 4 CPU ranks,
                       torch gloo and JAX host devices, as subprocesses); a full run includes it, --quick and
                       partial runs leave it out unless --sharded (with --quick: n=256, 3 repetitions)

float32 matmuls run at full IEEE precision in both frameworks (no TF32); the report shows the settings.
Optional dependencies (matplotlib unless --no-plot, JAX unless --no-jax, CUDA for --device cuda) are checked
before any work.  Prints a table of medians and ratios, then the performance targets with their measured figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch

from benchmarks import batched as B
from benchmarks import contenders as C
from benchmarks import harness as H
from benchmarks import inductor_code as IC
from benchmarks import kernels as K
from benchmarks import measure as M
from benchmarks import report as R
from benchmarks import sharded as S

DEFAULT_SIZES = "2x3x4,64,256,1024,4096,2048x256x256"
DEFAULT_DTYPES = "float32,float64"
DEFAULT_BUDGET = 10.0
# what a committed full run's figures depend on: the op in both frameworks, its contract, and the benchmark
# program itself (tests/repo/test_docs_readme.py fails when any of it changed after the commit a run recorded)
MEASURED = ("torch_impl", "jax_impl", "attn_contract.py", "benchmarks/*.py")


def parse_sizes(text: str):
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        parts = [int(p) for p in item.split("x")]
        if len(parts) == 1:
            out.append((parts[0], 64, 64))
        elif len(parts) == 3:
            out.append(tuple(parts))
        else:
            raise argparse.ArgumentTypeError(f"--sizes: '{item}' is neither N nor NxDxE")
    return out


def parse_args(argv=None):
    p = H.parser("python -m benchmarks", __doc__, whole_doc=True, raw=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", type=parse_sizes, default=None)
    p.add_argument("--dtypes", default=None)
    p.add_argument("--out", default=None, help="results directory (default: see above)")
    p.add_argument("--update-results", action="store_true",
                   help="write the committed benchmarks/results/ (a full run only)")
    p.add_argument("--budget", type=float, default=None, help="seconds of timing per case (default 10, quick 0.4)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-jax", action="store_true")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads for torch (torch.set_num_threads) and XLA (1 = single-threaded Eigen); "
                        "default: each library's own default. 1 gives stable ratios on a loaded shared machine")
    p.add_argument("--batched", default=None, help="batched cases BxN[,BxN...] (d=e=64, float32) or none")
    p.add_argument("--no-sharded", action="store_true", help="leave out the sharded case (4 CPU ranks)")
    p.add_argument("--sharded", action="store_true", help="add the sharded case to a --quick or partial run")
    args = p.parse_args(argv)
    try:
        # by default only a full run (no --quick, no --sizes) adds the batched cases
        default = "none" if args.quick or args.sizes is not None else B.DEFAULT
        args.batched = B.parse(args.batched if args.batched is not None else default)
    except ValueError as exc:
        p.error(str(exc))
    if args.sizes is None:
        args.sizes = parse_sizes("2x3x4,256" if args.quick else DEFAULT_SIZES)
    args.dtypes = [d.strip() for d in (args.dtypes or ("float32" if args.quick else DEFAULT_DTYPES)).split(",")]
    for d in args.dtypes:
        if d not in ("float32", "float64"):
            p.error(f"--dtypes: unsupported dtype '{d}' (float32, float64)")
    if args.budget is None:
        args.budget = 0.4 if args.quick else DEFAULT_BUDGET
    platform_, _, index = args.device.partition(":")
    if platform_ not in ("cpu", "cuda") or (index and not index.isdigit()) or (platform_ == "cpu" and index):
        p.error(f"--device: '{args.device}' is neither cpu nor cuda[:N]")
    if args.sharded and args.no_sharded:
        p.error("--sharded and --no-sharded contradict each other")
    if args.update_results and args.out is not None:
        p.error("--update-results writes benchmarks/results/; --out names another directory: give one of them")
    if args.update_results and not is_full_run(args):
        p.error("--update-results remakes the committed results, which are a full run's: leave out --quick, "
                "--sizes, --dtypes, --budget, --no-compile, --no-jax, --no-plot and --no-sharded "
                "(or give --out DIR for a partial run)")
    if args.out is None:
        args.out = default_out(args)
    args.sharded_skipped = sharded_skipped(args)
    return args


def sharded_skipped(args):
    """Why the sharded case is left out of this run, or None when it runs."""
    if args.no_sharded:
        return "--no-sharded"
    if args.device != "cpu":
        return f"--device {args.device}: the sharded case runs on CPU ranks (run it without --device)"
    if not (args.sharded or is_full_run(args)):
        return "left out of --quick and partial runs (--sharded adds it)"
    return None


def is_full_run(args) -> bool:
    """The run whose results the README shows: every default size, dtype, budget, contender and the plot."""
    return (not args.quick and args.sizes == parse_sizes(DEFAULT_SIZES)
            and args.dtypes == DEFAULT_DTYPES.split(",") and args.budget == DEFAULT_BUDGET
            and not (args.no_compile or args.no_jax or args.no_plot or args.no_sharded))


def default_out(args) -> str:
    """The committed results only when asked (``--update-results``, a full run); every other run writes to the
    git-ignored scratch folder, so trying a command never replaces the README's plot and figures."""
    parts = [args.device.replace(":", "")] if args.device != "cpu" else []
    parts += [f"threads{args.threads}"] if args.threads is not None else []
    kind = "full" if is_full_run(args) else "quick" if args.quick else "partial"
    return H.chosen_out(args, os.path.join(H.RESULTS, *parts), os.path.join(H.SCRATCH, kind, *parts))


def missing_dependencies(args) -> list:
    """What the asked-for run needs but this environment lacks, each with the way out; checked before any work
    (a run must not fail at its end, after minutes of timing, for want of matplotlib)."""
    missing = []
    if not args.no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            missing.append(f"matplotlib is needed for the plot ({exc}): pip install -e '.[bench]', or pass --no-plot")
    if not args.no_jax:
        try:
            import jax  # noqa: F401
        except ImportError as exc:
            missing.append(f"JAX is needed for the JAX contenders ({exc}): pip install -e '.[jax]', or pass --no-jax")
    if not getattr(args, "sharded_skipped", "n/a") and not torch.distributed.is_available():
        missing.append(f"the sharded case needs torch.distributed (gloo), which this torch ({torch.__version__}) "
                       f"lacks: pass --no-sharded")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        missing.append(f"--device {args.device}, but this torch ({torch.__version__}) has no usable CUDA "
                       f"(torch.cuda.is_available() is False)")
    return missing


def load_warnings(cores: int, threads: int, load: float, *, own: float = 0.0) -> list:
    """Why this machine's timings are suspect, one sentence each (empty: no reason found).  ``load``: the 1-minute
    load average; ``own``: how much of it is this run's own threads (0 at the start, ``threads`` at the end).
    torch's intra-op threads wait for each other at every parallel region, so a multi-threaded torch step slows
    by far more than its share when cores are missing (n = 256 on 2 loaded cores: ~100 ms with 2 threads, 0.6 ms
    with one), and ratios across frameworks then mislead."""
    out = []
    if threads > cores:
        out.append(f"torch runs {threads} threads on {cores} cores (oversubscribed): pass --threads {cores} or "
                   f"fewer.")
    others = max(0.0, load - own)
    if others >= 1.0 and others + threads > cores:
        out.append(f"the machine is loaded: 1-minute load average {load:.1f} on {cores} cores "
                   f"({others:.1f} of it not this run's), torch on {threads} threads; times, and ratios between "
                   f"frameworks, are inflated unevenly: re-run on an idle machine, or with --threads 1.")
    return out


def _load_warnings(meta: dict, when: str) -> list:
    """:func:`load_warnings` for the load average recorded at ``when`` ("start" or "end"), each prefixed with it."""
    load = meta.get(f"load_average_{when}")
    if not load:
        return []
    own = meta["torch_threads"] if when == "end" else 0.0
    return [f"at the {when}, {w}" for w in load_warnings(meta["cores"] or 1, meta["torch_threads"], load[0], own=own)]


def machine_info(device: str) -> dict:
    info = {
        "date_utc": H.date_utc(), "cpu": H.cpu_name(), "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "numpy": np.__version__, "device": device,
        "git_commit": H.git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(H.git("status", "--porcelain", "--", *MEASURED)),
        "load_average_start": H.load_average(),
        # settings that change CPU timings: thread counts, and THP_MEM_ALLOC_ENABLE (huge pages for torch's
        # large CPU allocations, which removes most page-fault cost of fresh n×n buffers)
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "THP_MEM_ALLOC_ENABLE",
                                               "XLA_FLAGS") if os.environ.get(k) is not None},
    }
    try:
        import jax
        info["jax"] = jax.__version__
        info["jax_backend"] = jax.default_backend()
    except Exception:
        info["jax"] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def run_case(case: C.Case, contenders, args) -> dict:
    case.make_arrays()
    out = {"n": case.n, "d": case.d, "e": case.e, "dtype": case.dtype, "key": case.key,
           "time": {}, "ratio_to_reference": {}, "samples": {}, "rel_error": {}, "compile_seconds": {},
           "memory": {}, "jax_memory": {}}
    live = [c for c in contenders if c.available]
    phase = {"start": time.perf_counter()}
    for c in live:
        C.prepare_compiled(c, case)
    steps, reference_results = {}, {}
    for mode in C.MODES:
        for c in live:
            try:
                step = c.build(case, mode)
                first, first_s = M.timed_first_call(step, args.device)   # compiles (torch.compile) and checks
            except Exception as exc:  # a broken contender is reported, not allowed to stop the run
                msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                out.setdefault("errors", {}).setdefault(c.name, {})[mode] = msg
                print(f"  ERROR {c.name} mode {mode}: {msg}", flush=True)
                continue
            if c.compile_target is not None:
                out["compile_seconds"].setdefault(c.name, {})[mode] = first_s - M.timed_first_call(step, args.device)[1]
            elif c.framework == "jax":
                out["compile_seconds"].setdefault(c.name, {})[mode] = c.setup_seconds.get(f"{case.key},{mode}")
                extra = dict(c.extra.get(f"{case.key},{mode}", {}))
                out.setdefault("jax_dot_precision", {}).setdefault(c.name, {})[mode] = extra.pop("dot_precision", None)
                if extra:
                    out["jax_memory"].setdefault(c.name, {})[mode] = extra
            if c.framework != "floor":
                if c.name == "reference":
                    reference_results[mode] = first
            steps[(c.name, mode)] = (step, first)
    for (name, mode), (step, first) in steps.items():
        c = next(x for x in live if x.name == name)
        if c.framework != "floor":   # a fast wrong answer is no contender: compare gradients with the reference
            out["rel_error"].setdefault(mode, {})[name] = M.relative_error(first, reference_results[mode])
    steps = {key: s for key, (s, _) in steps.items()}   # drop the first results (n×n tensors) before timing
    del reference_results
    first = None
    phase["built"] = time.perf_counter()
    nn_bytes = case.n * case.n * case.itemsize * max(case.batch, 1)
    fresh_before = M.fresh_buffer_cost(nn_bytes, args.device)
    # Two timing groups: torch (+ GEMM floor) interleaved among themselves, then JAX among themselves.  Interleaving
    # JAX with torch is unfair to torch on a small machine: XLA's worker threads keep spinning after a call and take
    # the cores from the OpenMP/MKL workers of the next torch step (measured at n=64 on 2 cores: +50 % on every torch
    # step, and occasional ~100 ms stalls).  JAX-vs-JAX ratios stay paired; JAX-vs-torch ratios are unpaired.
    framework = {c.name: c.framework for c in live}
    groups = [[k for k in steps if framework[k[0]] != "jax"], [k for k in steps if framework[k[0]] == "jax"]]
    groups = [g for g in groups if g]
    samples, inner, reps = {}, {}, {}
    # the n=4096 float32 case decides most targets: at least 15 paired repetitions there (7 elsewhere, where a
    # 10 s budget gives fewer only for n=4096 and 2048x256x256)
    target = not case.batch and (case.n, case.d, case.e, case.dtype) == R.TARGET_CASE
    min_reps = 3 if args.quick else 15 if target else 7
    for g in groups:
        share = len(g) / len(steps)
        timing = M.time_steps({k: steps[k] for k in g}, budget_s=args.budget * share,
                              min_reps=min_reps, max_reps=10 if args.quick else 40,
                              sample_s=0.002 if args.quick else 0.005, device=args.device,
                              pause_s=0.0 if args.quick else 0.002)
        samples.update(timing["samples"])
        inner.update(timing["inner"])
        reps["jax" if framework[g[0][0]] == "jax" else "torch"] = timing["reps"]
    out["reps"] = reps.get("torch", 0)
    out["reps_by_group"] = reps
    out["inner"] = {f"{n},{m}": i for (n, m), i in inner.items()}
    for (name, mode), xs in samples.items():
        out["samples"].setdefault(mode, {})[name] = xs
        out["time"].setdefault(mode, {})[name] = H.summarize(xs)
    for mode in C.MODES:
        ref = samples[("reference", mode)]
        out["ratio_to_reference"][mode] = {
            name: (H.paired_ratio(samples[(name, mode)], ref) if framework[name] != "jax"
                   else H.unpaired_ratio(samples[(name, mode)], ref))
            for name in out["samples"][mode]}
    phase["timed"] = time.perf_counter()
    # the allocator state the timing ran in, probed before it and as it left it: cold or warm for a fresh (B,)
    # n×n buffer (it can change during the timing)
    out["fresh_buffer"] = M.fresh_buffer_cost(nn_bytes, args.device)
    if fresh_before and out["fresh_buffer"]:
        out["fresh_buffer"]["fresh_s_before"] = fresh_before["fresh_s"]
    if case.n >= 4096 and not case.batch and args.device == "cpu":   # what tanh costs, against the GEMM floor
        out["tanh_kernels"] = K.tanh_kernels(case.n, case.dtype, with_inductor=not (args.quick or args.no_compile))
    for c in live:
        if c.framework != "torch":
            continue
        mem = {}
        try:
            mem["saved"] = M.saved_for_backward(c.fn, case, device=args.device)
        except Exception as exc:  # e.g. a contender that does not support saved-tensor hooks
            mem["saved"] = {"error": f"{type(exc).__name__}: {exc}"}
        for mode in C.MODES:
            try:
                mem[mode] = M.step_memory(c.fn, case, mode, device=args.device)
            except Exception as exc:
                mem[mode] = {"error": f"{type(exc).__name__}: {exc}"}
        out["memory"][c.name] = mem
    phase["memory"] = time.perf_counter()
    out["phase_seconds"] = {"build+compile+check": phase["built"] - phase["start"],
                            "timing": phase["timed"] - phase["built"], "memory": phase["memory"] - phase["timed"]}
    return out


def set_threads(n: int) -> None:
    """Before JAX is imported: XLA reads XLA_FLAGS once, at backend initialisation."""
    torch.set_num_threads(n)
    if n == 1:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.threads is not None:
        set_threads(args.threads)
    missing = missing_dependencies(args)
    if missing:
        print("python -m benchmarks: cannot run as asked:\n" + "\n".join(f"  - {m}" for m in missing),
              file=sys.stderr)
        return 2
    with C.pinned_fp32_precision():
        return _run(args, t_start)


def _run(args, t_start) -> int:
    meta = machine_info(args.device)
    contenders = (C.torch_contenders(skip_compile=args.quick or args.no_compile) + C.floor_contenders()
                  + C.jax_contenders(skip=args.no_jax, device=args.device))
    jax_live = [c for c in contenders if c.framework == "jax" and c.available]
    meta["jax_device"] = C.describe_jax_device(jax_live[0].device) if jax_live else None
    meta["fp32_precision"] = {"torch": C.torch_fp32_precision(), "jax": None}   # read back inside the pin
    results = {
        "meta": meta,
        "config": {"sizes": [list(s) for s in args.sizes], "dtypes": args.dtypes, "modes": list(C.MODES),
                   "budget_s_per_case": args.budget, "quick": args.quick, "threads": args.threads,
                   "command": " ".join(sys.argv)},
        "contenders": C.described(contenders),
        "cases": [],
    }
    print(R.devices_line(meta), flush=True)
    meta["warnings"] = _load_warnings(meta, "start")
    for w in meta["warnings"]:
        print(f"WARNING: {w}", file=sys.stderr, flush=True)
    for c in contenders:
        if not c.available:
            print(f"{c.label}: {c.reason}", flush=True)
    if args.sharded_skipped:
        results["sharded"] = {"skipped": args.sharded_skipped}
    else:   # first, as subprocesses, before this process's threads and heap are busy
        results["sharded"] = S.run(args.out, quick=args.quick, jax=not args.no_jax, repo=H.REPO)
    if S.skipped_line(results):
        print(S.skipped_line(results), flush=True)
    for dtype in args.dtypes:
        for n, d, e in args.sizes:
            case = C.Case(n, d, e, dtype, device=args.device)
            t0 = time.perf_counter()
            res = run_case(case, contenders, args)
            res["wall_seconds"] = time.perf_counter() - t0
            results["cases"].append(res)
            R.print_case(res, results["contenders"])
    if args.batched:
        results["batched"] = B.run(run_case, args, R.print_case)
    if args.device == "cpu":      # inductor's C++ code is what kernels() reads; Triton's is another format
        results["inductor_kernels"] = IC.survey(contenders)
    meta["fp32_precision"]["jax"] = sorted({p for case in results["cases"]
                                            for modes in case.get("jax_dot_precision", {}).values()
                                            for ps in modes.values() for p in (ps or [])}) or None
    meta["load_average_end"] = H.load_average()
    meta["warnings"] += _load_warnings(meta, "end")
    meta["wall_seconds"] = time.perf_counter() - t_start
    results["targets"] = R.evaluate_targets(results) + S.evaluate_targets(results)
    H.print_targets(results["targets"])
    results["targets_compile_batched"] = B.evaluate_targets(results)
    H.print_targets(results["targets_compile_batched"], B.TARGETS_TITLE)
    H.write_json(results, os.path.join(args.out, "results.json"))
    if not args.no_plot:
        R.plot(results, os.path.join(args.out, "results.png"))   # with a panel for the sharded case
    R.write_markdown(results, os.path.join(args.out, "report.md"), plot_name=None if args.no_plot else "results.png")
    with open(os.path.join(args.out, "report.md"), "a") as f:
        f.write(B.markdown(results))
        f.write(S.markdown(results))
    print("\n" + R.devices_line(meta))
    for w in meta["warnings"]:          # again at the end, where a reader of a long run's output looks
        print(f"WARNING: {w}", file=sys.stderr, flush=True)
    print(f"wrote {args.out}/results.json, report.md" + ("" if args.no_plot else ", results.png")
          + f"  ({meta['wall_seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
