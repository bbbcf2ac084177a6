"""``python -m mutation [TARGET ...]``: mutation testing of the modules where a wrong line is a wrong gradient or a
wrong verdict (the formulas, and every crosscheck module that decides a verdict or a finding), and the report
``mutation/report.md``.

Targets are the cosmic-ray configs beside this file (``mutation/NAME.toml``: the module, and the fast test
command that exercises it); without arguments, all of them.  Each target runs in a fresh copy of the working tree
(the tracked and new files, no ``__pycache__``) under the system's temp dir, so a mutant never touches your
checkout and an interrupted run leaves nothing behind; cosmic-ray's core operators and this project's domain
operators (``mutation/operators.py``) both apply.  Per target the results go to ``mutation/results/NAME.json``
and ``mutation/report.md`` is rebuilt from every results file: killed / survived / equivalent per module (a
surviving mutant listed in ``mutation/equivalent.py`` with the reason it cannot change behaviour), each surviving
mutant's diff, and the run time.  Exit 1 when a target's score (killed / non-equivalent) is below 95 %.

Slow by nature (one test run per mutant; every target, about two hours on 2 cores): run the target of a module
when the module changes (the report marks a target stale when its module changed since its run), not on every CI
run.  ``--list`` prints the mutants of each target without running them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
REPORT = HERE / "report.md"
TARGET = 0.95


def targets():
    return sorted(p.stem for p in HERE.glob("*.toml"))


def _config(name: str) -> dict:
    try:
        import tomllib
    except ImportError:                                # Python 3.10
        import tomli as tomllib
    with open(HERE / f"{name}.toml", "rb") as f:
        return tomllib.load(f)["cosmic-ray"]


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, timeout=60).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and "__pycache__" not in f and not f.startswith("mutation/results/"):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def _cr(args, cwd: Path, env, timeout: float):
    return subprocess.run([sys.executable, "-m", "mutation.cr", *args], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


def _session(workdir: Path, name: str, env, run: bool):
    """init (and exec) one target in ``workdir``; returns [(operator, line, mutated line, outcome, diff)]."""
    cfg = workdir / "mutation" / f"{name}.toml"
    db = workdir / f"{name}.sqlite"
    r = _cr(["init", str(cfg), str(db)], workdir, env, 600)
    if r.returncode:
        raise SystemExit(f"cosmic-ray init failed for {name}:\n{r.stderr[-3000:]}")
    _exclude(db, _config(name).get("filters", {}).get("operators-filter", {}).get("exclude-operators", ()))
    if run:
        r = _cr(["baseline", str(cfg)], workdir, env, 900)
        if r.returncode:
            raise SystemExit(f"baseline (no mutation) fails for {name}: fix the tests first\n{r.stderr[-3000:]}")
        r = _cr(["exec", str(cfg), str(db)], workdir, env, 6 * 3600)
        if r.returncode:
            raise SystemExit(f"cosmic-ray exec failed for {name}:\n{r.stderr[-3000:]}")
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator
    from cosmic_ray.work_db import WorkDB

    from .cr import register
    register()
    database = WorkDB(db, WorkDB.Mode.open)
    try:
        results = dict(database.results)
        out = []
        for item in database.work_items:
            m = item.mutations[0]
            source = (workdir / m.module_path).read_text()
            mutated = mutate_code(source, get_operator(m.operator_name)(), m.occurrence) or source
            line = m.start_pos[0]
            new_line = _changed_line(source, mutated, line)
            res = results.get(item.job_id)
            outcome = "pending" if res is None else (str(res.test_outcome.value) if res.test_outcome else
                                                     str(res.worker_outcome.value))
            if outcome == "skipped":
                continue                               # an excluded operator (the config's operators-filter)
            out.append({"operator": m.operator_name, "line": line,
                        "original": source.splitlines()[line - 1].strip(), "mutated": new_line,
                        "outcome": outcome})
        return out
    finally:
        database.close()


def _exclude(db: Path, patterns) -> None:
    """Mark the mutants of the operators matching ``patterns`` skipped, as cosmic-ray's ``cr-filter-operators``
    does with the same config key (so ``exec`` does not run them)."""
    import re

    from cosmic_ray.work_db import WorkDB
    from cosmic_ray.work_item import WorkerOutcome, WorkResult
    if not patterns:
        return
    regex = re.compile("|".join(f"(?:{p})" for p in patterns))
    database = WorkDB(db, WorkDB.Mode.open)
    try:
        for item in database.work_items:
            if any(regex.match(m.operator_name) for m in item.mutations):
                database.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    finally:
        database.close()


def _changed_line(source: str, mutated: str, line: int) -> str:
    a, b = source.splitlines(), mutated.splitlines()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return y.strip()
    return b[line - 1].strip() if line - 1 < len(b) else ""


def run_target(name: str, run: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        env = dict(os.environ, PYTHONPATH=str(work), PYTHONDONTWRITEBYTECODE="1")
        t0 = time.perf_counter()
        mutants = _session(work, name, env, run)
        elapsed = time.perf_counter() - t0
    cfg = _config(name)
    module, command = cfg["module-path"], cfg["test-command"]
    excluded = list(cfg.get("filters", {}).get("operators-filter", {}).get("exclude-operators", ()))
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", module], cwd=ROOT, capture_output=True,
                            text=True, timeout=60).stdout.strip()
    return {"target": name, "module": module, "module_commit": commit, "test_command": command,
            "excluded": excluded,
            "seconds": round(elapsed, 1), "mutants": mutants}


def retest_survivors(name: str) -> dict:
    """Re-run the test command on the survivors of the last run of ``name`` only (after tests were added), in a
    fresh copy; the other mutants keep their outcome.  The full run stays the reference: rerun it when the
    module itself changed."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    from .cr import register
    from .equivalent import EQUIVALENT
    register()
    equivalent = EQUIVALENT.get(name, {})
    result = json.loads((RESULTS / f"{name}.json").read_text())
    cfg = _config(name)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        env = dict(os.environ, PYTHONPATH=str(work), PYTHONDONTWRITEBYTECODE="1")
        path = work / cfg["module-path"]
        source = path.read_text()
        for m in result["mutants"]:
            if m["outcome"] != "survived" or (m["operator"], m["original"], m["mutated"]) in equivalent:
                continue
            occurrence = 0
            while (mutated := mutate_code(source, get_operator(m["operator"])(), occurrence)) is not None:
                if _changed_line(source, mutated, m["line"]) == m["mutated"]:
                    break
                occurrence += 1
            if mutated is None:
                raise SystemExit(f"{name}: mutant not found any more (the module changed: rerun in full): {m}")
            path.write_text(mutated)
            try:
                r = subprocess.run(shlex.split(cfg["test-command"]), cwd=work, env=env, capture_output=True,
                                   timeout=cfg.get("timeout", 300))
                m["outcome"] = "survived" if r.returncode == 0 else "killed"
            except subprocess.TimeoutExpired:
                m["outcome"] = "killed"
            finally:
                path.write_text(source)
            print(f"  {m['outcome']}: line {m['line']} {m['operator']}: {m['mutated']}", flush=True)
    result["seconds_survivors_retest"] = round(time.perf_counter() - t0, 1)
    return result


