"""Issue 29, torch side: the block operator under ``torch.func`` and forward mode, complex second order on every
DTensor layout, and every refusal of the sharded entries decided alike on all ranks.

In this process: ``torch.ops.attn_lab.attn_block`` (q (m, d), k (n, d), v (n, e), m ≠ n, d ≠ e) under
``torch.func.jvp`` / ``vjp`` / ``grad`` / ``jacrev`` / ``jacfwd`` / ``hessian`` / ``vmap`` and
``torch.autograd.forward_ad``, against the same transforms of ``torch_impl.attn_reference`` on the block (the
whole op on zero-padded inputs, cut back to the block: zero key rows add nothing to o, zero query rows are
dropped).  On 2 gloo ranks (a short process-group timeout, so that a rank left waiting fails the test in seconds
instead of hanging it): ``create_graph=True`` then a second backward in complex128 on every rules layout,
including n < P and n not divisible by P, against autograd of ``attn_reference`` on the full tensors; and bad
inputs / refused requests, which must raise the same error on both ranks.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad
from torch.testing import assert_close

from tests.support import gloo
from tests.support.inputs import block_inputs, uniform

import torch_impl
from torch_impl.validation import message

BLOCK = torch.ops.attn_lab.attn_block
DTYPES = [torch.float64, torch.complex128]
PG_TIMEOUT_S = 10          # a collective waiting for a rank that raised fails after this, instead of 30 min
LAUNCH_TIMEOUT_S = 240


def block(q, k, v):
    return tuple(BLOCK(q, k, v))


def reference(q, k, v):
    """The block (32) through ``attn_reference``: pad q, k, v with zero rows to N = max(m, n), cut o to m rows
    and a to the block (m, n)."""
    m, n = q.shape[0], k.shape[0]
    size = max(m, n)
    pad = lambda t: torch.cat([t, t.new_zeros(size - t.shape[0], t.shape[1])])  # noqa: E731
    o, a = torch_impl.attn_reference(pad(q), pad(k), pad(v))
    return o[:m], a[:m, :n]


SHAPES = [(3, 5), (5, 3)]


# --- the block operator under torch.func and forward_ad --------------------------------------------------------
@pytest.mark.parametrize("m, n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_func_jvp_matches_reference(m, n, dtype):
    primals = block_inputs(m, n, d=4, dtype=dtype)
    tangents = block_inputs(m, n, d=4, dtype=dtype, seed=1)
    out, tan = torch.func.jvp(block, primals, tangents)
    ref_out, ref_tan = torch.func.jvp(reference, primals, tangents)
    assert_close(out, ref_out)
    assert_close(tan, ref_tan)
    assert min(float(t.abs().max()) for t in tan) > 0.1             # not the zeros a dropped tangent gives


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_ad_matches_reference(dtype):
    """The hand-written JVP (36) = (14)-(16) through ``BlockFunction.jvp``: all tangents, and some absent."""
    primals = block_inputs(3, 5, d=4, dtype=dtype)
    tangents = block_inputs(3, 5, d=4, dtype=dtype, seed=1)
    for given in ((True, True, True), (False, False, True), (True, False, False)):
        tan = tuple(t if g else torch.zeros_like(t) for t, g in zip(tangents, given))
        expected = torch.func.jvp(reference, primals, tan)[1]
        with forward_ad.dual_level():
            duals = [forward_ad.make_dual(p, t) if g else p for p, t, g in zip(primals, tangents, given)]
            got = [forward_ad.unpack_dual(x).tangent for x in block(*duals)]
        assert_close(got, list(expected))


@pytest.mark.parametrize("m, n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_func_vjp_and_grad_match_reference(m, n, dtype):
    primals = block_inputs(m, n, d=4, dtype=dtype)
    cot = tuple(uniform(*t.shape, dtype=dtype, g=torch.Generator().manual_seed(2)) for t in reference(*primals))
    assert_close(torch.func.vjp(block, *primals)[1](cot), torch.func.vjp(reference, *primals)[1](cot))

    def loss(f):
        return lambda *x: sum((t * c.conj()).real.sum() for t, c in zip(f(*x), cot))
    assert_close(torch.func.grad(loss(block), argnums=(0, 1, 2))(*primals),
                 torch.func.grad(loss(reference), argnums=(0, 1, 2))(*primals))


@pytest.mark.parametrize("m, n", SHAPES)
def test_jacrev_jacfwd_hessian_vmap_match_reference(m, n):
    primals = block_inputs(m, n, d=4)
    assert_close(torch.func.jacrev(block, argnums=(0, 1, 2))(*primals),
                 torch.func.jacrev(reference, argnums=(0, 1, 2))(*primals))
    assert_close(torch.func.jacfwd(block, argnums=(0, 1, 2))(*primals),
                 torch.func.jacfwd(reference, argnums=(0, 1, 2))(*primals))
    q, k, v = primals
    assert_close(torch.func.hessian(lambda k: block(q, k, v)[0].sum())(k),
                 torch.func.hessian(lambda k: reference(q, k, v)[0].sum())(k))
    stacks = [torch.stack([t, 2 * t]) for t in primals]
    assert_close(torch.func.vmap(block)(*stacks), torch.func.vmap(reference)(*stacks))
    with pytest.raises(ValueError) as err:                           # the block contract, per example
        torch.func.vmap(block)(stacks[0], stacks[1], stacks[2][:, :-1])
    assert str(err.value) == message("kv_rows", "attn_block", k=(n, 4), v=(n - 1, 2))


def test_internal_twin_refuses_forward_ad():
    """``attn_lab::_attn_block_sharded`` (what attn_block runs on DTensors) has register_autograd's formula and
    no JVP: a tangent is refused, not dropped."""
    q, k, v = block_inputs(3, 5, d=4)
    torch.library.opcheck(torch.ops.attn_lab._attn_block_sharded, (q, k, v))
    with forward_ad.dual_level():
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            torch.ops.attn_lab._attn_block_sharded(forward_ad.make_dual(q, torch.ones_like(q)), k, v)


# --- gloo ranks ---------------------------------------------------------------------------------------------------
def _checks(rank: int, world: int) -> dict:
    return {"second_order": _second_order(world), "higher_order": _higher_order(world), "refusals": _refusals(world)}


def _outcome(fn):
    """``("ok", value)`` or ``("raised", type, first line)``: what a rank records of one request."""
    try:
        return ("ok", fn())
    except Exception as exc:                     # noqa: BLE001  (compared across ranks by the test)
        return ("raised", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


def _second_order(world: int) -> list:
    """create_graph=True through each rules layout, then the VJP of the gradients w.r.t. inputs and cotangents,
    against the same through attn_reference on the full tensors: the max abs error per result."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from crosscheck.shards.torch_layouts import distribute_inputs
    from torch_impl.sharded.layouts import LAYOUTS

    mesh = init_device_mesh("cpu", (world,))
    cases = [("rows", 1), ("keys", 1), ("all_shard0", 1), ("replicate", 1),       # n < P
             ("all_shard0", world + 1), ("rows", world + 1), ("keys", world + 1),  # n not divisible by P
             ("rows", 2 * world), ("keys", 2 * world), ("all_shard0", 0)]
    out = []
    for dtype in (torch.complex128, torch.float64):
        for name, n in cases:
            layout = LAYOUTS[name]
            g = torch.Generator().manual_seed(n)
            q, k, v = (uniform(n, c, dtype=dtype, g=g) for c in (3, 3, 2))
            go, ga = uniform(n, 2, dtype=dtype, g=g), uniform(n, n, dtype=dtype, g=g)
            w = [uniform(n, c, dtype=dtype, g=g) for c in (3, 3, 2)]

            leaves = [t.clone().requires_grad_() for t in (q, k, v, go, ga)]
            ref_out = torch_impl.attn_reference(*leaves[:3])
            ref_grads = torch.autograd.grad(ref_out, leaves[:3], leaves[3:], create_graph=True)
            ref = torch.autograd.grad(ref_grads, leaves, w, allow_unused=True)

            def run():
                dts = list(distribute_inputs(mesh, layout, q, k, v, requires_grad=True))
                outs = layout.fn(*dts)
                cots = [distribute_tensor(c, mesh, [Replicate() if o.placements[0].is_partial() else
                                                    o.placements[0]]).requires_grad_() for c, o in zip((go, ga), outs)]
                grads = torch.autograd.grad(outs, dts, cots, create_graph=True)
                ws = [distribute_tensor(wi, mesh, [Replicate() if gr.placements[0].is_partial() else
                                                   gr.placements[0]]) for wi, gr in zip(w, grads)]
                second = torch.autograd.grad(grads, dts + cots, ws, allow_unused=True)
                return [None if s is None else s.full_tensor() for s in second]

            got = _outcome(run)
            errors = None
            if got[0] == "ok":
                errors = [float("inf") if (x is None) != (r is None) else
                          0.0 if x is None or x.numel() == 0 else float((x - r).abs().max())
                          for x, r in zip(got[1], ref)]
            out.append(dict(case=f"{name} n={n} {dtype}", outcome=("ok",) if got[0] == "ok" else got,
                            errors=errors))
    return out


