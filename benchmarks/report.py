"""Outputs: the stdout table, the performance targets, results.json, results.png and report.md."""

from __future__ import annotations

from typing import Optional

from . import harness as H

TORCH_ORDER = ("attn", "reference", "bare_function", "compiled", "op")
ORDER = TORCH_ORDER + ("jax_attn", "jax_reference", "gemm_floor", "gemm_floor_prealloc", "eager_floor")
TARGET_CASE = (4096, 64, 64, "float32")
LAB_CASE = (2, 3, 4, "float32")
# One (colour, line style, marker) per contender, the same in every panel: colours from a qualitative palette
# (matplotlib's tab10 and a few more), at least 25 CIELAB units apart pairwise (tests/benchmarks/test_plot.py), so
# no two lines share a colour; line styles tell the families apart (torch eager solid, torch.compile dash-dot, JAX
# dashed, floors dotted) and each contender has its own marker.
STYLES = {
    "attn": ("#d62728", "-", "o"), "reference": ("#000000", "-", "s"), "bare_function": ("#8c564b", "-", "D"),
    "op": ("#ff7f0e", "-", "X"),
    "compiled": ("#1f77b4", "-.", "^"), "compiled_attn": ("#17becf", "-.", "v"), "compiled_op": ("#393b79", "-.", "<"),
    "jax_attn": ("#2ca02c", "--", "P"), "jax_reference": ("#bcbd22", "--", "*"),
    "gemm_floor": ("#7f7f7f", ":", "h"), "gemm_floor_prealloc": ("#c7c7c7", ":", "p"),
    "eager_floor": ("#e377c2", ":", "d"),
    "loop": ("#9467bd", "-", ">"),                          # batched.py's Python loop of attn
}
COLORS = {name: style[0] for name, style in STYLES.items()}


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


def _mb(b) -> str:
    return "—" if b is None else f"{b / 2 ** 20:.1f} MiB" if b >= 2 ** 20 else f"{b / 2 ** 10:.1f} KiB"


def _peak(mem: dict):
    """Peak of a fwd+bwd step: the CUDA caching allocator's on CUDA, the profiler's CPU events otherwise."""
    return mem.get("peak_bytes_cuda", mem.get("peak_bytes"))


def memory_source(meta: dict) -> str:
    if str(meta.get("device", "cpu")).startswith("cuda"):
        return (f"CUDA caching allocator on {meta.get('gpu', meta.get('device'))} "
                f"(torch.cuda.max_memory_allocated; n×n counts from torch.profiler's CUDA allocation events)")
    return "CPU allocator events via torch.profiler"


def devices_line(meta: dict) -> str:
    """Which device and backend produced the figures, and at which float32 matmul precision."""
    dev = meta.get("device", "cpu")
    torch_where = (f"{dev} ({meta['gpu']}, CUDA {meta.get('cuda')})" if meta.get("gpu")
                   else f"{dev} ({meta.get('cpu')})")
    prec = meta.get("fp32_precision") or {}
    tp = ", ".join(f"{k} {v}" for k, v in (prec.get("torch") or {}).items()) or "not recorded"
    if not meta.get("jax_device"):
        jp = "—"
    elif prec.get("jax"):
        jp = "/".join(prec["jax"]) + " (read from the lowered steps)"
    else:
        jp = "pinned to highest"   # JAX_FP32_PRECISION "float32" is HIGHEST
    return (f"Devices: torch on {torch_where}; JAX on {meta.get('jax_device') or 'not run'}. "
            f"float32 matmul precision: torch {tp}; JAX dots {jp}")


def _case_label(c) -> str:
    return f"n={c['n']}" + ("" if (c["d"], c["e"]) == (64, 64) else f" d={c['d']} e={c['e']}")


def _order(names):
    return [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]


# --------------------------------------------------------------------------------------------- stdout