def classify(result: dict):
    from .equivalent import EQUIVALENT
    equivalent = EQUIVALENT.get(result["target"], {})
    counts = {"killed": 0, "survived": 0, "equivalent": 0, "incompetent": 0}
    survivors = []
    for m in result["mutants"]:
        if m["outcome"] == "survived":
            reason = equivalent.get((m["operator"], m["original"], m["mutated"]))
            if reason:
                counts["equivalent"] += 1
                survivors.append((m, reason))
            else:
                counts["survived"] += 1
                survivors.append((m, None))
        elif m["outcome"] == "killed":
            counts["killed"] += 1
        else:
            counts["incompetent"] += 1                # the test command could not run (counted as killed)
    return counts, survivors


def score(counts) -> float:
    live = counts["killed"] + counts["incompetent"] + counts["survived"]
    return 1.0 if not live else (counts["killed"] + counts["incompetent"]) / live


def write_report() -> bool:
    results = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    lines = ["# Mutation testing report", "",
             "Written by `python -m mutation` (see its docstring); do not edit by hand.  Operators: cosmic-ray's "
             "core set plus the project's domain operators (`mutation/operators.py`: drop a conjugate, drop or add "
             "a transpose, swap matmul operands, drop a term of a sum, `1 − a²` → `1 − a`, compare real parts "
             "only), less the operators each config excludes (below).  Score = killed / (mutants − equivalent); "
             "incompetent mutants (the test command cannot even run, e.g. an import-time error) count as killed.  "
             "Target: ≥ 95 %.", "",
             "| target | module @ last commit changing it | mutants | killed | incompetent | survived | equivalent "
             "| score | run time |",
             "|---|---|---|---|---|---|---|---|---|"]
    ok = True
    for r in results:
        now = subprocess.run(["git", "log", "-1", "--format=%h", "--", r["module"]], cwd=ROOT, capture_output=True,
                             text=True, timeout=60).stdout.strip()
        if r.get("module_commit") and now and now != r["module_commit"]:
            r["stale"] = now
        c, _ = classify(r)
        s = score(c)
        ok &= s >= TARGET
        retest = (f" (+ {r['seconds_survivors_retest'] / 60:.1f} min re-testing survivors)"
                  if "seconds_survivors_retest" in r else "")
        lines.append(f"| {r['target']} | `{r['module']}` @ {r.get('module_commit', '?')} | {len(r['mutants'])} "
                     f"| {c['killed']} | {c['incompetent']} "
                     f"| {c['survived']} | {c['equivalent']} | {100 * s:.1f} % | {r['seconds'] / 60:.1f} min{retest} |")
    missing = [t for t in targets() if t not in {r["target"] for r in results}]
    if missing:
        lines.append(f"\nNot run yet: {', '.join(missing)} (`python -m mutation {' '.join(missing)}`).")
    for r in results:
        if r.get("stale"):
            lines.append(f"\n**{r['target']}: stale** — `{r['module']}` changed since this run "
                         f"(now at {r['stale']}): rerun `python -m mutation {r['target']}`.")
    lines += ["", "Test command per target (only the tests that exercise that module) and excluded operators:", ""]
    for r in results:
        excluded = ", ".join(f"`{x}`" for x in r.get("excluded", ())) or "none"
        lines.append(f"* {r['target']}: `{r['test_command']}`; excluded operators: {excluded}")
    for r in results:
        c, survivors = classify(r)
        by_op = {}
        for m in r["mutants"]:
            by_op.setdefault(m["operator"], [0, 0])
            by_op[m["operator"]][0] += 1
            by_op[m["operator"]][1] += m["outcome"] != "survived"
        lines += ["", f"## {r['target']} (`{r['module']}`)", "",
                  "Mutants per operator (killed / made): " + ", ".join(
                      f"{op.split('/')[1]} {k}/{n}" for op, (n, k) in sorted(by_op.items())), ""]
        from .equivalent import DEAD_CODE
        for code, why in DEAD_CODE.get(r["target"], ()):
            lines += [f"* dead code (reported, not deleted here): {code}: {why}"]
        if not survivors:
            lines.append("No mutant survives.")
        for m, reason in survivors:
            tag = f"equivalent: {reason}" if reason else "**SURVIVED** (not killed by any test)"
            lines += [f"* line {m['line']}, {m['operator']}: `{m['original']}` → `{m['mutated']}`  ", f"  {tag}"]
    REPORT.write_text("\n".join(lines) + "\n")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"of {', '.join(targets())} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--survivors", action="store_true",
                        help="re-test only the survivors of the last run (mutation/results/TARGET.json)")
    args = parser.parse_args(argv)
    names = args.targets or targets()
    unknown = [n for n in names if n not in targets()]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}; choose from {', '.join(targets())}")
    for name in names:
        if args.list:
            r = run_target(name, run=False)
            for m in r["mutants"]:
                print(f"{name}:{m['line']} {m['operator']}: {m['original']}  →  {m['mutated']}")
            print(f"{name}: {len(r['mutants'])} mutants")
            continue
        print(f"mutation: {name} ...", flush=True)
        r = retest_survivors(name) if args.survivors else run_target(name)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(r, indent=1) + "\n")
        c, _ = classify(r)
        print(f"mutation: {name}: {len(r['mutants'])} mutants, {c} score {100 * score(c):.1f} % "
              f"in {r.get('seconds_survivors_retest', r['seconds']):.0f} s", flush=True)
    if args.list:
        return 0
    ok = write_report()
    print(f"mutation: report written to {REPORT.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