def _nested_vjps(outs, leaves, cotangent, order):
    """``order`` nested VJPs: the gradients of ``outs`` w.r.t. ``leaves`` (cotangents: the leaves after the
    first three, i.e. the output cotangents), then those gradients' VJP with the cotangents
    ``cotangent(level, index, gradient)``, and so on; ``create_graph=True`` on every level but the last.  None
    where a gradient is not reached."""
    current, cots = list(outs), list(leaves[3:])
    for level in range(order):
        pairs = [(t, cots[i] if level == 0 else cotangent(level, i, t))
                 for i, t in enumerate(current) if t is not None]
        current = torch.autograd.grad([t for t, _ in pairs], leaves, [c for _, c in pairs],
                                      create_graph=level < order - 1, allow_unused=True)
    return current


def _higher_order(world: int) -> list:
    """Third derivatives (fourth in float64 on every layout at n = P + 1) through each rules layout: nested VJPs
    w.r.t. q, k, v and the output cotangents, against the same through attn_reference on the full tensors.
    The Partial terms (keys: o and g_q; rows: g_k, g_v) and the replicated inputs' local gradients are where a
    DTensor.from_local / to_local pair, differentiable once only, would drop the other ranks' terms from the third
    order on.  Per case the max abs error relative to the reference's largest entry."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from crosscheck.shards.torch_layouts import distribute_inputs
    from torch_impl.sharded.layouts import LAYOUTS

    mesh = init_device_mesh("cpu", (world,))
    layouts = ("replicate", "rows", "keys", "all_shard0")
    cases = [(name, n, 3, dtype) for dtype in (torch.complex128, torch.float64) for n in (1, world + 1)
             for name in layouts]                                 # n < P; n not divisible by P
    cases += [(name, world + 1, 4, torch.float64) for name in layouts]
    out = []
    for name, n, order, dtype in cases:
        layout = LAYOUTS[name]
        g = torch.Generator().manual_seed(n)
        q, k, v = (uniform(n, c, dtype=dtype, g=g) for c in (3, 3, 2))
        go, ga = uniform(n, 2, dtype=dtype, g=g), uniform(n, n, dtype=dtype, g=g)

        def weight(level, i, t):
            return uniform(*t.shape, dtype=dtype, g=torch.Generator().manual_seed(100 * level + i))

        def cotangent(level, i, t):
            # depends on the inputs through the gradient t (as for the VJP of a norm of t): a constant
            # cotangent leaves out of the graph the very nodes that carry the other ranks' terms
            return t * weight(level, i, t)

        leaves = [t.clone().requires_grad_() for t in (q, k, v, go, ga)]
        ref = _nested_vjps(torch_impl.attn_reference(*leaves[:3]), leaves, cotangent, order)

        def readable(like):             # where a result's cotangent lives: a Partial one's is replicated
            return [Replicate() if p.is_partial() else p for p in like.placements]

        def placed(full, like):
            return distribute_tensor(full, mesh, readable(like))

        def dt_cotangent(level, i, t):
            return t.redistribute(mesh, readable(t)) * placed(weight(level, i, t), t)

        def run():
            dts = list(distribute_inputs(mesh, layout, q, k, v, requires_grad=True))
            outs = layout.fn(*dts)
            cots = [placed(c, o).requires_grad_() for c, o in zip((go, ga), outs)]
            got = _nested_vjps(outs, dts + cots, dt_cotangent, order)
            return [None if t is None else t.full_tensor() for t in got]

        got = _outcome(run)
        errors = None
        if got[0] == "ok":
            errors = [float("inf") if (x is None) != (r is None) else
                      0.0 if x is None or x.numel() == 0 else
                      float((x - r).abs().max() / r.abs().max().clamp(min=1))
                      for x, r in zip(got[1], ref)]
        out.append(dict(case=f"{name} n={n} order {order} {dtype}", outcome=("ok",) if got[0] == "ok" else got,
                        errors=errors))
    return out


def _refusals(world: int) -> list:
    """Requests that must raise, each decided from global shapes, dtypes and flags: every rank records its
    outcome; a rank that got past a check the other failed waits in the next collective (full_tensor) until the
    short process-group timeout, and records that instead."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    R, S0 = Replicate(), Shard(0)
    dist_ = lambda t, p: distribute_tensor(t, mesh, [p])  # noqa: E731
    n = 2 * world
    g = torch.Generator().manual_seed(0)
    q, k, v = (uniform(n, c, dtype=torch.float64, g=g) for c in (3, 3, 2))
    # k and v of different global row counts whose shards agree on rank 0 (n vs n - 1 rows split over P ranks)
    k_long, v_short = dist_(torch.cat([k, k[:1]]), S0), dist_(v, S0)

    def gathered(outs):
        return [t.full_tensor() for t in outs if t is not None]

    def block_kv_rows():
        return gathered(BLOCK(dist_(q, R), k_long, v_short))

    def block_kv_rows_inference():
        with torch.inference_mode():
            return gathered(BLOCK(dist_(q, R), k_long, v_short))

    def block_dtype():
        return gathered(BLOCK(dist_(q, S0), dist_(k.float(), R), dist_(v, R)))

    def backward_a_shape():       # a with one row too many: its shards and q's agree on one rank only
        a = torch.rand(n + 1, n, dtype=torch.float64)
        return gathered(torch.ops.attn_lab.attn_block_backward(
            dist_(q, S0), dist_(k, R), dist_(v, R), dist_(a, S0), None, dist_(a, S0), [True, True, True]))

    def lab_entry_kv_rows():
        return gathered(torch_impl.attn(dist_(q, R), k_long, v_short))

    cases = [("attn_block k/v rows", block_kv_rows), ("attn_block k/v rows, inference_mode", block_kv_rows_inference),
             ("attn_block dtype", block_dtype), ("attn_block_backward a shape", backward_a_shape),
             ("torch_impl.attn k/v rows", lab_entry_kv_rows)]
    return [(name, _outcome(fn)) for name, fn in cases]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return gloo.rank_results(_checks, 2, tmp_path_factory.mktemp("gloo_second_order"), timeout_s=LAUNCH_TIMEOUT_S,
                             pg_timeout_s=PG_TIMEOUT_S)


