"""Is a sharded layout slower than at another commit, or is the difference the machine's run-to-run spread?

    python -m benchmarks.ab REV [--runs 3] [--frameworks jax,torch] [--out FILE]

The sharded benchmarks report each layout's time as a ratio to the plain composite measured in the same process
(``benchmarks.distributed_jax``, ``benchmarks.distributed``), yet two runs of the same code on this shared 2-core
machine differ by a few hundredths.  This checks REV out into a temporary git worktree and runs each benchmark
there and in this tree alternately, ``--runs`` times each (A B A B ...: both sides see the same drift of the
machine), every run its own process writing to a scratch file.  Per layout it prints each side's run medians and
a verdict: "slower" only when every run of this tree is above every run of REV (the two ranges do not overlap),
"faster" the converse, else "within spread".  Writes every run's ratios as JSON (default
benchmarks/scratch/ab.json).  Several minutes per run pair; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRATCH = os.path.join(REPO, "benchmarks", "scratch", "ab.json")


def jax_ratios(result: dict) -> Dict[str, float]:
    """Layout -> median fwd+bwd ratio, from a ``benchmarks.distributed_jax`` JSON."""
    from benchmarks.distributed_jax import RATIO
    return {name: row[RATIO][0] for name, row in result["layouts"].items() if RATIO in row}


def torch_ratios(result: dict) -> Dict[str, float]:
    """Layout -> median fwd+bwd ratio, from a ``benchmarks.distributed`` JSON."""
    return {name: row["time"]["ratio_median"] for name, row in result["layouts"].items() if "time" in row}


# framework -> (module, its size flag, how its output is named: a file or a directory holding distributed.json,
# reader); run on as many ranks / devices as ``python -m benchmarks`` runs them (``sharded.WORLD``)
BENCHMARKS = {"jax": ("benchmarks.distributed_jax", "--devices", "file", jax_ratios),
              "torch": ("benchmarks.distributed", "--world", "dir", torch_ratios)}


def verdict(here: Sequence[float], there: Sequence[float]) -> str:
    """"slower" when every run here is above every run there, "faster" when every one is below, else "within
    spread" (the ranges overlap: the difference is not told apart from run-to-run variation)."""
    if min(here) > max(there):
        return "slower"
    if max(here) < min(there):
        return "faster"
    return "within spread"


def _run(framework: str, tree: str, scratch: str) -> Dict[str, float]:
    from benchmarks.sharded import WORLD
    module, size_flag, kind, read = BENCHMARKS[framework]
    out = os.path.join(scratch, f"{framework}-{len(os.listdir(scratch))}")
    env = dict(os.environ, PYTHONPATH=tree)             # the tree's own packages, not the installed checkout
    subprocess.run([sys.executable, "-m", module, size_flag, str(WORLD), "--out", out], cwd=tree, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    with open(out if kind == "file" else os.path.join(out, "distributed.json")) as f:
        return read(json.load(f))


def compare(rev: str, runs: int, frameworks: Sequence[str]) -> Dict[str, dict]:
    """{framework: {layout: {"here": [ratios], "rev": [ratios], "verdict": ...}}}, the runs interleaved."""
    table: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        old = os.path.join(tmp, "rev")
        subprocess.run(["git", "worktree", "add", "--detach", old, rev], cwd=REPO, check=True,
                       capture_output=True)
        try:
            scratch = os.path.join(tmp, "runs")
            os.makedirs(scratch)
            for fw in frameworks:
                sides: Dict[str, List[Dict[str, float]]] = {"here": [], "rev": []}
                for i in range(runs):
                    for side, tree in (("rev", old), ("here", REPO)) if i % 2 else (("here", REPO), ("rev", old)):
                        sides[side].append(_run(fw, tree, scratch))
                        print(f"{fw} {side} run {len(sides[side])}: {sides[side][-1]}", file=sys.stderr)
                layouts = [name for name in sides["here"][0] if all(name in r for r in sides["rev"])]
                table[fw] = {name: {side: [r[name] for r in sides[side]] for side in sides} for name in layouts}
                for row in table[fw].values():
                    row["verdict"] = verdict(row["here"], row["rev"])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old], cwd=REPO, capture_output=True)
    return table


def render(rev: str, table: Dict[str, dict]) -> str:
    lines = [f"| framework | layout | this tree (runs) | {rev} (runs) | verdict |", "|---|---|---|---|---|"]
    for fw, rows in table.items():
        for name, row in rows.items():
            here, there = (", ".join(f"{x:.3f}" for x in row[s]) for s in ("here", "rev"))
            lines.append(f"| {fw} | {name} | {here} | {there} | {row['verdict']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("rev", help="the commit to compare with (e.g. the one the committed results were measured on)")
    p.add_argument("--runs", type=int, default=3, help="runs per side and framework (default 3)")
    p.add_argument("--frameworks", default="jax,torch")
    p.add_argument("--out", default=SCRATCH)
    args = p.parse_args(argv)
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = sorted(set(frameworks) - set(BENCHMARKS))
    if unknown or args.runs < 1:
        p.error(f"--frameworks takes {', '.join(BENCHMARKS)} (got {', '.join(unknown)})" if unknown
                else "--runs must be at least 1")
    table = compare(args.rev, args.runs, frameworks)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rev": args.rev, "runs": args.runs, "ratios": table}, f, indent=1)
    print(render(args.rev, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
