"""``python -m benchmarks.distributed [--world 4] [--n 2048] [--d 64] [--reps 15] [--out DIR]``: tanh attention
sharded over gloo CPU ranks, one layout at a time (``torch_impl.sharded.layouts.LAYOUTS``).

For each layout, on the same DTensors: fwd+bwd (cotangents on o and a) of the hand-written entry (the block
operators' sharding rules; the ring for ``ring``) against ``attn_reference`` (three aten ops, DTensor's own
rules), timed round-robin and paired per repetition (a barrier before and after each step: a sharded step
lasts as long as its slowest rank); collectives (``CommDebugMode``) and the bytes they return to each rank; the
ring's P2P hops and bytes; the allocator peak of one rank (``torch.profiler``, as ``benchmarks.measure``).
Writes ``distributed.json`` and ``distributed.md`` into ``--out`` (default: the git-ignored
``benchmarks/scratch/distributed/``; ``--update-results``: the committed ``benchmarks/results/``).

The ranks are forked from a forkserver that imported torch once; a free port (bound to port 0); a timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

if __package__ in (None, ""):           # python benchmarks/distributed.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402
from crosscheck.ranks import run_ranks  # noqa: E402

SCRATCH = os.path.join(H.SCRATCH, "distributed")   # the default; --update-results: H.RESULTS
TIMEOUT_S = 1800
LAYOUT_ORDER = ("replicate", "rows", "keys", "all_shard0", "ring")
DESCRIPTION = {
    "replicate": "q, k, v Replicate (every rank the whole op)",
    "rows": "q Shard(0); k, v Replicate",
    "keys": "q Replicate; k, v Shard(0)",
    "all_shard0": "q, k, v Shard(0), DTensor's default (all-gather)",
    "ring": "q, k, v Shard(0), the ring (P2P)",
}


def parse_args(argv=None):
    p = H.parser("python -m benchmarks.distributed", __doc__)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--d", type=int, default=64, help="d = e")
    p.add_argument("--reps", type=int, default=15)
    H.out_or_update(p, out_help="output directory (default: benchmarks/scratch/distributed)",
                    update_help="write the committed benchmarks/results/ instead")
    args = p.parse_args(argv)
    args.out = H.chosen_out(args, H.RESULTS, SCRATCH)
    return args


# --- per rank ------------------------------------------------------------------------------------------------
def _comm_mode(world: int):
    """``CommDebugMode`` that also adds up the bytes each collective brings to this rank (an all-gather: the
    other ranks' (P−1)/P of its output; other collectives: their output)."""
    from torch.distributed.tensor.debug import CommDebugMode

    class CommBytes(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            name = str(func._overloadpacket)     # the collective itself, not its wait_tensor / autograd wrapper
            if "c10d" in name and "wait" not in name and "wrap" not in name and isinstance(out, torch.Tensor):
                share = (world - 1) / world if "all_gather" in name else 1.0
                self.bytes += int(out.numel() * out.element_size() * share)
            return out

    return CommBytes()


def _rank_main(rank, world, port, args, outdir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = _bench(rank, world, args)
        if rank == 0:
            with open(os.path.join(outdir, "rank0.json"), "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _bench(rank, world, args):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    import torch_impl
    from benchmarks.measure import profiled_peak, repetition_orders
    from crosscheck.shards.torch_layouts import distribute_inputs
    from torch_impl.sharded import ring
    from torch_impl.sharded.layouts import LAYOUTS

    torch.set_num_threads(1)          # 4 ranks on a 2-core machine: one thread each
    mesh = init_device_mesh("cpu", (world,))
    n, d = args["n"], args["d"]
    g = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(n, d, generator=g) for _ in range(4))
    ga = torch.randn(n, n, generator=g)
    out = {"layouts": {}}
    steps = {}
    for name in LAYOUT_ORDER:
        layout = LAYOUTS[name]
        dts = [t.requires_grad_() for t in distribute_inputs(mesh, layout, q, k, v)]

        def cotangents(o, a):
            return [distribute_tensor(t, mesh, [Replicate() if p.is_partial() else p])
                    for t, p in ((go, o.placements[0]), (ga, a.placements[0]))]
        o, a = layout.fn(*dts)
        ro, ra = torch_impl.attn_reference(*dts)
        cots = cotangents(o, a)
        ref_cots = cotangents(ro, ra)
        # counts and bytes: one step of each, this rank
        info = {}
        for who, fn, cot in (("hand", layout.fn, cots), ("reference", torch_impl.attn_reference, ref_cots)):
            with ring.count_hops() as hops:
                with _comm_mode(world) as fwd:
                    o2, a2 = fn(*dts)
                with _comm_mode(world) as bwd:
                    torch.autograd.grad((o2, a2), dts, cot)
            info[who] = {"forward": {str(k_): c for k_, c in fwd.get_comm_counts().items()},
                         "backward": {str(k_): c for k_, c in bwd.get_comm_counts().items()},
                         "collective_bytes": fwd.bytes + bwd.bytes}
            if who == "hand" and name == "ring":
                info[who]["hops"] = hops
        err = float((o.full_tensor().detach() - torch_impl.attn_reference(q, k, v).o).abs().max())
        info["max_abs_error_o"] = err
        out["layouts"][name] = info

        def step(fn=layout.fn, cot=cots, dts=dts):
            o, a = fn(*dts)
            return torch.autograd.grad((o, a), dts, cot)

        def ref_step(cot=ref_cots, dts=dts):
            o, a = torch_impl.attn_reference(*dts)
            return torch.autograd.grad((o, a), dts, cot)
        steps[(name, "hand")] = step
        steps[(name, "reference")] = ref_step
        info["peak_bytes_rank"] = {"forward": profiled_peak(lambda: layout.fn(*dts)), "fwd_bwd": profiled_peak(step)}

    # timing: paired within a repetition, in measure.repetition_orders (the same on every rank); the slowest rank
    # decides (barrier after)
    keys = list(steps)
    for key in keys:
        steps[key]()                                     # warm
    samples = {key: [] for key in keys}
    for order in repetition_orders(keys, args["reps"]):
        for key in order:
            dist.barrier()
            t0 = time.perf_counter()
            steps[key]()
            dist.barrier()
            samples[key].append(time.perf_counter() - t0)
    for name in LAYOUT_ORDER:
        h, ref = np.array(samples[(name, "hand")]), np.array(samples[(name, "reference")])
        ratio = h / ref
        out["layouts"][name]["time"] = {
            "hand_median_s": float(np.median(h)), "reference_median_s": float(np.median(ref)),
            "ratio_median": float(np.median(ratio)), "ratio_q1": float(np.percentile(ratio, 25)),
            "ratio_q3": float(np.percentile(ratio, 75)), "reps": len(ratio)}
    out["block"] = {"m": -(-n // world), "n": n, "d": d, "e": d, "itemsize": 4}
    return out


# --- driver --------------------------------------------------------------------------------------------------
def ring_memory_bound(res) -> int:
    """The ring's per-rank memory target in bytes (float32): the rank's a block (m × n) + 3 k/v blocks (m × d of k
    and m × e of v each) + O(m·(d+e)), counted as 2·m·(d+e)."""
    m, n, d = -(-res["n"] // res["world"]), res["n"], res["d"]
    return (m * n + 3 * m * 2 * d + 2 * m * 2 * d) * 4


def table(res) -> str:
    """distributed.md: one row per layout (collectives, hops, bytes moved, peak, time ratio) and the ring's bound."""
    P, n, d = res["world"], res["n"], res["d"]
    lines = [f"# Sharded tanh attention on {P} gloo CPU ranks (n={n}, d=e={d}, float32)", "",
             f"{res['date']}, torch {res['torch']}, {res['cpus']} CPUs shared by the ranks (one thread each). "
             "fwd+bwd with cotangents on o and a; ratio = hand-written entry / `attn_reference` on the same "
             f"DTensors, median of {res['reps']} paired repetitions (IQR in brackets). Collectives counted by "
             "`CommDebugMode` on rank 0; bytes = what a rank receives from the collectives (an all-gather: "
             "(P−1)/P of its output) or sends round the ring. The reference leaves G_K, G_V `Partial` (their "
             "reduction, when read, is not counted); the ring's accumulator hops are that reduction.", "",
             "| layout | collectives fwd / bwd (hand) | collectives fwd / bwd (reference) | hops fwd / bwd | "
             "bytes moved per rank (hand / reference) | peak per rank fwd / fwd+bwd | fwd+bwd time (hand) | "
             "ratio to reference |", "|---|---|---|---|---|---|---|---|"]

    def counts(c):
        return f"{H.counts(c['forward'])} / {H.counts(c['backward'])}"
    for name in LAYOUT_ORDER:
        L = res["layouts"][name]
        hops = L["hand"].get("hops")
        moved = L["hand"]["collective_bytes"] + (hops["forward_bytes"] + hops["backward_bytes"] if hops else 0)
        t = L["time"]
        lines.append(
            f"| {name}: {DESCRIPTION[name]} | {counts(L['hand'])} | {counts(L['reference'])} | "
            f"{'%d / %d' % (hops['forward'], hops['backward']) if hops else '–'} | "
            f"{moved / 2**20:.2f} / {L['reference']['collective_bytes'] / 2**20:.2f} MiB | "
            f"{L['peak_bytes_rank']['forward'] / 2**20:.1f} / {L['peak_bytes_rank']['fwd_bwd'] / 2**20:.1f} MiB | "
            f"{t['hand_median_s'] * 1e3:.1f} ms | {t['ratio_median']:.3f} [{t['ratio_q1']:.3f}, {t['ratio_q3']:.3f}] |")
    b = res["layouts"]["ring"]
    m, nn, dd = -(-n // P), n, d
    bound = ring_memory_bound(res)
    lines += ["", f"Ring memory bound (the target): a block {m}×{nn} + 3 k/v blocks ({m}×{dd} each of k and v) + "
              f"O(m·(d+e)) (counted as 2·m·(d+e)) = {bound / 2**20:.2f} MiB; measured forward peak "
              f"{b['peak_bytes_rank']['forward'] / 2**20:.2f} MiB (includes the outputs o and a)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)        # before the ranks: a path that cannot be made fails at once
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_ranks(_rank_main, args.world, (vars(args), tmp), timeout_s=TIMEOUT_S,
                      preload=("torch", "torch.distributed.tensor", "torch_impl"))
        except TimeoutError as exc:
            raise SystemExit(f"benchmarks.distributed: {exc}") from None
        with open(os.path.join(tmp, "rank0.json")) as f:
            res = json.load(f)
    res.update(world=args.world, n=args.n, d=args.d, reps=args.reps, torch=torch.__version__,
               cpus=os.cpu_count(), date=H.date_utc())
    H.write_json(res, os.path.join(args.out, "distributed.json"))
    text = table(res)
    H.write_text(os.path.join(args.out, "distributed.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