def test_complex_second_order_on_every_layout(ranks):
    """No rank raises or waits (the collectives of the create_graph backward never see a lazily conjugated
    view, and are decided alike on every rank), and the second derivatives match autograd of the reference."""
    for res in ranks:
        for c in res["second_order"]:
            assert c["outcome"] == ("ok",), c
            assert max(c["errors"]) <= 1e-12, c            # float64 / complex128; measured ≤ 1e-13


def test_third_and_fourth_order_on_every_layout(ranks):
    """Exact to rounding from the third order on, on every rules layout, complex and real, n < P and uneven."""
    from torch_impl.sharded import rules
    for res in ranks:
        for c in res["higher_order"]:
            if not rules.HIGHER_ORDERS:                        # torch < 2.13: refused on every rank, never wrong
                assert c["outcome"] == ("raised", "NotImplementedError", rules.HIGHER_ORDERS_REFUSED), c
                continue
            assert c["outcome"] == ("ok",), c
            assert max(c["errors"]) <= 1e-12, c            # relative to the largest entry; measured ≤ 1e-14


def test_refusals_raise_alike_on_every_rank(ranks):
    """Each bad request raises on both ranks, with the same exception and message (no rank left waiting).  Where
    no autograd kernel checks first (inference_mode; the backward op called directly), the sharding rule checks
    the global metadata and DTensor reports the contract's message as a RuntimeError."""
    first, second = (dict(r["refusals"]) for r in ranks)
    assert first == second, (first, second)
    kv_rows = message("kv_rows", "attn_block", k=(5, 3), v=(4, 2))
    expected = {
        "attn_block k/v rows": ("ValueError", kv_rows),
        "attn_block k/v rows, inference_mode": ("RuntimeError", kv_rows),
        "attn_block dtype": ("TypeError", "attn_block(): q, k and v must have the same dtype"),
        "attn_block_backward a shape": ("RuntimeError", "attn_block_backward(): argument 'a' must have shape (4, 4)"),
        "torch_impl.attn k/v rows": ("ValueError", "attn(): q, k and v must have the same first dimension"),
    }
    assert set(first) == set(expected)
    for name, (kind, start) in expected.items():
        outcome = first[name]
        assert outcome[0] == "raised" and outcome[1] == kind and outcome[2].startswith(start.splitlines()[0]), \
            (name, outcome)
