"""XLA CPU miscompile: wrong gradients from a shard_map ring whose padded output is constrained to replicated and
sliced (plain JAX, no project code).

Fails (G_K off by 0.39, G_V by 0.22; G_Q right) on jax / jaxlib 0.10.2, CPU, 4 host devices, float64.  Right with
any one of: XLA_FLAGS+=--xla_cpu_use_fusion_emitters=false; the hops not packed into one buffer (one ppermute
per array); no sharding constraint on the padded output before the slice; n divisible by 4; e >= 2; d = 1;
argnums without q.  The optimized HLO reads correctly, so the emitted CPU kernels are the suspects.

    python docs/upstream-repros/xla_cpu_ring_pad_cut.py      # prints the max errors; non-zero exit when wrong
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 " + os.environ.get("XLA_FLAGS", "")
import jax                                                   # noqa: E402
import jax.numpy as jnp                                      # noqa: E402
import numpy as np                                           # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P   # noqa: E402

jax.config.update("jax_enable_x64", True)
S = 4
mesh = jax.sharding.Mesh(np.array(jax.devices()[:S]), ("x",))   # Auto axes; an Explicit mesh with reshard fails too


def hop(*arrays):                         # one collective-permute carrying the arrays side by side
    packed = jax.lax.ppermute(jnp.concatenate(arrays, axis=1), "x", [(i, (i + 1) % S) for i in range(S)])
    return tuple(jnp.split(packed, [arrays[0].shape[1]], axis=1))


def forward(q, k, v):                     # o_I = sum_J tanh(q_I k_J^T) v_J round the ring; a_I kept for backward
    me, w = jax.lax.axis_index("x"), k.shape[0]
    o, a_rows = 0.0, jnp.zeros((q.shape[0], S * w))
    for s in range(S):
        a = jnp.tanh(q @ k.T)
        o = o + a @ v
        a_rows = jax.lax.dynamic_update_slice_in_dim(a_rows, a, ((me - s) % S) * w, axis=1)
        k, v = hop(k, v)
    return o, a_rows


@jax.custom_vjp
def ring(q, k, v):
    return forward(q, k, v)[0]


def ring_fwd(q, k, v):
    o, a_rows = forward(q, k, v)
    return o, (q, k, v, a_rows)


def ring_bwd(res, g):                     # the k/v blocks travel again, with their gradient accumulators
    q, k, v, a_rows = res
    me, w = jax.lax.axis_index("x"), k.shape[0]
    gq, gk, gv = 0.0, jnp.zeros_like(k), jnp.zeros_like(v)
    for s in range(S):
        a = jax.lax.dynamic_slice_in_dim(a_rows, ((me - s) % S) * w, w, axis=1)
        gx = (g @ v.T) * (1 - a * a)
        gq = gq + gx @ k
        gk, gv = hop(gk + gx.T @ q, gv + a.T @ g)
        k, v = hop(k, v)
    return gq, gk, gv


ring.defvjp(ring_fwd, ring_bwd)


def sharded(q, k, v):
    n = q.shape[0]
    q, k, v = (jnp.pad(x, ((0, -n % S), (0, 0))) for x in (q, k, v))
    o = jax.shard_map(ring, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=P("x"))(q, k, v)
    o = jax.lax.with_sharding_constraint(o, NamedSharding(mesh, P()))    # replicate, then cut the padding
    return o[:n]


rng = np.random.default_rng(0)
n, d, e = 3, 2, 1
q, k, v, w = (jnp.asarray(rng.standard_normal(s)) for s in ((n, d), (n, d), (n, e), (n, e)))
got = jax.jit(jax.grad(lambda q, k, v: jnp.sum(sharded(q, k, v) * w), argnums=(0, 1, 2)))(q, k, v)
want = jax.grad(lambda q, k, v: jnp.sum(jnp.tanh(q @ k.T) @ v * w), argnums=(0, 1, 2))(q, k, v)
errors = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(got, want)]
print(f"jax {jax.__version__}, max |error| of G_Q, G_K, G_V: {errors}")
sys.exit(1 if max(errors) > 1e-9 else 0)
