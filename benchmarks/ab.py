"""Is a sharded layout slower than at another commit, or is the difference the machine's run-to-run spread?

    python -m benchmarks.ab REV [--runs 4] [--frameworks jax,torch] [--out FILE]

The sharded benchmarks report each layout's time as a ratio to the plain composite measured in the same process
(``benchmarks.distributed_jax``, ``benchmarks.distributed``), yet two runs of the same code on this shared 2-core
machine differ by a few hundredths.  This checks REV out into a temporary git worktree and runs each benchmark
there and in this tree alternately, ``--runs`` times each (here, REV, REV, here, ...: both sides see the same
drift of the machine), with the command lines, rank counts and timeouts of ``python -m benchmarks``
(``benchmarks.sharded``).  Per layout it prints each side's run medians and a verdict: "slower" only when every
run of this tree is above every run of REV (the ranges do not overlap), "faster" the converse, else "within
spread".  With r runs a side and no real change, a layout comes out "slower" by chance 1 in C(2r, r) times
(1/20 at r = 3, 1/70 at the default 4; it prints the figure): over the ten layouts, read a lone "slower" at
r = 3 as a reason to re-run, not as a finding.  Writes every run's ratios as JSON (default
benchmarks/scratch/ab.json).  About 8 minutes per run pair of both frameworks; run it on an otherwise idle
machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence

if __package__ in (None, ""):           # python benchmarks/ab.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402

SCRATCH = os.path.join(H.SCRATCH, "ab.json")
MIN_RUNS = 3


def jax_ratios(result: dict) -> Dict[str, float]:
    """Layout -> median fwd+bwd ratio, from a ``benchmarks.distributed_jax`` JSON."""
    from benchmarks.distributed_jax import RATIO
    return {name: row[RATIO][0] for name, row in result["layouts"].items() if RATIO in row}


def torch_ratios(result: dict) -> Dict[str, float]:
    """Layout -> median fwd+bwd ratio, from a ``benchmarks.distributed`` JSON."""
    return {name: row["time"]["ratio_median"] for name, row in result["layouts"].items() if "time" in row}


# framework -> (the results file the benchmark writes in its output folder, its reader)
BENCHMARKS = {"jax": ("distributed_jax.json", jax_ratios), "torch": ("distributed.json", torch_ratios)}


def verdict(here: Sequence[float], there: Sequence[float]) -> str:
    """"slower" when every run here is above every run there, "faster" when every one is below, else "within
    spread" (the ranges overlap: the difference is not told apart from run-to-run variation)."""
    if min(here) > max(there):
        return "slower"
    if max(here) < min(there):
        return "faster"
    return "within spread"


def false_alarm(runs: int) -> float:
    """The chance that ``runs`` runs of unchanged code all land above ``runs`` others: 1 / C(2r, r)."""
    return 1 / math.comb(2 * runs, runs)


def _run(framework: str, tree: str, out_dir: str) -> Dict[str, float]:
    from benchmarks.sharded import TIMEOUT_S, commands, run_one
    os.makedirs(out_dir, exist_ok=True)
    status = run_one(commands(out_dir, quick=False, jax=True)[framework], TIMEOUT_S[framework], tree)
    if "error" in status:
        raise RuntimeError(f"{framework} benchmark in {tree}: {status['error']}")
    name, read = BENCHMARKS[framework]
    with open(os.path.join(out_dir, name)) as f:
        return read(json.load(f))


def table_of(sides: Dict[str, List[Dict[str, float]]]) -> Dict[str, dict]:
    """{layout: {"here": [ratios], "rev": [ratios], "verdict": ...}} for the layouts every run measured; a layout
    some run lacks (renamed, new, or failed there) is listed with ``"not compared"`` and the runs that had it."""
    names = list(dict.fromkeys(name for runs in sides.values() for run in runs for name in run))
    table = {}
    for name in names:
        row = {side: [run[name] for run in runs if name in run] for side, runs in sides.items()}
        complete = all(len(row[side]) == len(runs) for side, runs in sides.items())
        row["verdict"] = verdict(row["here"], row["rev"]) if complete else "not compared (missing in some runs)"
        table[name] = row
    return table


def compare(rev: str, runs: int, frameworks: Sequence[str]) -> Dict[str, dict]:
    """{framework: table_of(its runs)}, the runs of this tree and of REV interleaved."""
    result: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        old = os.path.join(tmp, "rev")
        subprocess.run(["git", "worktree", "add", "--detach", old, rev], cwd=H.REPO, check=True,
                       capture_output=True)
        try:
            for fw in frameworks:
                sides: Dict[str, List[Dict[str, float]]] = {"here": [], "rev": []}
                for i in range(runs):
                    for side, tree in (("rev", old), ("here", H.REPO)) if i % 2 else (("here", H.REPO), ("rev", old)):
                        out_dir = os.path.join(tmp, f"{fw}-{side}-{i}")
                        sides[side].append(_run(fw, tree, out_dir))
                result[fw] = table_of(sides)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old], cwd=H.REPO, capture_output=True)
    return result


def render(rev: str, runs: int, result: Dict[str, dict]) -> str:
    lines = H.md_table(["framework", "layout", "this tree (runs)", f"{rev} (runs)", "verdict"], (
        [fw, name, *(", ".join(f"{x:.3f}" for x in row[s]) for s in ("here", "rev")), row["verdict"]]
        for fw, rows in result.items() for name, row in rows.items()))
    lines.append(f"\n{runs} runs a side: unchanged code reads 'slower' (or 'faster') by chance "
                 f"{false_alarm(runs):.1%} of the time per layout.")
    return "\n".join(lines)


def _commit(rev: str) -> str:
    """``rev`` as a full commit hash, or "" when git cannot resolve it to a commit."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=H.REPO,
                           capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else ""


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked (frameworks, run count, REV a commit) before any run."""
    p = H.parser("python -m benchmarks.ab", __doc__)
    p.add_argument("rev", help="the commit to compare with (e.g. the one the committed results were measured on)")
    p.add_argument("--runs", type=int, default=4, help=f"runs per side and framework (default 4, at least {MIN_RUNS})")
    p.add_argument("--frameworks", default="jax,torch")
    p.add_argument("--out", default=SCRATCH, help="the JSON of every run (default: benchmarks/scratch/ab.json)")
    args = p.parse_args(argv)
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = sorted(set(args.frameworks) - set(BENCHMARKS))
    if unknown:
        p.error(f"--frameworks takes {', '.join(BENCHMARKS)} (got {', '.join(unknown)})")
    if args.runs < MIN_RUNS:
        p.error(f"--runs must be at least {MIN_RUNS}: with {args.runs} a side, unchanged code reads 'slower' or "
                f"'faster' {2 * false_alarm(max(args.runs, 1)):.0%} of the time")
    args.commit = _commit(args.rev)
    if not args.commit:
        p.error(f"REV {args.rev!r} is not a commit of this repository")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = compare(args.commit, args.runs, args.frameworks)
    H.write_json({"rev": args.rev, "commit": args.commit, "runs": args.runs, "ratios": result}, args.out)
    print(render(args.rev, args.runs, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