def print_case(case: dict, contenders: dict) -> None:
    ph = ", ".join(f"{k} {v:.0f} s" for k, v in case.get("phase_seconds", {}).items())
    print(f"\n{case['key']}   reps={case.get('reps_by_group', case['reps'])}   "
          f"({case.get('wall_seconds', 0):.0f} s: {ph})")
    if case.get("fresh_buffer", {}).get("bytes", 0) >= 2**20:
        print(f"  {describe_fresh_buffer(case['fresh_buffer'])}")
    if case.get("tanh_kernels"):
        print(f"  {describe_tanh_kernels(case)}")
    modes = list(case["time"])
    head = f"  {'contender':<22}" + "".join(f"{'mode ' + m + ': median [IQR]  ×ref':>40}" for m in modes)
    print(head)
    names = _order(list(dict.fromkeys(n for m in modes for n in case["time"][m])))
    for name in names:
        row = f"  {name:<22}"
        for m in modes:
            t, r = case["time"][m].get(name), case["ratio_to_reference"][m].get(name)
            if t is None:
                row += "error (see below)".rjust(40)
                continue
            row += f"{_fmt_s(t['median']):>12} [{_fmt_s(t['q1'])}–{_fmt_s(t['q3'])}] ×{r['median']:.2f}".rjust(40)
        errs = [case["rel_error"].get(m, {}).get(name) for m in modes]
        errs = [x for x in errs if x is not None]
        row += f"   relerr {max(errs):.1e}" if errs else ""
        print(row)
    for name, d in case.get("errors", {}).items():
        for m, msg in d.items():
            print(f"  ERROR {name} mode {m}: {msg}")
    for name, mem in case["memory"].items():
        both = mem.get("both", {})
        saved = mem.get("saved", {})
        print(f"  memory {name:<15} saved {_mb(saved.get('bytes'))} (not aliasing in/outputs "
              f"{_mb(saved.get('bytes_not_aliasing_io'))})   peak fwd+bwd {_mb(_peak(both))}   "
              f"new n×n in bwd {both.get('nxn_allocs_backward')} {both.get('nxn_ops_backward', '')}")
    if case["compile_seconds"]:
        print("  compile/jit seconds (first call minus warm call; inductor caches may be warm): " + ", ".join(
            f"{k}: " + "/".join(f"{v:.2f}" for v in d.values() if v is not None)
            for k, d in case["compile_seconds"].items()))


# --------------------------------------------------------------------------------------------- targets

def c_itemsize(case) -> int:
    return {"float32": 4, "float64": 8}.get(case["dtype"], 4)


def _find(results, n, d, e, dtype):
    for c in results["cases"]:
        if (c["n"], c["d"], c["e"], c["dtype"]) == (n, d, e, dtype):
            return c
    return None


def _paired(case, mode, num, den):
    """``num`` / ``den`` time ratio of a case: paired, or unpaired for samples of different timing groups (torch
    vs JAX: of other lengths); ``None`` unless both were timed."""
    s = case["samples"][mode]
    if num not in s or den not in s:
        return None
    return (H.paired_ratio if len(s[num]) == len(s[den]) else H.unpaired_ratio)(s[num], s[den])


def describe_tanh_kernels(case: dict) -> str:
    """``"elementwise kernels alone, 4096×4096: ATen tanh 29.7 ms, inductor's tanh 15.5 ms, ATen tanh_backward
    4.7 ms"`` (benchmarks/kernels.py)."""
    k, names = case["tanh_kernels"], {"aten_tanh": "ATen tanh", "inductor_tanh": "inductor's tanh",
                                      "aten_tanh_backward": "ATen tanh_backward"}
    return (f"elementwise kernels alone, {case['n']}×{case['n']}: "
            + ", ".join(f"{names[key]} {_fmt_s(k[key])}" for key in names if key in k))


def describe_fresh_buffer(cost: dict) -> str:
    """``"a fresh 64.0 MiB buffer here: 25.1 ms to first fill, 4.0 ms reused (cold: page faults)"``; with the
    probe before the timing too, ``"...: 11.5 ms to first fill before the timing, 1.7 ms after, 1.6 ms reused
    (cold, then warm)"``; ``""`` when nothing was probed."""
    if not cost:
        return ""
    r, size = cost["reused_s"], f"a fresh {cost['bytes'] / 2**20:.1f} MiB buffer here"
    state = lambda f: "cold" if f > 2 * r else "warm"                      # noqa: E731
    if "fresh_s_before" in cost:
        f0, f1 = cost["fresh_s_before"], cost["fresh_s"]
        states = state(f0) if state(f0) == state(f1) else f"{state(f0)}, then {state(f1)}"
        return (f"{size}: {f0 * 1e3:.1f} ms to first fill before the timing, {f1 * 1e3:.1f} ms after, "
                f"{r * 1e3:.1f} ms reused ({states})")
    f = cost["fresh_s"]
    return (f"{size}: {f * 1e3:.1f} ms to first fill, {r * 1e3:.1f} ms reused "
            f"({'cold: page faults' if state(f) == 'cold' else 'warm: no page faults'})")


