"""A crosscheck step in a fresh interpreter: what ``--shards`` (its gloo ranks / JAX host devices) and ``--kernels``
(Triton under ``TRITON_INTERPRET=1``) need, since both must set the environment before torch / JAX / triton load.

``run_child(entry, args, payload, what, timeout, env)`` pickles ``payload`` into a temporary folder, runs
``entry(*args, payload_path, out_path)`` in ``sys.executable`` from the repository root with this package first on
``PYTHONPATH`` (``entry``: a module-level function, imported in the child by its ``__module__`` and ``__name__``),
and returns the pickle the child wrote to ``out_path``.  A child past ``timeout`` seconds, one that exits non-zero
or writes nothing, is a ``UsageError`` naming ``what`` with the last lines it printed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from typing import Callable, Dict, Optional, Sequence

from .errors import UsageError

__all__ = ["ROOT", "run_child"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(entry: Callable[..., None], args: Sequence[str], payload: object, what: str, timeout: float,
              env: Optional[Dict[str, str]] = None) -> object:
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
