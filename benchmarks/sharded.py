"""The sharded case of ``python -m benchmarks``: tanh attention over 4 CPU ranks, each layout against
``attn_reference`` on the same shards.

Runs the two standalone benchmarks as subprocesses (each with a timeout; they must be their own processes: the
torch one spawns gloo ranks, the JAX one sets ``XLA_FLAGS`` before importing JAX):

* ``python -m benchmarks.distributed --world 4`` (torch DTensor on gloo ranks: replicate, rows, keys,
  all_shard0 = DTensor's all-gather, ring), writing ``distributed.json`` and ``distributed.md``;
* ``python -m benchmarks.distributed_jax --devices 4`` (JAX host devices: jit rows, shard_map rows, jit
  all-gather, ring, jit rows explicit), writing ``distributed_jax.json``;

into the run's results directory, then folds both into ``results.json`` (``"sharded"``), report.md (a section
with both tables), the plot (a panel of ratios per layout) and the targets (``evaluate_targets``).  A full default
run includes it; ``--no-sharded`` leaves it out, ``--quick`` and partial runs leave it out unless ``--sharded``
asks for it (then, with ``--quick``, at n=256 with 3 repetitions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from . import harness as H

WORLD = 4
TIMEOUT_S = {"torch": 1500, "jax": 900}           # a full run takes ~3 min (torch) and ~1 min (JAX) here
QUICK = {"n": 256, "reps": 3}
TORCH_RATIO_LAYOUTS = ("replicate", "rows", "keys", "all_shard0", "ring")
JAX_RATIO_LAYOUTS = ("jit rows", "jit rows explicit", "shard_map rows", "jit all-gather", "ring")
JAX_ROWS = ("jit rows", "jit rows explicit", "shard_map rows")
# what each layout's sharding rule states (torch_impl/sharded/rules.py's table): the op itself runs no collective
RULE_COLLECTIVES = {"rows": ({}, {}), "keys": ({}, {})}


def commands(out_dir: str, quick: bool, jax: bool) -> dict:
    """The subprocesses' argument lists, by framework."""
    size = ["--n", str(QUICK["n"]), "--reps", str(QUICK["reps"])] if quick else []
    cmds = {"torch": [sys.executable, "-m", "benchmarks.distributed", "--world", str(WORLD), "--out", out_dir] + size}
    if jax:
        cmds["jax"] = [sys.executable, "-m", "benchmarks.distributed_jax", "--devices", str(WORLD),
                       "--out", os.path.join(out_dir, "distributed_jax.json")] + size
    return cmds


def run_one(cmd, timeout_s: float, cwd: str) -> dict:
    """Run ``cmd`` in its own session (so a timeout also ends the ranks it spawned), its output passed through."""
    env = dict(os.environ)
    env["PYTHONPATH"] = cwd + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("XLA_FLAGS", None)                    # the JAX benchmark sets its own device count
    t0 = time.perf_counter()
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"error": f"no result within {timeout_s:.0f} s (timeout)", "seconds": time.perf_counter() - t0}
    if code != 0:
        return {"error": f"exit status {code} (its output is above)", "seconds": time.perf_counter() - t0}
    return {"seconds": time.perf_counter() - t0}


def run(out_dir: str, quick: bool, jax: bool, repo: str) -> dict:
    """Both sharded benchmarks; their results as ``results.json``'s ``"sharded"`` section.  A failure or timeout
    of one is recorded (``{"error": ...}``) and reported, not allowed to stop the run."""
    os.makedirs(out_dir, exist_ok=True)
    rel = os.path.relpath(out_dir, repo)           # the subprocesses run in the repository: the files and the
    cmds = commands(out_dir if rel.startswith("..") else rel, quick, jax)       # reports name it as it does
    files = {"torch": os.path.join(out_dir, "distributed.json"), "jax": os.path.join(out_dir, "distributed_jax.json")}
    out = {"world": WORLD, "commands": {k: " ".join(c[1:]) for k, c in cmds.items()}, "seconds": {}}
    if not jax:
        out["jax"] = {"skipped": "--no-jax"}
    for fw, cmd in cmds.items():
        print(f"\nsharded ({fw}, {WORLD} CPU ranks): {' '.join(cmd[1:])}", flush=True)
        if os.path.exists(files[fw]):
            os.remove(files[fw])                  # never fold in an older run's file
        status = run_one(cmd, TIMEOUT_S[fw] / (4 if quick else 1), repo)
        out["seconds"][fw] = status["seconds"]
        if "error" in status:
            out[fw] = {"error": status["error"]}
            print(f"  ERROR sharded {fw}: {status['error']}", flush=True)
            continue
        with open(files[fw]) as f:
            out[fw] = json.load(f)
    return out


# --------------------------------------------------------------------------------------------- targets