def fresh_buffer_note(case) -> str:
    """``"; a fresh 64.0 MiB buffer here: ..."`` for a target whose ratio depends on allocations avoided."""
    text = describe_fresh_buffer((case or {}).get("fresh_buffer") or {})
    return f"; {text}" if text else ""


def evaluate_targets(results) -> list:
    out = []

    def ratio_target(name, case, mode, num, den, limit, note=""):
        if case is None:
            out.append({"target": name, "met": None, "value": None, "limit": limit, "detail": "not measured"})
            return
        r = _paired(case, mode, num, den)
        if r is None:
            out.append({"target": name, "met": None, "value": None, "limit": limit,
                        "detail": f"n/a ({num} or {den} not available)"})
            return
        tn, td = case["time"][mode][num], case["time"][mode][den]
        best = tn["min"] / td["min"]
        out.append({"target": name, "met": r["median"] <= limit, "value": r["median"], "limit": limit,
                    "ratio_of_minimums": best,
                    "detail": f"median {r['median']:.3f} (IQR {r['q1']:.3f}–{r['q3']:.3f}) over {case['reps']} "
                              f"paired reps; ratio of best times {best:.3f}; medians {num} {_fmt_s(tn['median'])}, "
                              f"{den} {_fmt_s(td['median'])}" + note})

    big = _find(results, *TARGET_CASE)
    where = "n=4096 d=e=64 float32 fwd+bwd (both grads)"
    ratio_target(f"{where}: attn / reference eager ≤ 0.75", big, "both", "attn", "reference", 0.75,
                 note=fresh_buffer_note(big))
    ratio_target(f"{where}: attn / torch.compile ≤ 1.0", big, "both", "attn", "compiled", 1.0)
    ratio_target(f"{where}: attn / GEMM floor ≤ 1.10", big, "both", "attn", "gemm_floor", 1.10)
    information = (("attn", "gemm_floor_prealloc", "attn / GEMM floor with preallocated outputs"),
                   ("attn", "eager_floor", "attn / eager floor (its GEMMs + ATen's tanh_, tanh_backward)"),
                   ("eager_floor", "gemm_floor", "eager floor / GEMM floor: the least an eager implementation takes"))
    for num, den, what in information:
        r = None if big is None else _paired(big, "both", num, den)
        if r is not None:
            out.append({"target": f"{where}: {what} (information)", "met": None, "value": r["median"],
                        "limit": None, "detail": f"median {r['median']:.3f} (IQR {r['q1']:.3f}–{r['q3']:.3f})"})
    if big is not None and {"aten_tanh", "inductor_tanh"} <= set(big.get("tanh_kernels", {})):
        k = big["tanh_kernels"]
        out.append({"target": "n=4096 float32: ATen's eager tanh / inductor's tanh, one n×n matrix (information)",
                    "met": None, "value": k["aten_tanh"] / k["inductor_tanh"], "limit": None,
                    "detail": describe_tanh_kernels(big)})
    # memory, on the target case
    if big is not None and "attn" in big["memory"] and "reference" in big["memory"]:
        sa, sr = big["memory"]["attn"]["saved"], big["memory"]["reference"]["saved"]
        if "bytes" in sa and "bytes" in sr:
            out.append({"target": "n=4096 float32: bytes saved for backward, attn ≤ autograd's", "limit": sr["bytes"],
                        "met": sa["bytes"] <= sr["bytes"], "value": sa["bytes"],
                        "detail": f"attn {_mb(sa['bytes'])} ({_aliases(sa)}), reference {_mb(sr['bytes'])} "
                                  f"({_aliases(sr)})"})
        counts = {m: big["memory"]["attn"][m].get("nxn_allocs_backward") for m in ("both", "o", "a")}
        ops = {m: big["memory"]["attn"][m].get("nxn_ops_backward") for m in ("both", "o", "a")}
        ref_counts = {m: big["memory"]["reference"][m].get("nxn_allocs_backward") for m in ("both", "o", "a")}
        worst = max(v for v in counts.values() if v is not None)
        out.append({"target": "n=4096 float32: backward allocates at most one new n×n buffer", "limit": 1,
                    "met": worst <= 1, "value": worst,
                    "detail": f"attn per mode {counts} ops {ops}; reference {ref_counts}"})
    else:
        out.append({"target": "memory targets", "met": None, "value": None, "limit": None, "detail": "not measured"})
    ratio_target("n=4096 d=e=64 float32: JAX custom_vjp / JAX autodiff under jit ≤ 1.05", big, "both",
                 "jax_attn", "jax_reference", 1.05)
    lab = _find(results, *LAB_CASE)
    # At this size Function.apply itself dominates, so attn is held to the cheapest Function, not the composite
    ratio_target("lab size n=2 d=3 e=4 float32: attn / bare new-style Function ≤ 1.10", lab, "both", "attn",
                 "bare_function", 1.10)
    if lab is not None and _paired(lab, "both", "bare_function", "reference") is not None:
        for num in ("attn", "bare_function"):
            r = _paired(lab, "both", num, "reference")
            out.append({"target": f"lab size n=2 d=3 e=4 float32: {num} / reference eager (information)",
                        "met": None, "value": r["median"], "limit": None,
                        "detail": f"median {r['median']:.3f} (IQR {r['q1']:.3f}–{r['q3']:.3f})"})
    # the condition for improving formulas: attn the fastest torch contender at n ≥ 1024
    losses = []
    for c in results["cases"]:
        if c["n"] < 1024:
            continue
        for m, times in c["time"].items():
            # paired ratios (medians of different load phases are not comparable on a shared machine); the
            # attn_lab op runs the very same formulas (AttnFunction's backward), so only reference/compiled count
            for other in ("reference", "compiled"):
                r = _paired(c, m, "attn", other) if "attn" in times and other in times else None
                if r is not None and r["median"] > 1.0:
                    losses.append(f"{c['key']} mode {m}: attn/{other} = {r['median']:.3f} "
                                  f"(IQR {r['q1']:.3f}–{r['q3']:.3f})")
    n_cases = sum(1 for c in results["cases"] if c["n"] >= 1024)
    out.append({"target": "torch_impl.attn is faster than reference eager and torch.compile at every n ≥ 1024 "
                          "(all modes and dtypes; median paired ratio ≤ 1)",
                "met": (not losses) if n_cases else None, "value": len(losses), "limit": 0,
                "detail": "; ".join(losses) if losses else ("every case" if n_cases else "not measured")})
    return out


