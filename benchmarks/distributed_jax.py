"""JAX sharded tanh attention on host-platform CPU devices: collectives per layout and fwd+bwd time ratios.

    python -m benchmarks.distributed_jax [--devices 4] [--n 1024] [--d 64] [--reps 40] [--counts-only]
                                         [--out FILE | --update-results]

writes benchmarks/scratch/distributed_jax.json (git-ignored) unless ``--out FILE`` names another file or
``--update-results`` asks for the committed benchmarks/results/distributed_jax.json.

Runs alone (it sets ``XLA_FLAGS=--xla_force_host_platform_device_count=P`` before importing JAX, so it must be its
own process).  For each layout, on a mesh of P devices along axis "x":

* ``jit rows``: ``jax.jit`` of ``jax_impl.attn`` with q ``NamedSharding(P("x"))``, k, v replicated (Auto axes);
* ``jit rows explicit``: the same on ``AxisType.Explicit`` axes (JAX >= 0.5);
* ``shard_map rows``: ``jax_impl.sharded.layouts.attn_rows``;
* ``jit all-gather``: ``jax.jit`` of ``jax_impl.attn`` with q, k, v all over rows (XLA gathers k and v);
* ``ring``: ``jax_impl.sharded.layouts.ring_attn``, q, k, v sharded over rows;

it counts the collectives in the compiled HLO of the forward and of the backward alone (the pullback jitted by
itself), reads XLA's peak memory per device (forward; fwd+bwd step), and times one fwd+bwd step (``jax.grad`` of
``sum(o) + sum(a)`` w.r.t. q, k, v) against ``jax_impl.attn_reference`` under the same ``jit``, mesh and input
shardings (for the ring: q, k, v all over rows, GSPMD's all-gather layout), interleaved, as the median of paired
ratios.  On a shared 2-core CPU the P "devices" are threads of one process: read the ratios, not the times.  Writes
a small JSON.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time

if __package__ in (None, ""):           # python benchmarks/distributed_jax.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402

COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")
RATIO = "fwd+bwd ratio to attn_reference (median, q1, q3)"
ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "f64": 8,
            "c64": 8, "c128": 16}
BUDGET = "ring budget, bytes per device (target: ring's forward peak <= the sum)"
RESULTS = os.path.join(H.RESULTS, "distributed_jax.json")     # only with --update-results
SCRATCH = os.path.join(H.SCRATCH, "distributed_jax.json")     # the default


def parse(argv=None):
    p = H.parser("python -m benchmarks.distributed_jax", __doc__)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--d", type=int, default=64, help="d = e")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--counts-only", action="store_true", help="collective counts only, no timing")
    H.out_or_update(p, out_help="output file (default: benchmarks/scratch/distributed_jax.json)",
                    update_help="write the committed benchmarks/results/distributed_jax.json instead")
    args = p.parse_args(argv)
    args.out = H.chosen_out(args, RESULTS, SCRATCH)
    return args


def collective_bytes(hlo: str, devices: int):
    """Bytes one device receives from the collectives of a compiled HLO text: an all-gather's output less the
    device's own 1/P, any other collective's output (an array or a tuple of arrays).  None when a collective's
    result cannot be read (e.g. an async ``-start`` op's state tuple), so a figure is never a silent undercount."""
    total = 0
    for line in hlo.splitlines():
        if not re.search(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", line):
            continue
        m = re.search(r"=\s+(\(.*?\)|\w+\[[\d,]*\]\S*)\s+(" + "|".join(COLLECTIVES) + r")\(", line)
        if m is None:
            return None
        size = 0
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
            if dtype not in ITEMSIZE:
                return None
            n = ITEMSIZE[dtype]
            for dim in filter(None, dims.split(",")):
                n *= int(dim)
            size += n
        total += size * (devices - 1) // devices if m.group(2) == "all-gather" else size
    return total


def main(argv=None) -> int:
    args = parse(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_impl
    from jax_impl.sharded import layouts as sharded

    if len(jax.devices()) < args.devices:
        raise SystemExit(f"JAX was imported before XLA_FLAGS could ask for {args.devices} devices: run this alone")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:args.devices]), ("x",))
    meshes = {"auto": mesh}
    if hasattr(jax.sharding, "AxisType"):
        meshes["explicit"] = jax.make_mesh((args.devices,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    rng = np.random.default_rng(0)
    n, d = args.n, args.d
    host = [rng.standard_normal(s).astype(np.float32) for s in ((n, d), (n, d), (n, d))]

    def place(m, specs):
        return [jax.device_put(x, NamedSharding(m, s)) for x, s in zip(host, specs)]

    rows, everything = (P("x"), P(), P()), (P("x"),) * 3
    layouts = {
        "jit rows": (jax_impl.attn, "auto", rows),
        "shard_map rows": (lambda q, k, v: sharded.attn_rows(q, k, v, mesh=mesh), "auto", rows),
        "jit all-gather": (jax_impl.attn, "auto", everything),
        "ring": (lambda q, k, v: sharded.ring_attn(q, k, v, mesh=mesh), "auto", everything),
    }
    if "explicit" in meshes:
        layouts["jit rows explicit"] = (jax_impl.attn, "explicit", rows)

    def peak(f, *a):
        """Peak bytes per device of the compiled program (XLA's memory analysis; None where not reported)."""
        stats = jax.jit(f).lower(*a).compile().memory_analysis()
        return getattr(stats, "peak_memory_in_bytes", None)

    def hlo(f, *a):
        return jax.jit(f).lower(*a).compile().as_text()

    def counts(text):
        found = re.findall(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", text)
        return {c: found.count(c) for c in COLLECTIVES if found.count(c)}

    def step(f):
        loss = lambda q, k, v: jnp.sum(f(q, k, v).o) + jnp.sum(f(q, k, v).a)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    results = {}
    for name, (f, kind, specs) in layouts.items():
        a = place(meshes[kind], specs)
        out, pullback = jax.vjp(f, *a)
        fwd, bwd = hlo(f, *a), hlo(pullback, out)
        entry = {"forward": counts(fwd), "backward": counts(bwd),
                 "reference forward": counts(hlo(jax_impl.attn_reference, *a)),
                 "bytes received per device, forward": collective_bytes(fwd, args.devices),
                 "bytes received per device, backward": collective_bytes(bwd, args.devices),
                 "peak bytes per device, forward": peak(f, *a), "peak bytes per device, fwd+bwd": peak(step(f), *a)}
        if not args.counts_only:
            mine, ref = step(f), step(jax_impl.attn_reference)
            jax.block_until_ready(mine(*a)), jax.block_until_ready(ref(*a))       # compile, warm up
            ratios = []
            for r in range(args.reps):      # the order alternates: whoever runs first pays for waking the pool
                times = {}
                for who, fn in ((("mine", mine), ("ref", ref)) if r % 2 == 0 else (("ref", ref), ("mine", mine))):
                    t0 = time.perf_counter()
                    jax.block_until_ready(fn(*a))
                    times[who] = time.perf_counter() - t0
                ratios.append(times["mine"] / times["ref"])
            entry[RATIO] = [
                round(float(x), 3) for x in np.percentile(ratios, [50, 25, 75])]
        results[name] = entry
        print(name, json.dumps(entry), flush=True)

    m, block = n // args.devices, n // args.devices * 2 * d * 4
    budget = {"a rows (m x n)": m * n * 4, "3 k/v blocks": 3 * block, "q, o rows, G_Q (m x d each)": 3 * m * d * 4}
    report = {"command": "python -m benchmarks.distributed_jax " + " ".join(argv if argv is not None else sys.argv[1:]),
              "jax": jax.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "devices": args.devices, "reps": args.reps, "n": n, "d": d, "e": d,
              "dtype": "float32",
              BUDGET: budget | {"sum": sum(budget.values())},
              "layouts": results}
    H.write_json(report, args.out)
    print(table(report))
    print("wrote", args.out)
    return 0


def table(report) -> str:
    """A markdown table of a report: per layout the HLO collectives (forward / backward), XLA's peak per device and
    the fwd+bwd ratio to ``attn_reference`` (median [IQR])."""
    def mib(b):
        return "—" if b is None else f"{b / 2**20:.2f} MiB" if b >= 2**18 else f"{b / 2**10:.1f} KiB"
    lines = [f"JAX {report['jax']}, {report['devices']} host-platform CPU devices (threads of one process on "
             f"{report['cpu_count']} CPUs), n={report['n']}, d=e={report['d']}, {report['dtype']}; collectives from "
             "the compiled HLO, bytes a device receives from them (an all-gather: (P−1)/P of its output); ratio = "
             "fwd+bwd of the layout / `attn_reference` under the same `jit`, mesh and input shardings (median [IQR] "
             "of paired repetitions).", "",
             "| layout | collectives fwd / bwd | reference fwd | bytes received per device fwd / bwd | "
             "peak per device fwd / fwd+bwd | ratio to reference |",
             "|---|---|---|---|---|---|"]
    for name, e in report["layouts"].items():
        r = e.get(RATIO)
        moved = [e.get(f"bytes received per device, {p}") for p in ("forward", "backward")]
        lines.append(f"| {name} | {H.counts(e['forward'])} / {H.counts(e['backward'])} | "
                     f"{H.counts(e['reference forward'])} | {mib(moved[0])} / {mib(moved[1])} | "
                     f"{mib(e['peak bytes per device, forward'])} / {mib(e['peak bytes per device, fwd+bwd'])} | "
                     + (f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" if r else "not timed") + " |")
    budget = report[BUDGET]
    lines += ["", "Ring memory budget per device (the target: the ring's forward peak ≤ the sum): "
              + ", ".join(f"{k} {mib(v)}" for k, v in budget.items()) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