def _ratios(where, ratios: dict, reps_note: str) -> dict:
    """One target for every layout's fwd+bwd ratio to ``attn_reference`` (``{layout: (median, q1, q3)}``): met
    when each median is ≤ 1.0; the value names each layout's median, the misses in bold (one README row)."""
    def shown(name, r):
        return f"**{name} {r[0]:.3f}**" if r[0] > 1.0 else f"{name} {r[0]:.3f}"
    return {"target": f"{where}: fwd+bwd / attn_reference ≤ 1.0 for each layout", "limit": 1.0,
            "met": all(r[0] <= 1.0 for r in ratios.values()),
            "value": ", ".join(shown(name, r) for name, r in ratios.items()),
            "detail": "; ".join(f"{name} {r[0]:.3f} (IQR {r[1]:.3f}–{r[2]:.3f})" for name, r in ratios.items())
                      + reps_note}


def _not_measured(name, why):
    return {"target": name, "met": None, "value": None, "limit": None, "detail": f"not measured ({why})"}


def torch_targets(t: dict) -> list:
    from .distributed import ring_memory_bound

    P, n, d = t["world"], t["n"], t["d"]
    where = f"sharded torch, {P} gloo CPU ranks, n={n} d=e={d} float32"
    times = {name: t["layouts"][name]["time"] for name in TORCH_RATIO_LAYOUTS}
    out = [_ratios(where, {name: (tm["ratio_median"], tm["ratio_q1"], tm["ratio_q3"]) for name, tm in times.items()},
                   f"; medians over {t['reps']} paired reps (slowest rank)")]
    for name, what in (("rows", "0 collectives forward and backward"),
                       ("keys", "exactly its rule's collectives (none in the op: o Partial, a Shard(1))")):
        hand = t["layouts"][name]["hand"]
        fwd, bwd = RULE_COLLECTIVES[name]
        total = sum(hand["forward"].values()) + sum(hand["backward"].values())
        out.append({"target": f"{where}, {name}: {what}", "limit": 0, "value": total,
                    "met": hand["forward"] == fwd and hand["backward"] == bwd,
                    "detail": f"forward {H.counts(hand['forward'])}, backward {H.counts(hand['backward'])}"})
    ring = t["layouts"]["ring"]["hand"]
    hops = ring.get("hops") or {}
    gathers = sum(c for phase in ("forward", "backward") for k, c in ring[phase].items() if "all_gather" in k)
    out.append(_ring_hops(where, P, hops.get("forward"), hops.get("backward"), gathers,
                          f"collectives forward {H.counts(ring['forward'])}, backward {H.counts(ring['backward'])}"))
    peak = t["layouts"]["ring"]["peak_bytes_rank"]
    bound = ring_memory_bound(t)
    out.append({"target": f"{where}, ring: forward peak bytes per rank ≤ a block + 3 k/v blocks + O(m(d+e))",
                "met": peak["forward"] <= bound, "value": peak["forward"], "limit": bound,
                "detail": f"{peak['forward'] / 2**20:.2f} MiB ≤ {bound / 2**20:.2f} MiB (fwd+bwd peak "
                          f"{peak['fwd_bwd'] / 2**20:.2f} MiB, information)"})
    return out


def _ring_hops(where, P, fwd, bwd, gathers, detail):
    met = None if fwd is None or bwd is None else fwd == P - 1 and bwd <= 2 * P - 1 and gathers == 0
    return {"target": f"{where}, ring: P−1 hops forward, ≤ 2P−1 backward, no all-gather of k or v",
            "met": met, "value": f"{fwd} / {bwd}", "limit": f"{P - 1} / ≤ {2 * P - 1}",
            "detail": f"hops {fwd} forward, {bwd} backward (P={P}), {gathers} all-gathers; {detail}"}


def jax_targets(j: dict) -> list:
    from .distributed_jax import BUDGET, RATIO

    P = j["devices"]
    where = f"sharded JAX, {P} host CPU devices, n={j['n']} d=e={j['d']} float32"
    L = j["layouts"]
    # "jit rows explicit" needs JAX >= 0.5; --counts-only runs time nothing
    ratios = {name: L[name][RATIO] for name in JAX_RATIO_LAYOUTS if L.get(name, {}).get(RATIO)}
    out = [_ratios(where, ratios, f"; medians over {j.get('reps', '?')} paired reps") if ratios
           else _not_measured(f"{where}: fwd+bwd / attn_reference ≤ 1.0 for each layout", "not timed")]
    rows = {name: L[name] for name in JAX_ROWS if name in L}
    out.append({"target": f"{where}, rows: collectives (information: 1 all-reduce in backward by design, the sums "
                          "over q rows of G_K, G_V)", "met": None, "value": None, "limit": None,
                "detail": "; ".join(f"{name}: forward {H.counts(e['forward'])}, backward {H.counts(e['backward'])}"
                                    for name, e in rows.items())})
    ring = L["ring"]
    gathers = ring["forward"].get("all-gather", 0) + ring["backward"].get("all-gather", 0)
    out.append(_ring_hops(where, P, ring["forward"].get("collective-permute", 0),
                          ring["backward"].get("collective-permute", 0), gathers,
                          f"HLO collectives forward {H.counts(ring['forward'])}, "
                          f"backward {H.counts(ring['backward'])}"))
    peak, bound = ring["peak bytes per device, forward"], j[BUDGET]["sum"]
    out.append({"target": f"{where}, ring: forward peak bytes per device ≤ a block + 3 k/v blocks + O(m(d+e))",
                "met": None if peak is None else peak <= bound, "value": peak, "limit": bound,
                "detail": ("XLA reports no peak" if peak is None else f"{peak / 2**20:.2f} MiB ≤ {bound / 2**20:.2f} "
                           f"MiB (XLA's memory analysis; fwd+bwd step "
                           f"{_mib(ring['peak bytes per device, fwd+bwd'])})")})
    return out


