"""JAX sharded tanh attention on host-platform CPU devices: collectives per layout and fwd+bwd time ratios.

    python -m benchmarks.distributed_jax [--devices 4] [--n 1024] [--d 64] [--reps 15] [--counts-only]
                                         [--out benchmarks/results/distributed_jax.json]

Runs alone (it sets ``XLA_FLAGS=--xla_force_host_platform_device_count=P`` before importing JAX, so it must be its
own process).  For each layout, on a mesh of P devices along axis "x":

* ``jit rows``: ``jax.jit`` of ``jax_impl.attn`` with q ``NamedSharding(P("x"))``, k, v replicated (Auto axes);
* ``jit rows explicit``: the same on ``AxisType.Explicit`` axes (JAX >= 0.5);
* ``shard_map rows``: ``jax_impl.ring.attn_rows``;
* ``jit all-gather``: ``jax.jit`` of ``jax_impl.attn`` with q, k, v all over rows (XLA gathers k and v);
* ``ring``: ``jax_impl.ring.attn_ring``, q, k, v sharded over rows;

it counts the collectives in the compiled HLO of the forward and of the backward alone (the pullback jitted by
itself), reads XLA's peak memory per device (forward; fwd+bwd step), and times one fwd+bwd step (``jax.grad`` of ``sum(o) + sum(a)`` w.r.t. q, k, v) against
``jax_impl.attn_reference`` under the same ``jit``, mesh and input shardings (for the ring: q, k, v all over rows,
GSPMD's all-gather layout), interleaved, as the median of paired ratios.  On a shared 2-core CPU the P "devices" are
threads of one process: read the ratios, not the times.  Writes a small JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.distributed_jax", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--d", type=int, default=64, help="d = e")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--counts-only", action="store_true", help="collective counts only, no timing")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "distributed_jax.json"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_impl
    from jax_impl import ring

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
        "shard_map rows": (lambda q, k, v: ring.attn_rows(q, k, v, mesh=mesh), "auto", rows),
        "jit all-gather": (jax_impl.attn, "auto", everything),
        "ring": (lambda q, k, v: ring.attn_ring(q, k, v, mesh=mesh), "auto", everything),
    }
    if "explicit" in meshes:
        layouts["jit rows explicit"] = (jax_impl.attn, "explicit", rows)

    def peak(f, *a):
        """Peak bytes per device of the compiled program (XLA's memory analysis; None where not reported)."""
        stats = jax.jit(f).lower(*a).compile().memory_analysis()
        return getattr(stats, "peak_memory_in_bytes", None)

    def counts(f, *a):
        text = jax.jit(f).lower(*a).compile().as_text()
        found = re.findall(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", text)
        return {c: found.count(c) for c in COLLECTIVES if found.count(c)}

    def step(f):
        loss = lambda q, k, v: jnp.sum(f(q, k, v).o) + jnp.sum(f(q, k, v).a)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    results = {}
    for name, (f, kind, specs) in layouts.items():
        a = place(meshes[kind], specs)
        out, pullback = jax.vjp(f, *a)
        entry = {"forward": counts(f, *a), "backward": counts(pullback, out),
                 "reference forward": counts(jax_impl.attn_reference, *a),
                 "peak bytes per device, forward": peak(f, *a), "peak bytes per device, fwd+bwd": peak(step(f), *a)}
        if not args.counts_only:
            mine, ref = step(f), step(jax_impl.attn_reference)
            jax.block_until_ready(mine(*a)), jax.block_until_ready(ref(*a))       # compile, warm up
            ratios = []
            for _ in range(args.reps):
                t0 = time.perf_counter(); jax.block_until_ready(mine(*a))
                t1 = time.perf_counter(); jax.block_until_ready(ref(*a))
                t2 = time.perf_counter()
                ratios.append((t1 - t0) / (t2 - t1))
            entry["fwd+bwd ratio to attn_reference (median, q1, q3)"] = [
                round(float(x), 3) for x in np.percentile(ratios, [50, 25, 75])]
        results[name] = entry
        print(name, json.dumps(entry), flush=True)

    m, block = n // args.devices, n // args.devices * 2 * d * 4
    budget = {"a rows (m x n)": m * n * 4, "3 k/v blocks": 3 * block, "q, o rows, G_Q (m x d each)": 3 * m * d * 4}
    report = {"command": "python -m benchmarks.distributed_jax " + " ".join(argv if argv is not None else sys.argv[1:]),
              "jax": jax.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "devices": args.devices, "n": n, "d": d, "e": d, "dtype": "float32",
              "ring budget, bytes per device (target: ring's forward peak <= the sum)": budget | {"sum": sum(budget.values())},
              "layouts": results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
