"""The checks of tests/sharded/test_distributed_jax.py, run in ONE subprocess with 4 host-platform devices.

``XLA_FLAGS=--xla_force_host_platform_device_count=4`` must be set before JAX is imported, so these checks cannot
run in pytest's own process (which may have imported JAX with one device).  ``python -m
tests.support.distributed_jax_checks OUT.json`` (from the repository root; ``DISTRIBUTED_JAX_CHECKS=name,name``
runs a subset) runs every check in :data:`CHECKS` and writes ``{name: {"status": "pass" | "fail" | "skip", "detail":
text}}``; the pytest file turns each entry into one test.  This module imports neither JAX nor the project at
import time, so pytest can read :data:`CHECKS` without starting JAX.

Everything runs in float64 / complex128 (x64 on in the subprocess) against ``jax_impl.attn_reference`` on one
device.  Tolerances: two float64 computations of the same sums in different orders (blocks, shards): rounding only.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

DEVICES = 4
CHECKS = {}                      # name -> function(ctx) raising AssertionError (fail) or Skip (skip)


class Skip(Exception):
    """The installed JAX cannot express this check; the message says why."""


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


TOL = dict(rtol=1e-10, atol=1e-11)
COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")


class Ctx:
    """The lazily imported modules and shared helpers handed to every check."""

    def __init__(self):
        import jax
        import jax.numpy as jnp
        import numpy as np

        import jax_impl
        from jax_impl.sharded import layouts, ring

        self.jax, self.jnp, self.np, self.jax_impl, self.ring, self.layouts = jax, jnp, np, jax_impl, ring, layouts
        self.P = jax.sharding.PartitionSpec
        self.mesh = jax.sharding.Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
        self.explicit = hasattr(jax.sharding, "AxisType") and hasattr(jax, "make_mesh")

    def inputs(self, n, d=3, e=5, complex_=False, seed=0):
        rng = self.np.random.default_rng(seed)

        def draw(*shape):
            x = rng.standard_normal(shape)
            if complex_:
                x = x + 1j * rng.standard_normal(shape)
            return self.jnp.asarray(x)

        return draw(n, d), draw(n, d), draw(n, e)

    def cotangent(self, n, e, complex_=False, seed=1):
        q, _, v = self.inputs(n, n, e, complex_, seed)              # q (n, n) is G_A's shape, v (n, e) G_O's
        return self.jax_impl.AttnOutput(v, q)

    def close(self, got, want, what):
        jax, np = self.jax, self.np
        got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
        assert len(got_leaves) == len(want_leaves), f"{what}: {len(got_leaves)} leaves, want {len(want_leaves)}"
        for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            assert g.shape == w.shape, f"{what}[{i}]: shape {g.shape}, want {w.shape}"
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), err_msg=f"{what}[{i}]", **TOL)

    def vjp_all(self, f, q, k, v, ct):
        return self.jax.vjp(f, q, k, v)[1](ct)

    def counts(self, f, *args):
        """Collective ops in the compiled HLO of ``jit(f)(*args)``: ``{"all-reduce": 1, ...}`` (async pairs
        counted once, by their ``-start``)."""
        text = self.jax.jit(f).lower(*args).compile().as_text()
        found = re.findall(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", text)
        return {c: found.count(c) for c in COLLECTIVES}

    def all_reduce_shapes(self, f, *args):
        """The shapes of the arrays the all-reduces of ``jit(f)(*args)``'s compiled HLO sum, sorted:
        ``[(3, 8), (5, 8)]`` for ``%all-reduce = (f64[3,8]{1,0}, f64[5,8]{1,0}) all-reduce(...)``."""
        text = self.jax.jit(f).lower(*args).compile().as_text()
        results = re.findall(r"=\s*(\(.*?\)|\S+)\s+all-reduce(?:-start)?\(", text)
        return sorted(tuple(int(x) for x in dims.split(",") if x)
                      for result in results for dims in re.findall(r"[a-z]+\d+\[([\d,]*)\]", result))


def _losses(ctx):
    jnp = ctx.jnp
    both = lambda out: jnp.sum(jnp.abs(out.o) ** 2) + jnp.sum(jnp.sin(out.a.real))
    o_only = lambda out: jnp.sum(jnp.abs(out.o) ** 2)               # a unused: a symbolic-zero cotangent
    a_only = lambda out: jnp.sum(jnp.sin(out.a.real))               # o unused
    return {"both": both, "o_only": o_only, "a_only": a_only}


def _grads(ctx, f, loss):
    return ctx.jax.grad(lambda q, k, v: loss(f(q, k, v)), argnums=(0, 1, 2))


def _grad_of_grad(ctx, f):
    jax, jnp = ctx.jax, ctx.jnp
    inner = _grads(ctx, f, _losses(ctx)["both"])
    return jax.grad(lambda q, k, v: sum(jnp.sum(jnp.abs(g) ** 2) for g in inner(q, k, v)), argnums=(0, 1, 2))


# --- 1. jax_impl.attn / attn_jvp under jit with NamedSharding -----------------------------------------------------

JIT_LAYOUTS = {"rows": ("x", None, None), "keys": (None, "x", "x"), "all": ("x", "x", "x")}


def _mesh(ctx, kind):
    jax = ctx.jax
    if kind == "auto":
        return ctx.mesh                                             # Mesh(...): Auto axes in every release
    if not ctx.explicit:
        raise Skip(f"JAX {jax.__version__} has no explicit mesh axes (jax.sharding.AxisType)")
    return jax.make_mesh((DEVICES,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


def _placed(ctx, mesh, layout, arrays):
    jax, P = ctx.jax, ctx.P
    specs = [P(s) if s else P() for s in JIT_LAYOUTS[layout]]
    return [jax.device_put(x, jax.sharding.NamedSharding(mesh, s)) for x, s in zip(arrays, specs)]


def _jit_check(ctx, kind, layout, full):
    jax, jnp, impl = ctx.jax, ctx.jnp, ctx.jax_impl
    mesh = _mesh(ctx, kind)
    n, d, e = 8, 4, 8                                               # every dimension divisible by 4
    q, k, v = ctx.inputs(n, d, e)
    args = _placed(ctx, mesh, layout, (q, k, v))
    ref = impl.attn_reference
    for fname, f in (("attn", impl.attn), ("attn_jvp", impl.attn_jvp)):
        what = f"{kind} {layout} {fname}"
        ctx.close(jax.jit(f)(*args), ref(q, k, v), what + " (o, a)")
        for lname, loss in _losses(ctx).items():
            if lname != "both" and not full:
                continue
            ctx.close(jax.jit(_grads(ctx, f, loss))(*args), _grads(ctx, ref, loss)(q, k, v), f"{what} grad {lname}")
        if not full:
            continue
        ct = ctx.cotangent(n, e)
        ctx.close(jax.jit(lambda q, k, v: ctx.vjp_all(f, q, k, v, ct))(*args), ctx.vjp_all(ref, q, k, v, ct),
                  what + " vjp")
        ctx.close(jax.jit(_grad_of_grad(ctx, f))(*args), _grad_of_grad(ctx, ref)(q, k, v), what + " grad of grad")
        batch = lambda q, k, v: (jnp.stack([q, 2 * q]), jnp.stack([k, -k]), jnp.stack([v, v]))
        ctx.close(jax.jit(lambda *a: jax.vmap(f)(*batch(*a)))(*args), jax.vmap(ref)(*batch(q, k, v)), what + " vmap")
        if fname == "attn_jvp":
            tangents = (0.5 * q, k, 2.0 * v)
            ctx.close(jax.jit(lambda q, k, v: jax.jvp(f, (q, k, v), tangents))(*args),
                      jax.jvp(ref, (q, k, v), tangents), what + " jvp")


@check
def jit_explicit_rows(ctx):
    _jit_check(ctx, "explicit", "rows", full=True)


@check
def jit_explicit_keys(ctx):
    _jit_check(ctx, "explicit", "keys", full=False)


@check
def jit_explicit_all(ctx):
    _jit_check(ctx, "explicit", "all", full=False)


@check
def jit_auto_rows(ctx):
    _jit_check(ctx, "auto", "rows", full=False)


@check
def jit_auto_all(ctx):
    _jit_check(ctx, "auto", "all", full=False)


@check
def jit_rows_collectives(ctx):
    """jit, q over rows, k and v replicated: forward and G_Q without a collective; G_K, G_V are sums over the
    row blocks (35), one all-reduce (two on XLA releases that do not combine them)."""
    jax = ctx.jax
    kinds = ["auto"] + (["explicit"] if ctx.explicit else [])
    for kind in kinds:
        args = _placed(ctx, _mesh(ctx, kind), "rows", ctx.inputs(8))         # n, d, e = 8, 3, 5: all distinct,
        # so the all-reduce shapes below tell (d, n) from (n, d)
        loss = _losses(ctx)["both"]
        fwd = ctx.counts(ctx.jax_impl.attn, *args)
        assert sum(fwd.values()) == 0, f"{kind} forward: {fwd}"
        grad_q = ctx.counts(jax.grad(lambda q, k, v: loss(ctx.jax_impl.attn(q, k, v))), *args)
        assert sum(grad_q.values()) == 0, f"{kind} grad q: {grad_q}"
        grads = ctx.counts(_grads(ctx, ctx.jax_impl.attn, loss), *args)
        assert 1 <= grads["all-reduce"] <= 2 and sum(grads.values()) == grads["all-reduce"], f"{kind} grads: {grads}"
        # (21) and (22) as (Qᵀ G_X)ᵀ and (G_Oᵀ A)ᵀ: the sums over q's row blocks run on the (d, n) and (e, n)
        # products, which read G_X and A by rows (docs/distributed-jax.md), not on their (n, d), (n, e) transposes
        shapes = ctx.all_reduce_shapes(_grads(ctx, ctx.jax_impl.attn, loss), *args)
        assert shapes == [(3, 8), (5, 8)], f"{kind} grads all-reduce: {shapes}"


# --- 2. the block inside shard_map ---------------------------------------------------------------------------------

@check
def block_in_shard_map(ctx):
    """The user's own shard_map, rows layout: attn_block on local shards (q (2, d) against k (8, d)) with the
    checker on; o, a, every gradient and the JVP (attn_block_jvp)."""
    jax, P, impl = ctx.jax, ctx.P, ctx.jax_impl
    from jax_impl.sharded import rules
    q, k, v = ctx.inputs(8)
    specs, out = (P("x"), P(), P()), impl.AttnOutput(P("x"), P("x"))
    for f in (impl.attn_block, impl.attn_block_jvp):
        mapped = rules.shard_map(f, mesh=ctx.mesh, in_specs=specs, out_specs=out)
        ctx.close(jax.jit(mapped)(q, k, v), impl.attn_reference(q, k, v), f.__name__)
        for lname, loss in _losses(ctx).items():
            ctx.close(jax.jit(_grads(ctx, mapped, loss))(q, k, v), _grads(ctx, impl.attn_reference, loss)(q, k, v),
                      f"{f.__name__} grad {lname}")
    mapped = rules.shard_map(impl.attn_block_jvp, mesh=ctx.mesh, in_specs=specs, out_specs=out)
    tangents = (0.5 * q, k, 2.0 * v)
    ctx.close(jax.jit(lambda *p: jax.jvp(mapped, p, tangents))(q, k, v),
              jax.jvp(impl.attn_reference, (q, k, v), tangents), "attn_block_jvp jvp")


@check
def block_contract_in_shard_map(ctx):
    """Inside shard_map the lab's attn refuses the local block (its same-n contract; block_in_shard_map: attn_block
    takes it)."""
    P, impl = ctx.P, ctx.jax_impl
    from jax_impl.sharded import rules
    q, k, v = ctx.inputs(8)
    mapped = rules.shard_map(impl.attn, mesh=ctx.mesh, in_specs=(P("x"), P(), P()),
                                out_specs=impl.AttnOutput(P("x"), P("x")))
    try:
        mapped(q, k, v)
    except ValueError as err:
        assert str(err).startswith("attn(): q, k and v must have the same first dimension n"), str(err)
    else:
        raise AssertionError("attn accepted q (2, 3) with k (8, 3)")


# --- 3. the layouts of jax_impl.sharded.layouts ---------------------------------------------------------------------

def _layout_check(ctx, layout, n, complex_=False, full=True):
    """o, a and the VJP with both cotangents; with ``full``, also each loss (one output unused) and grad of
    grad."""
    jax, impl = ctx.jax, ctx.jax_impl
    f = lambda q, k, v: ctx.layouts.LAYOUTS[layout](q, k, v, mesh=ctx.mesh)
    ref = impl.attn_reference
    q, k, v = ctx.inputs(n, complex_=complex_)
    what = f"{layout} n={n}{' complex' if complex_ else ''}"
    ctx.close(jax.jit(f)(q, k, v), ref(q, k, v), what + " (o, a)")
    ct = ctx.cotangent(n, 5, complex_)
    ctx.close(jax.jit(lambda q, k, v: ctx.vjp_all(f, q, k, v, ct))(q, k, v), ctx.vjp_all(ref, q, k, v, ct),
              what + " vjp")
    if not full:
        return
    for lname, loss in _losses(ctx).items():
        ctx.close(jax.jit(_grads(ctx, f, loss))(q, k, v), _grads(ctx, ref, loss)(q, k, v), f"{what} grad {lname}")
    ctx.close(jax.jit(_grad_of_grad(ctx, f))(q, k, v), _grad_of_grad(ctx, ref)(q, k, v), what + " grad of grad")


@check
def rows_layout(ctx):
    _layout_check(ctx, "rows", 8)


@check
def ring_layout(ctx):
    _layout_check(ctx, "ring", 8)


@check
def ring_not_divisible(ctx):
    """n = 10 on 4 devices: zero-padded to 12 and cut back (exact)."""
    _layout_check(ctx, "ring", 10, full=False)
    _layout_check(ctx, "rows", 10, full=False)


@check
def layouts_empty(ctx):
    _layout_check(ctx, "ring", 0, full=False)
    _layout_check(ctx, "rows", 0, full=False)


@check
def ring_complex(ctx):
    _layout_check(ctx, "ring", 8, complex_=True, full=False)
    _layout_check(ctx, "rows", 8, complex_=True, full=False)


@check
def ring_jvp(ctx):
    """attn_ring_jvp: forward mode (all tangents; q's alone) and reverse mode by transposition, against the
    reference; the JVP moves k/v and their tangents: 2 (P - 1) collective-permutes, nothing else."""
    jax, impl = ctx.jax, ctx.jax_impl
    f = lambda q, k, v: ctx.layouts.ring_attn_jvp(q, k, v, mesh=ctx.mesh)
    ref = impl.attn_reference
    q, k, v = ctx.inputs(8)
    tangents = (0.5 * q, k, 2.0 * v)
    jvp = lambda f: (lambda q, k, v: jax.jvp(f, (q, k, v), tangents))
    ctx.close(jax.jit(jvp(f))(q, k, v), jvp(ref)(q, k, v), "jvp")
    jvp_q = lambda f: (lambda q, k, v: jax.jvp(lambda q: f(q, k, v), (q,), (tangents[0],)))
    ctx.close(jax.jit(jvp_q(f))(q, k, v), jvp_q(ref)(q, k, v), "jvp, q's tangent only")
    loss = _losses(ctx)["both"]
    ctx.close(jax.jit(_grads(ctx, f, loss))(q, k, v), _grads(ctx, ref, loss)(q, k, v), "grad by transposition")
    counts = ctx.counts(jvp(f), q, k, v)
    assert counts == dict.fromkeys(COLLECTIVES, 0) | {"collective-permute": 2 * (DEVICES - 1)}, counts


@check
def layouts_on_explicit_mesh(ctx):
    """The layouts on a mesh of Explicit axes (jax.make_mesh's default), whose shard_map needs inputs typed like
    its in_specs and whose slices must keep whole shards: q over rows with k, v replicated, and n = 10 on 4."""
    jax, impl = ctx.jax, ctx.jax_impl
    mesh = _mesh(ctx, "explicit")
    loss = _losses(ctx)["both"]
    for n, layout in ((8, "rows"), (10, "all")):
        q, k, v = ctx.inputs(n)
        args = _placed(ctx, mesh, layout, (q, k, v)) if n % DEVICES == 0 else (q, k, v)
        for name in ("rows", "ring"):
            f = lambda q, k, v: ctx.layouts.LAYOUTS[name](q, k, v, mesh=mesh)
            ctx.close(jax.jit(_grads(ctx, f, loss))(*args), _grads(ctx, impl.attn_reference, loss)(q, k, v),
                      f"{name} n={n} explicit")


@check
def layouts_vmap(ctx):
    """jax.vmap over a batch of two problems: the shard_map inside is batched, forward and gradients."""
    jax, jnp, impl = ctx.jax, ctx.jnp, ctx.jax_impl
    q, k, v = ctx.inputs(8)
    batch = (jnp.stack([q, 2 * q]), jnp.stack([k, -k]), jnp.stack([v, v]))
    loss = _losses(ctx)["both"]
    for layout in ("rows", "ring"):
        f = lambda q, k, v: ctx.layouts.LAYOUTS[layout](q, k, v, mesh=ctx.mesh)
        ctx.close(jax.jit(jax.vmap(f))(*batch), jax.vmap(impl.attn_reference)(*batch), layout + " vmap")
        ctx.close(jax.jit(jax.vmap(_grads(ctx, f, loss)))(*batch),
                  jax.vmap(_grads(ctx, impl.attn_reference, loss))(*batch), layout + " vmap of grad")


@check
def layouts_vmap_batch_on_ring_axis(ctx):
    """jax.vmap over a batch sharded along the ring's own Explicit axis: the axis is vmapped away, so the entries
    run the whole op per problem (data parallel; JAX refuses a shard_map over that axis).  Forward, gradients
    (grad of vmap, vmap of grad), grad of grad, and attn_ring_jvp's forward mode."""
    jax, jnp, impl = ctx.jax, ctx.jnp, ctx.jax_impl
    mesh = _mesh(ctx, "explicit")
    sharded = jax.sharding.NamedSharding(mesh, ctx.P("x"))
    batch = [jnp.stack(xs) for xs in zip(*(ctx.inputs(3, e=2, seed=i) for i in range(DEVICES)))]
    args = [jax.device_put(x, sharded) for x in batch]
    ref = jax.vmap(impl.attn_reference)
    loss = _losses(ctx)["both"]
    for name, layout in ctx.layouts.LAYOUTS.items():
        f = jax.vmap(lambda q, k, v: layout(q, k, v, mesh=mesh))
        ctx.close(jax.jit(f)(*args), ref(*batch), name + " vmap, batch on the ring axis")
        ctx.close(jax.jit(_grads(ctx, f, loss))(*args), _grads(ctx, ref, loss)(*batch), name + " grad of vmap")
        if name == "ring":
            per_problem = lambda g: jax.vmap(_grads(ctx, g, loss))
            ctx.close(jax.jit(per_problem(lambda q, k, v: layout(q, k, v, mesh=mesh)))(*args),
                      per_problem(impl.attn_reference)(*batch), name + " vmap of grad")
        if name == "rows":
            ctx.close(jax.jit(_grad_of_grad(ctx, f))(*args), _grad_of_grad(ctx, ref)(*batch), name + " grad of grad")
        if name == "ring_jvp":
            tangents = tuple(0.5 * x for x in batch)
            ctx.close(jax.jit(lambda *p: jax.jvp(f, p, tangents))(*args), jax.jvp(ref, tuple(batch), tangents),
                      name + " jvp")


@check
def layouts_vmap_2d_explicit_mesh(ctx):
    """jax.vmap on a 2-D Explicit mesh: the batch on "dp", the rows on "sp".  Forward, grad, and grad of grad of
    every layout (before: grad of grad of vmap(attn_rows) raised JAX's "Closing over inputs to shard_map ... not
    implemented", since the rules wrapped the per-example formulas in auto_axes over "dp", an axis no dimension of
    theirs uses), and ring_attn_jvp's forward mode."""
    jax, jnp, impl = ctx.jax, ctx.jnp, ctx.jax_impl
    if not ctx.explicit:
        raise Skip(f"JAX {jax.__version__} has no explicit mesh axes (jax.sharding.AxisType)")
    mesh = jax.make_mesh((2, DEVICES // 2), ("dp", "sp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    batch = [jnp.stack(xs) for xs in zip(*(ctx.inputs(4, e=2, seed=i) for i in range(2)))]
    args = [jax.device_put(x, jax.sharding.NamedSharding(mesh, ctx.P("dp"))) for x in batch]
    ref = jax.vmap(impl.attn_reference)
    loss = _losses(ctx)["both"]
    for name, layout in ctx.layouts.LAYOUTS.items():
        f = jax.vmap(lambda q, k, v: layout(q, k, v, mesh=mesh, axis="sp"))
        ctx.close(jax.jit(f)(*args), ref(*batch), name + " vmap on dp, rows on sp")
        ctx.close(jax.jit(_grads(ctx, f, loss))(*args), _grads(ctx, ref, loss)(*batch), name + " grad (2-D)")
        ctx.close(jax.jit(_grad_of_grad(ctx, f))(*args), _grad_of_grad(ctx, ref)(*batch), name + " grad of grad (2-D)")
        if name == "ring_jvp":
            tangents = tuple(0.5 * x for x in batch)
            ctx.close(jax.jit(lambda *p: jax.jvp(f, p, tangents))(*args), jax.jvp(ref, tuple(batch), tangents),
                      name + " jvp (2-D)")


@check
def ring_local_in_user_shard_map(ctx):
    """ring_attn_local inside the caller's own shard_map, in a loss computed there: the same numbers."""
    jax, jnp, P, impl = ctx.jax, ctx.jnp, ctx.P, ctx.jax_impl
    from jax_impl.sharded import ring, rules
    q, k, v = ctx.inputs(8)

    def local_loss(q, k, v):
        out = ring.ring_attn_local(q, k, v, "x")
        return jax.lax.psum(jnp.sum(out.o ** 2) + jnp.sum(jnp.sin(out.a)), "x")

    mapped = rules.shard_map(local_loss, mesh=ctx.mesh, in_specs=(P("x"),) * 3, out_specs=P())
    ctx.close(jax.jit(jax.grad(mapped, argnums=(0, 1, 2)))(q, k, v),
              _grads(ctx, impl.attn_reference, _losses(ctx)["both"])(q, k, v), "grad through the user's shard_map")


def _pullback_counts(ctx, f, q, k, v, ct):
    """Collectives of the backward alone: the pullback jitted by itself (compiled with the forward, XLA may
    reuse the forward's received k/v blocks instead of passing them again)."""
    _, pullback = ctx.jax.vjp(f, q, k, v)
    return ctx.counts(pullback, ct)


@check
def ring_collectives(ctx):
    """The ring: P - 1 collective-permutes forward, P + 1 backward (the torch ring's schedule: P - 1 k/v blocks and
    P accumulator blocks, each block's sums in the hop of the next k/v block), nothing else: no all-gather of k or
    v, no all-reduce."""
    f = lambda q, k, v: ctx.layouts.ring_attn(q, k, v, mesh=ctx.mesh)
    q, k, v = ctx.inputs(8)
    fwd = ctx.counts(f, q, k, v)
    assert fwd == dict.fromkeys(COLLECTIVES, 0) | {"collective-permute": DEVICES - 1}, f"forward: {fwd}"
    bwd = _pullback_counts(ctx, f, q, k, v, ctx.cotangent(8, 5))
    assert bwd == dict.fromkeys(COLLECTIVES, 0) | {"collective-permute": DEVICES + 1}, f"backward: {bwd}"


@check
def rows_collectives(ctx):
    """shard_map rows: forward none; backward with a cotangent: G_K and G_V summed over the row blocks (35) in
    one all-reduce (two where XLA does not combine them); G_Q alone: none."""
    jax = ctx.jax
    f = lambda q, k, v: ctx.layouts.attn_rows(q, k, v, mesh=ctx.mesh)
    q, k, v = ctx.inputs(8)
    fwd = ctx.counts(f, q, k, v)
    assert sum(fwd.values()) == 0, f"forward: {fwd}"
    bwd = _pullback_counts(ctx, f, q, k, v, ctx.cotangent(8, 5))
    assert 1 <= bwd["all-reduce"] <= 2 and sum(bwd.values()) == bwd["all-reduce"], f"backward: {bwd}"
    # rules.match_vma casts the transposed matrices, so the psum runs on G_Kᵀ (d, n) and G_Vᵀ (e, n); a JAX
    # without vma types (before 0.6: no jax.lax.pcast) casts nothing and shard_map sums G_K, G_V as they are
    shapes = ctx.all_reduce_shapes(ctx.jax.vjp(f, q, k, v)[1], ctx.cotangent(8, 5))
    casts = hasattr(jax, "typeof") and hasattr(jax.lax, "pcast")
    assert shapes == ([(3, 8), (5, 8)] if casts else [(8, 3), (8, 5)]), f"backward all-reduce: {shapes}"
    grad_q = ctx.counts(jax.grad(lambda q, k, v: _losses(ctx)["both"](f(q, k, v))), q, k, v)
    assert sum(grad_q.values()) == 0, f"grad q only: {grad_q}"


@check
def check_vma_true(ctx):
    """attn_block and the ring in a user's ``jax.shard_map(..., check_vma=True)``: the cotangents have their
    primals' varying types (without ``rules.match_vma`` the rows layout raises "Custom VJP bwd rule must
    produce an output with the same type")."""
    jax, P, impl = ctx.jax, ctx.P, ctx.jax_impl
    if not hasattr(jax, "shard_map"):
        raise Skip(f"JAX {jax.__version__}: no jax.shard_map / check_vma; its check_rep=True has no rule for "
                   "custom_vjp (NotImplementedError), so jax_impl maps with check_rep=False there")
    q, k, v = ctx.inputs(8)
    loss = _losses(ctx)["both"]
    want = _grads(ctx, impl.attn_reference, loss)(q, k, v)
    for name, f, specs in (("attn_block", impl.attn_block, (P("x"), P(), P())),
                           ("ring", lambda q, k, v: ctx.ring.ring_attn_local(q, k, v, "x"), (P("x"),) * 3)):
        mapped = jax.shard_map(f, mesh=ctx.mesh, in_specs=specs, out_specs=impl.AttnOutput(P("x"), P("x")),
                               check_vma=True)
        ctx.close(jax.jit(_grads(ctx, mapped, loss))(q, k, v), want, name + " under check_vma=True")


def main(path):
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    import jax
    jax.config.update("jax_enable_x64", True)
    ctx = Ctx()
    only = os.environ.get("DISTRIBUTED_JAX_CHECKS")
    results = {}
    for name, fn in CHECKS.items():
        if only and name not in only.split(","):
            continue
        start = time.perf_counter()
        try:
            fn(ctx)
            results[name] = {"status": "pass", "detail": ""}
        except Skip as why:
            results[name] = {"status": "skip", "detail": str(why)}
        except Exception as err:                                    # noqa: BLE001 -- reported to pytest as a failure
            results[name] = {"status": "fail",
                             "detail": f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"}
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
        print(name, results[name]["status"], results[name]["seconds"], flush=True)
    with open(path, "w") as fh:
        json.dump({"jax": jax.__version__, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