def _aliases(saved) -> str:
    return ", ".join(f"{t['aliases']} {tuple(t['shape'])}" for t in saved["tensors"])


# --------------------------------------------------------------------------------------------- files

def _footer(meta) -> str:
    return (f"{meta['date_utc']} · {meta['cpu']} ({meta['cores']} cores, torch threads {meta['torch_threads']}) · "
            f"Python {meta['python']} · torch {meta['torch']} · jax {meta.get('jax')} · "
            f"torch on {meta.get('gpu') or meta.get('device', 'cpu')}, JAX on {meta.get('jax_device') or '—'} · "
            f"commit {meta['git_commit']}{' (dirty)' if meta.get('git_dirty') else ''} · "
            f"load avg {meta['load_average_start'][0]:.1f}→{(meta.get('load_average_end') or [0])[0]:.1f} "
            "(shared machine)")


def plot(results, path) -> None:
    """results.png: :func:`figure`, saved."""
    import matplotlib.pyplot as plt
    fig = figure(results)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _style(name: str, index: int):
    """(colour, line style, marker) of a contender; one not in STYLES gets one of tab20's light colours."""
    if name in STYLES:
        return STYLES[name]
    spare = ("#aec7e8", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
    return spare[index % len(spare)], "-", "o"


def _overlapping(labels, renderer) -> bool:
    boxes = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def declutter_ticks(fig) -> None:
    """No tick labels printed over each other: where an axis' x labels overlap, rotate them (right-aligned at
    their tick); where they still do, show every k-th label, smallest k first.  Likewise thin the y labels."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        labels = ax.get_xticklabels()
        if _overlapping(labels, renderer):
            for t in labels:
                t.set_rotation(30)
                t.set_horizontalalignment("right")
                t.set_rotation_mode("anchor")
        for axis_labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            shown = [t for t in axis_labels if t.get_text()]
            k = 1
            while _overlapping(shown, renderer) and k < len(shown):
                k += 1
                for i, t in enumerate(shown):
                    t.set_visible(i % k == 0)


def figure(results):
    """The benchmark figure (a matplotlib Figure, Agg backend): ratio panels per dtype, memory, batched and
    sharded panels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, cases = results["meta"], results["cases"]
    dtypes = list(dict.fromkeys(c["dtype"] for c in cases))
    panels = [(dt, "both") for dt in dtypes] + ([(dtypes[0], "o")] if len(dtypes) == 1 else [])
    batched = (results.get("batched") or {}).get("cases") or []
    sharded = results.get("sharded") or {}
    sharded = sharded if any("layouts" in (sharded.get(fw) or {}) for fw in ("torch", "jax")) else None
    # the batched panel goes top right, the sharded one bottom right (an extra column for either)
    ncols = max(2, len(panels)) + (1 if batched or sharded else 0)
    fig, axes = plt.subplots(2, ncols, figsize=(15 + 5 * (ncols - 2), 10), squeeze=False)
    labels = {k: v["label"] for k, v in results["contenders"].items()}
    mode_text = {"both": "both output gradients", "o": "grad of o only", "a": "grad of a only"}
    for col, (dt, mode) in enumerate(panels):
        ax = axes[0][col]
        cs = [c for c in cases if c["dtype"] == dt]
        xs = list(range(len(cs)))
        names = _order(list(dict.fromkeys(n for c in cs for n in c["ratio_to_reference"][mode])))
        for index, name in enumerate(names):
            if name == "reference":
                continue
            r = [c["ratio_to_reference"][mode].get(name) for c in cs]
            pts = [(x, v) for x, v in zip(xs, r) if v is not None]
            if not pts:
                continue
            px = [p[0] for p in pts]
            med = [p[1]["median"] for p in pts]
            lo = [p[1]["median"] - p[1]["q1"] for p in pts]
            hi = [p[1]["q3"] - p[1]["median"] for p in pts]
            color, ls, marker = _style(name, index)
            ax.errorbar(px, med, yerr=[lo, hi], label=labels.get(name, name), color=color,
                        linestyle=ls, marker=marker, ms=7 if name == "attn" else 5, capsize=3,
                        lw=2 if name == "attn" else 1.3)
        ax.axhline(1.0, color="black", lw=1, label="attn_reference eager (= 1)")
        ax.set_yscale("log")
        vals = [p["median"] for c in cs for p in c["ratio_to_reference"][mode].values()] or [1.0]
        lo_v, hi_v = min(vals + [1.0]) / 1.3, max(vals + [1.0]) * 1.3
        ticks = [t for t in (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50) if lo_v <= t <= hi_v]
        ax.set_ylim(lo_v, hi_v)
        ax.set_yticks(ticks)
        ax.set_yticklabels([f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(xs)
        ax.set_xticklabels([_case_label(c).replace(" d=", "\nd=") for c in cs])
        ax.set_ylabel("time of fwd+bwd / reference eager (same run)")
        ax.set_title(f"{dt}: forward+backward, {mode_text[mode]} (median, IQR bars; lower is faster)",
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if col == 0:
            handles, texts = ax.get_legend_handles_labels()
            fig.legend(handles, texts, loc="upper center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, 0.965),
                       frameon=False)
    # memory: peak of a fwd+bwd step vs size (float32 or the first dtype), and saved/peak bars at the big case
    dt = "float32" if "float32" in dtypes else dtypes[0] if dtypes else None   # none: a batched-only run
    cs = [c for c in cases if c["dtype"] == dt]
    ax = axes[1][0]
    xs = list(range(len(cs)))
    for i, name in enumerate(TORCH_ORDER):
        ys = [(x, _peak(c["memory"].get(name, {}).get("both", {})), c) for x, c in zip(xs, cs)]
        ys = [(x, y / (c["n"] ** 2 * c_itemsize(c)), c) for x, y, c in ys if y]
        color, ls, marker = _style(name, i)
        if ys:   # small x offsets so equal values stay visible
            ax.plot([p[0] + 0.03 * (i - 1.5) for p in ys], [p[1] for p in ys], marker=marker,
                    ms=9 if name == "attn" else 6, color=color, linestyle=ls, label=labels.get(name, name),
                    lw=2 if name == "attn" else 1.3, alpha=0.85)
    ax.set_ylim(bottom=0)
    ax.set_xticks(xs)
    ax.set_xticklabels([_case_label(c).replace(" d=", "\nd=") for c in cs])
    ax.set_ylabel("peak bytes / bytes of one n×n buffer")
    ax.set_title(f"{dt}: peak memory of one fwd+bwd step above the inputs, in n×n buffers\n"
                 f"({memory_source(meta)}; includes outputs o, a and the gradients)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1][1]
    big = _find(results, *TARGET_CASE) or (max(cs, key=lambda c: c["n"]) if cs else None)
    if big is not None:
        names = [n for n in TORCH_ORDER if n in big["memory"]]
        import numpy as np
        x = np.arange(len(names))
        saved = [big["memory"][n].get("saved", {}).get("bytes", 0) / 2 ** 20 for n in names]
        peak = [(_peak(big["memory"][n].get("both", {})) or 0) / 2 ** 20 for n in names]
        ax.bar(x - 0.2, saved, 0.4, label="saved for backward", color="tab:purple")
        ax.bar(x + 0.2, peak, 0.4, label="peak fwd+bwd", color="tab:cyan")
        for i, n in enumerate(names):
            cnt = big["memory"][n].get("both", {}).get("nxn_allocs_backward")
            ax.text(x[i] + 0.2, peak[i], f"{peak[i]:.3g} MiB\n{cnt} new n×n\nbuffers in bwd", ha="center",
                    va="bottom", fontsize=8)
            ax.text(x[i] - 0.2, saved[i], f"{saved[i]:.3g}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x)
        ax.set_xticklabels([_short_label(labels.get(n, n)) for n in names], fontsize=8)
        ax.set_ylabel("MiB")
        ax.set_ylim(0, max(peak + saved) * 1.35 if names else 1)
        ax.set_title(f"memory at {big['key']} "
                     f"(n×n buffer = {_mb(big['n'] ** 2 * (4 if big['dtype'] == 'float32' else 8))})",
                     fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    if not cases:          # a batched-only run: hide the (empty) 2-D panels
        for ax in list(axes[0][:ncols - 1]) + list(axes[1]):
            ax.set_visible(False)
    if batched:
        _plot_batched(axes[0][ncols - 1], results["batched"])
    elif sharded and ncols > len(panels):
        axes[0][ncols - 1].axis("off")
    for extra in axes[1][2:]:
        extra.axis("off")
    if sharded:
        from .sharded import plot_panel
        axes[1][ncols - 1].set_visible(True)
        axes[1][ncols - 1].axis("on")
        plot_panel(axes[1][ncols - 1], sharded)
    fig.suptitle("Tanh attention (o, a) = (tanh(q kᵀ) v, tanh(q kᵀ)): hand-written gradients vs autograd, "
                 "torch.compile, JAX", fontsize=12, y=0.995)
    fig.text(0.5, 0.005, _footer(meta), ha="center", fontsize=8, color="dimgray")
    warnings = meta.get("warnings") or []
    if warnings:          # a loaded or oversubscribed machine: the times, and ratios across frameworks, are suspect
        fig.text(0.5, 0.022, "\n".join("WARNING: " + w for w in warnings), ha="center", va="bottom", fontsize=8,
                 color="tab:red")
    rect = (0, 0.02 + 0.018 * len(warnings), 1, 0.92)
    fig.tight_layout(rect=rect)
    declutter_ticks(fig)
    fig.tight_layout(rect=rect)          # room for labels the decluttering rotated
    return fig


def _short_label(label: str, width: int = 18) -> str:
    """A contender's label short enough for a bar's tick, on lines of at most ``width`` characters where spaces
    and dots allow: "a bare new-style autograd.Function, the same products" -> "a bare new-style\nautograd.Function",
    "torch.ops.attn_lab.attn" -> "torch.ops.\nattn_lab.attn"."""
    short = label.replace(" (autograd)", "").replace("(attn_reference)", "(ref)").split(", ")[0]
    lines = [""]
    for word in short.split(" "):
        while len(word) > width and "." in word[:width]:        # a long dotted name: break after a dot
            cut = word[:width].rindex(".") + 1
            lines += [word[:cut], ""]
            word = word[cut:]
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width:
            lines.append("")
        lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return "\n".join(line for line in lines if line)


def _plot_batched(ax, batched) -> None:
    """The batched cases (benchmarks/batched.py): one group of bars per case, one bar per contender, the
    median paired ratio to the 3-D reference eager with IQR whiskers."""
    import numpy as np

    cases, labels = batched["cases"], batched["contenders"]
    names = [n for n in labels if n != "reference" and any(n in c["ratio_to_reference"]["both"] for c in cases)]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        x = np.arange(len(cases)) + (i - (len(names) - 1) / 2) * width
        r = [c["ratio_to_reference"]["both"].get(name) for c in cases]
        med = [p["median"] if p else np.nan for p in r]
        err = [[p["median"] - p["q1"] if p else 0 for p in r], [p["q3"] - p["median"] if p else 0 for p in r]]
        ax.bar(x, med, width, yerr=err, capsize=2, label=labels[name]["label"], color=_style(name, i)[0],
               alpha=0.85, edgecolor="black" if name == "attn" else None)
    ax.axhline(1.0, color="black", lw=1)
    tops = [p["q3"] for c in cases for n, p in c["ratio_to_reference"]["both"].items() if n in names] or [1.0]
    ax.set_ylim(0, max(tops + [1.0]) * 1.45)          # headroom for the legend above the bars
    ax.set_xticks(np.arange(len(cases)))
    ax.set_xticklabels([f"{c['batch']} × n={c['n']}\nd=e={c['d']}, {c['dtype']}" for c in cases])
    ax.set_ylabel("time of fwd+bwd / 3-D reference eager (same run)")
    ax.set_title("batched: forward+backward, both output gradients\n(median, IQR whiskers; lower is faster)",
                 fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def write_markdown(results, path, plot_name: Optional[str]) -> None:
    meta, cases = results["meta"], results["cases"]
    L = ["# Benchmark report: tanh attention forward+backward", "",
         f"Made {meta['date_utc']} on {meta['cpu']} ({meta['cores']} cores, torch threads {meta['torch_threads']}), "
         f"{meta['platform']}, Python {meta['python']}, torch {meta['torch']}, jax {meta.get('jax')}, numpy "
         f"{meta['numpy']}, commit {meta['git_commit']}"
         f"{' (with uncommitted changes)' if meta.get('git_dirty') else ''}. "
         f"Load average {meta['load_average_start'][0]:.1f} at start, {(meta.get('load_average_end') or [0])[0]:.1f} "
         f"at end: the machine is shared, so absolute times are noise; ratios are paired within a repetition. "
         f"Command: `{results['config']['command']}` ({meta.get('wall_seconds', 0):.0f} s)"
         + (f"; environment {meta['env']}" if meta.get("env") else "") + ".", "", devices_line(meta) + ".", ""]
    for w in meta.get("warnings") or []:
        L += [f"**Warning**: {w}", ""]
    if plot_name:
        L += [f"![benchmark plot]({plot_name})", ""]
    L += ["## Targets", ""] + H.targets_table(results["targets"])
    L += ["", "## Contenders", ""]
    for name, c in results["contenders"].items():
        L.append(f"* `{name}`: {c['label']}" + ("" if c["available"] else f": {c['reason']}"))
    from .sharded import skipped_line
    if skipped_line(results):
        L.append(f"* {skipped_line(results)}")
    for mode in results["config"]["modes"]:
        L += ["", f"## Time ratio to `attn_reference` eager, mode `{mode}` (median of paired ratios; "
                  f"reference median time in the last column)", ""]
        names = _order(list(dict.fromkeys(n for c in cases for n in c["ratio_to_reference"][mode])))
        L.append("| case | reps | " + " | ".join(names) + " | reference time |")
        L.append("|---|---|" + "---|" * len(names) + "---|")
        for c in cases:
            row = [f"{c['key']}", str(c["reps"])]
            for n in names:
                r = c["ratio_to_reference"][mode].get(n)
                row.append("—" if r is None else f"{r['median']:.2f} ({r['q1']:.2f}–{r['q3']:.2f})")
            row.append(_fmt_s(c["time"][mode]["reference"]["median"]) if "reference" in c["time"][mode] else "—")
            L.append("| " + " | ".join(row) + " |")
    L += ["", f"## Memory (torch contenders, mode `both`; {memory_source(meta)})", "",
          "| case | contender | saved for backward | of which not aliasing inputs/outputs | peak fwd+bwd | "
          "new n×n buffers in forward / backward | ops allocating them in backward |", "|---|---|---|---|---|---|---|"]
    for c in cases:
        for name, mem in c["memory"].items():
            s, b = mem.get("saved", {}), mem.get("both", {})
            L.append(f"| {c['key']} | {name} | {_mb(s.get('bytes'))} | {_mb(s.get('bytes_not_aliasing_io'))} | "
                     f"{_mb(_peak(b))} | {b.get('nxn_allocs_forward')} / {b.get('nxn_allocs_backward')} | "
                     f"{', '.join(b.get('nxn_ops_backward') or []) or '—'} |")
    errs = [(c["key"], n, m, msg) for c in cases for n, d in c.get("errors", {}).items() for m, msg in d.items()]
    if errs:
        L += ["", "## Contenders that failed (left out of that case/mode)", ""]
        L += [f"* {k}, `{n}`, mode `{m}`: {msg}" for k, n, m, msg in errs]
    L += ["", "## Compile / jit time (excluded from the timings), seconds per mode (both/o/a)", "",
          "Measured as the first fwd+bwd call minus a warm one, after `torch.compiler.reset()`.  Inductor's "
          "FX-graph and kernel caches (in process and on disk) survive that reset, so only a first case on a "
          "cold cache shows a full compile (3-15 s here); later figures are cache hits.", ""]
    for c in cases:
        if c["compile_seconds"]:
            L.append(f"* {c['key']}: " + "; ".join(
                f"{k} " + "/".join(f"{v:.2f}" for v in d.values() if v is not None)
                for k, d in c["compile_seconds"].items()))
    L += ["", "## Gradient agreement", "",
          "Every contender's gradients are compared with the eager reference before timing (max relative "
          "Frobenius error over dq, dk, dv, all modes):", ""]
    for c in cases:
        worst = {}
        for m, d in c["rel_error"].items():
            for n, v in d.items():
                worst[n] = max(worst.get(n, 0.0), v)
        L.append(f"* {c['key']}: " + ", ".join(f"{n} {v:.1e}" for n, v in worst.items()))
    L += ["", "## Method", "",
          "See `benchmarks/measure.py`: interleaved repetitions (each in a fresh seeded random order), warm-up "
          "first, `inner` calls per sample so a sample lasts ≥ ~5 ms, ratios paired per repetition. Torch contenders "
          "and the GEMM floor are interleaved in one group and the JAX contenders in a second group timed right after "
          "(XLA's spinning worker threads slow the torch step that follows a JAX step on a 2-core machine), so "
          "JAX-to-torch ratios are unpaired (quartiles of JAX over the reference median); memory from the "
          f"{memory_source(meta)} (`profile_memory=True`); saved bytes from "
          "`saved_tensors_hooks`, unique storages. JAX steps return the forward outputs with the VJP so XLA cannot "
          "drop forward work. The GEMM floor is the same matrix products (2 forward, 4 backward; 2+2 in mode `a`) "
          "without autograd or elementwise work, with fresh outputs (as the op must allocate them) and with "
          "preallocated outputs (pure compute). The eager floor adds ATen's `tanh_` and `tanh_backward` in place, "
          "with one fresh n×n buffer (`a`) and every other output preallocated: the least an eager torch "
          "implementation can take."]
    H.write_text(path, "\n".join(L) + "\n")
