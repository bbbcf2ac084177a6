"""What every benchmark program shares, each piece once: where results go (``RESULTS``, committed, written only on
``--update-results``; the git-ignored ``SCRATCH`` otherwise: ``out_or_update``, ``chosen_out``), the parser of a
``python -m benchmarks.x`` command (``parser``), what a run records of its machine (``date_utc``, ``git``,
``cpu_name``, ``load_average``), its files (``write_json``, ``write_text``), ratios of timing samples
(``summarize``, ``paired_ratio``, ``unpaired_ratio``) and its results as text (``md_table``, ``targets_table``,
``print_targets``, ``counts``).  Standard library and numpy only: the JAX-only programs import it too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
from typing import Callable, List, Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")     # committed: remade only by --update-results
SCRATCH = os.path.join(REPO, "benchmarks", "scratch")     # git-ignored: every other run


# --------------------------------------------------------------------------------------------- command line

def parser(prog: str, doc: str, *, whole_doc: bool = False, raw: bool = False) -> argparse.ArgumentParser:
    """The parser of ``python -m <prog>``: described by the first paragraph of the module's docstring ``doc``
    (``whole_doc``: all of it), rewrapped by argparse unless ``raw``."""
    return argparse.ArgumentParser(prog=prog, description=doc if whole_doc else doc.split("\n\n")[0],
                                   **({"formatter_class": argparse.RawDescriptionHelpFormatter} if raw else {}))


def out_or_update(p: argparse.ArgumentParser, *, out_help: str, update_help: str) -> None:
    """``--out PATH`` or ``--update-results``, one of the two (see ``chosen_out``)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=None, help=out_help)
    where.add_argument("--update-results", action="store_true", help=update_help)


def chosen_out(args, results: str, scratch: str) -> str:
    """Where a run writes: ``--out`` as given; else the committed ``results`` only for ``--update-results``, and
    the git-ignored ``scratch`` for every other run, so trying a command never replaces the committed figures."""
    if args.out is not None:
        return args.out
    return results if args.update_results else scratch


# --------------------------------------------------------------------------------------------- the machine

def date_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def git(*args: str) -> str:
    """``git args`` in the repository, its output stripped; "" where git fails."""
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_average() -> Optional[list]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


# --------------------------------------------------------------------------------------------- files

def numpy_default(x):
    """``json.dump``'s ``default`` that writes numpy scalars as numbers (anything else as its ``str``)."""
    return x.item() if isinstance(x, np.generic) else str(x)


def write_json(obj, path: str, default: Callable = str) -> None:
    """``obj`` as indented JSON at ``path`` (its folder made if need be); ``default`` for what JSON cannot hold."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=default)


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


# --------------------------------------------------------------------------------------------- ratios

def summarize(xs: List[float]) -> dict:
    a = np.asarray(xs, dtype=float)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "min": float(a.min()), "max": float(a.max()),
            "n": int(a.size)}


def paired_ratio(num: List[float], den: List[float]) -> dict:
    """Median and IQR of per-repetition ratios num[r] / den[r] (same repetition = same machine state)."""
    r = np.asarray(num, dtype=float) / np.asarray(den, dtype=float)
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3)}


def unpaired_ratio(num: List[float], den: List[float]) -> dict:
    """For samples not taken in the same repetitions: quartiles of ``num`` over the median of ``den``."""
    a, med_den = np.asarray(num, dtype=float), float(np.median(den))
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"median": float(med) / med_den, "q1": float(q1) / med_den, "q3": float(q3) / med_den, "paired": False}


# --------------------------------------------------------------------------------------------- text

MET = {True: "met", False: "**not met**", None: "—"}          # a target's status in markdown
STATUS = {True: "MET", False: "NOT MET", None: "—"}           # on stdout


def md_table(header: List[str], rows) -> List[str]:
    """A markdown table's lines: ``header``, its rule, one line per row (a list of cells)."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def targets_table(targets: list, status: str = "status") -> List[str]:
    """Targets (dicts with ``target``, ``met``, ``detail``) as a markdown table; ``status`` heads the middle column."""
    return md_table(["target", status, "measured"], ([t["target"], MET[t["met"]], t["detail"]] for t in targets))


def print_targets(targets: list, title: str = "Targets") -> None:
    print(f"\n{title}")
    for t in targets:
        print(f"  [{STATUS[t['met']]:>7}] {t['target']}: {t['detail']}")


def counts(c: dict) -> str:
    """Collective counts ``{name: count}`` as ``"2× all_gather, 1× all_reduce"`` (a dotted name by its last part)."""
    return ", ".join(f"{v}× {k.split('.')[-1]}" for k, v in c.items()) or "0"
