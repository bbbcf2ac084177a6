"""JAX on 4 host-platform devices: jax_impl.attn / attn_jvp under jit with NamedSharding (Auto and Explicit
axes), attn_block inside shard_map, and the layouts of jax_impl.ring (rows, ring), in float64 against
attn_reference, with collective counts read from the compiled HLO.

The checks live in tests/distributed_jax_checks.py and run in ONE subprocess (XLA_FLAGS must be set before JAX is
imported; one process compiles once per shape), with a timeout; each check is reported here as its own test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import distributed_jax_checks  # noqa: E402  (imports neither JAX nor the project)

TIMEOUT = 600


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed_jax") / "results.json"
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={distributed_jax_checks.DEVICES}",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p]))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "distributed_jax_checks.py"), str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())["results"]


@pytest.mark.parametrize("name", list(distributed_jax_checks.CHECKS))
def test_distributed_jax(results, name):
    result = results[name]
    if result["status"] == "skip":
        pytest.skip(result["detail"])
    assert result["status"] == "pass", result["detail"]
