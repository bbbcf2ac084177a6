"""JAX on 4 host-platform devices: jax_impl.attn / attn_jvp under jit with NamedSharding (Auto and Explicit
axes), attn_block inside shard_map, and the layouts of jax_impl.sharded.layouts (rows, ring), in float64 against
attn_reference, with collective counts read from the compiled HLO.

The checks live in tests/support/distributed_jax_checks.py and run in ONE subprocess (XLA_FLAGS must be set
before JAX is imported; one process compiles once per shape), with a timeout; each check is reported here as
its own test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, require_jax

require_jax()

from tests.support import distributed_jax_checks  # noqa: E402  (imports neither JAX nor the project)

TIMEOUT = 600


# The two heaviest checks (vmap of the layouts over a batch on the ring's mesh axis and on a 2-D Explicit mesh,
# 15 s of the subprocess's 47 s on 2 cores) run in the slow tier (pyproject.toml; CI's tier line); layouts_vmap,
# vmap of every layout, stays in the README's test command.  So do two whose subject a lighter check covers: the
# ring at n not divisible by P (ring_layout, and tests/sharded/test_jax_fixes.py's padded n = 1, 3 on P = 4) and
# the layouts on an Explicit mesh (jit_explicit_*, and the fixes' Explicit-axes grads), 4.5 s more.
SLOW = ("layouts_vmap_batch_on_ring_axis", "layouts_vmap_2d_explicit_mesh", "ring_not_divisible",
        "layouts_on_explicit_mesh")
DEFAULT = tuple(name for name in distributed_jax_checks.CHECKS if name not in SLOW)


def _run_checks(tmp_path_factory, names) -> dict:
    """The checks ``names`` in one subprocess on DEVICES host-platform devices: their results by name."""
    out = tmp_path_factory.mktemp("distributed_jax") / "results.json"
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={distributed_jax_checks.DEVICES}",
               DISTRIBUTED_JAX_CHECKS=",".join(names))
    proc = subprocess.run([sys.executable, "-m", "tests.support.distributed_jax_checks", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == sorted(names), "a check did not run"
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _run_checks(tmp_path_factory, DEFAULT)


@pytest.fixture(scope="module")
def slow_results(tmp_path_factory):
    return _run_checks(tmp_path_factory, SLOW)


def _verdict(result):
    if result["status"] == "skip":
        pytest.skip(result["detail"])
    assert result["status"] == "pass", result["detail"]


@pytest.mark.parametrize("name", DEFAULT)
def test_distributed_jax(results, name):
    _verdict(results[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_distributed_jax_slow(slow_results, name):
    _verdict(slow_results[name])


def test_the_slow_checks_are_checks():
    assert set(SLOW) <= set(distributed_jax_checks.CHECKS)


# --- in this process (one device): the block contract and the layouts' argument errors ---------------------------

def test_attn_block_takes_m_rows_against_n_keys():
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_impl

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((5, 3), (7, 3), (7, 2)))
    out = jax_impl.attn_block(q[:2], k, v)                           # rows 0-1 of the whole op
    want = jax_impl.attn_reference(jnp.concatenate([q, jnp.zeros((2, 3))]), k, v)  # padded to the lab's n = 7
    np.testing.assert_allclose(out.o, want.o[:2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.a, want.a[:2], rtol=1e-5, atol=1e-6)
    grads = jax.grad(lambda k: jnp.sum(jax_impl.attn_block_jvp(q[:2], k, v).o))(k)
    assert grads.shape == k.shape


def test_attn_block_rejects_kv_rows_mismatch_before_compute():
    import jax.numpy as jnp

    import jax_impl
    from attn_contract import message

    with pytest.raises(ValueError) as err:
        jax_impl.attn_block(jnp.ones((2, 3)), jnp.ones((4, 3)), jnp.ones((5, 2)))
    assert str(err.value) == message("kv_rows", fn="attn_block", k=(4, 3), v=(5, 2))


def test_layouts_name_a_missing_mesh_axis():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_impl.sharded import layouts

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("y",))
    for layout in layouts.LAYOUTS.values():
        with pytest.raises(ValueError, match=r"mesh has no axis 'x'; its axes are \('y',\)"):
            layout(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 4)), mesh=mesh, axis="x")