def _mib(b) -> str:
    return "—" if b is None else f"{b / 2**20:.2f} MiB"


def evaluate_targets(results) -> list:
    """The sharded targets in ``report.evaluate_targets``' format; none when the run left the sharded case out, one
    "not measured" line per framework whose subprocess failed."""
    s = results.get("sharded")
    if not s or "skipped" in s:
        return []
    out = []
    for fw, targets in (("torch", torch_targets), ("jax", jax_targets)):
        part = s.get(fw) or {}
        if "skipped" in part:
            continue
        if "error" in part:
            out.append(_not_measured(f"sharded {fw}, {s['world']} CPU ranks", part["error"]))
            continue
        out += targets(part)
    return out


# --------------------------------------------------------------------------------------------- report, plot

def skipped_line(results) -> str:
    """``"sharded (4 CPU ranks): <why>"`` when the run left the case (or a framework of it) out, else ``""``."""
    s = results.get("sharded") or {}
    why = s.get("skipped") or (s.get("jax") or {}).get("skipped")
    if not why:
        return ""
    return f"sharded ({WORLD} CPU ranks){'' if 'skipped' in s else ', JAX'}: {why}"


def markdown(results) -> str:
    """report.md's section: the torch table (``distributed.table``) and the JAX table (``distributed_jax.table``)."""
    from . import distributed, distributed_jax

    s = results.get("sharded")
    lines = ["", "## Sharded: 4 CPU ranks, each layout against `attn_reference` on the same shards", ""]
    if not s or "skipped" in s:
        return "\n".join(lines + [f"Left out of this run: {(s or {}).get('skipped', 'not asked for')}."]) + "\n"
    lines += ["Run as subprocesses: " + "; ".join(f"`python {c}` ({s['seconds'].get(fw, 0):.0f} s)"
                                                  for fw, c in s["commands"].items()) + ".", ""]
    for fw, title, table in (("torch", "torch DTensor, gloo ranks", distributed.table),
                             ("jax", "JAX, host-platform devices", distributed_jax.table)):
        part = s.get(fw) or {}
        lines += [f"### {title}", ""]
        if "skipped" in part or "error" in part:
            lines += [f"Not measured: {part.get('skipped') or part.get('error')}.", ""]
            continue
        text = table(part)
        lines += [text.split("\n", 2)[2] if text.startswith("# ") else text]   # drop the standalone page's title
    return "\n".join(lines) + "\n"


def plot_panel(ax, sharded) -> None:
    """Median ratio to ``attn_reference`` per layout with IQR whiskers: torch layouts, then JAX layouts."""
    from .distributed_jax import RATIO

    bars = []                                     # (label, median, q1, q3, color)
    t, j = sharded.get("torch") or {}, sharded.get("jax") or {}
    for name in TORCH_RATIO_LAYOUTS if "layouts" in t else ():
        tm = t["layouts"][name]["time"]
        bars.append((f"torch\n{name}", tm["ratio_median"], tm["ratio_q1"], tm["ratio_q3"], "tab:red"))
    for name in JAX_RATIO_LAYOUTS if "layouts" in j else ():
        r = j["layouts"].get(name, {}).get(RATIO)
        if r:
            bars.append((f"JAX\n{name.replace(' ', chr(10))}", r[0], r[1], r[2], "tab:green"))
    if not bars:
        ax.axis("off")
        return
    xs = list(range(len(bars)))
    med = [b[1] for b in bars]
    ax.bar(xs, med, 0.7, yerr=[[b[1] - b[2] for b in bars], [b[3] - b[1] for b in bars]], capsize=3,
           color=[b[4] for b in bars], alpha=0.85)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xticks(xs)
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)
    ax.set_ylim(0, max([b[3] for b in bars] + [1.0]) * 1.15)
    ax.set_ylabel("fwd+bwd / attn_reference on the same shards")
    sizes = ", ".join(f"{fw} n={p['n']}" for fw, p in (("torch", t), ("JAX", j)) if "n" in p)
    d = t.get("d", j.get("d"))
    ax.set_title(f"sharded on {sharded.get('world', WORLD)} CPU ranks ({sizes}, d=e={d}, float32)\n"
                 "(median, IQR whiskers; lower is faster)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
