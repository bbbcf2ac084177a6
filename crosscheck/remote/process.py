"""The child process of a remote check (``crosscheck.remote``): started from the run (:func:`run_child`), and each
job run in it into an outcome (:func:`run_job`)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from typing import Callable, Dict, Optional, Sequence

from ..cases import Job
from ..errors import Raised, UsageError
from ..parts import Outcome

__all__ = ["ROOT", "run_child", "run_job"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(entry: Callable[..., None], args: Sequence[str], payload: object, what: str, timeout: float,
              env: Optional[Dict[str, str]] = None) -> object:
    """In the run: ``entry(*args, payload_path, out_path)`` in a fresh interpreter, and what it wrote.  ``entry``
    must be a module-level function of an importable module (the child imports it by name): anything else is a
    TypeError here, before any child starts."""
    if entry.__module__ in (None, "__main__") or getattr(entry, "__qualname__", None) != entry.__name__:
        raise TypeError(f"run_child: the entry must be a module-level function of an importable module, got "
                        f"{getattr(entry, '__qualname__', entry)!r} of {entry.__module__!r}")
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    module, function = entry.__module__, entry.__name__
    with tempfile.TemporaryDirectory(prefix="crosscheck-child-") as tmp:
        payload_path, out_path = os.path.join(tmp, "payload.pkl"), os.path.join(tmp, "results.pkl")
        with open(payload_path, "wb") as f:
            pickle.dump(payload, f)
        code = f"import sys; from {module} import {function}; {function}(*sys.argv[1:])"
        try:
            proc = subprocess.run([sys.executable, "-c", code, *args, payload_path, out_path], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise UsageError(f"{what} did not finish in {timeout:.0f} s") from None
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-12:]
            raise UsageError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))
        with open(out_path, "rb") as f:
            return pickle.load(f)


def run_job(executor, job: Job) -> Outcome:
    """In the child: the executor's results of ``job``, or the error (reported as that case's failure)."""
    try:
        return Outcome(results=executor.run(job))
    except Exception as exc:                           # noqa: BLE001 - reported as this case's failure
        return Outcome(error=Raised.of(exc))
