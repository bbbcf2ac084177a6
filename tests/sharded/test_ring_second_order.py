"""The sequence-parallel ring (``torch_impl.sharded.ring``): second order, and where it could give a wrong number
without an error.

On gloo ranks (one launch per world size, P = 2 and an uneven P = 3), every rank records what each check did:

* second order, on DTensors and on local shards, against ``attn_reference`` on the full tensors: a gradient
  penalty ``loss + ‖∂loss/∂q‖²`` with a loss linear in ``o`` or one reading ``a``, and the gradients of
  Re⟨W, G⟩ (G the first gradients, built with ``create_graph=True``) with respect to q, k, v and the
  cotangents, for one output unused, a frozen input, n = 0 and complex128;
* the third derivative raises on every rank, naming the rows layout, which gives the reference's;
* an in-place write on the ring's ``a`` (with grad mode on or off) or on a non-leaf input, after the forward,
  makes the backward raise autograd's "modified by an inplace operation" on every rank;
* ``ring_attn_local`` takes local shards of any layout (conjugate views, negative views, strided, on some ranks
  only) and matches ``attn_reference`` on the full tensors (o, a and the gradients), leaving the inputs as they
  were;
* ``count_hops()`` counts the hops run inside it: P − 1 forward, P + 1 backward, nothing outside it; the
  double backward's ring P + 1.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.support import gloo
from tests.support.inputs import block_inputs, uniform

LAUNCH_TIMEOUT_S = 180
TOL = 1e-12          # float64 / complex128 against the reference; measured errors are ~1e-15
INPLACE = "modified by an inplace operation"


def _diff(x, y) -> float:
    """max |x − y|, a ``None`` being zeros (autograd's "no gradient reaches it")."""
    if x is None or y is None:
        t = y if x is None else x
        return 0.0 if t is None or not t.numel() else float(t.abs().max())
    return float((x - y).abs().max()) if x.numel() else 0.0


def _outcome(fn) -> str:
    """``"ok"`` or ``"<exception type>: <message>"``: what a check did on this rank."""
    try:
        fn()
        return "ok"
    except Exception as exc:                           # noqa: BLE001 -- the type and message are the result
        return f"{type(exc).__name__}: {exc}"


def _checks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    import torch_impl
    from crosscheck.shards.torch_layouts import distribute_inputs
    from torch_impl.sharded import ring, rules
    from torch_impl.sharded.layouts import LAYOUTS

    mesh = init_device_mesh("cpu", (world,))
    sizes = ring.block_sizes(4 * world + 1, world)              # uneven blocks
    n = sum(sizes)
    rows = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
    out = {}
    q, k, v = block_inputs(n, n)

    def sharded():
        return [distribute_tensor(t, mesh, [Shard(0)]).requires_grad_() for t in (q, k, v)]

    def local():
        return [t[rows].clone().requires_grad_() for t in (q, k, v)]

    def ring_mesh(q_, k_, v_):
        return ring.ring_attn(q_, k_, v_)

    def ring_local(q_, k_, v_):
        return ring.ring_attn_local(q_, k_, v_, sizes=sizes)

    # --- second order: the gradient penalty that was silently wrong, then every cotangent and input ----------
    def penalty(entry, make, loss_of):
        leaves = make()
        o, a = entry(*leaves)
        loss = loss_of(o, a)
        g_q, = torch.autograd.grad(loss, leaves[0], create_graph=True)
        (loss + (g_q ** 2).sum()).backward()
        return [t.grad.full_tensor() if isinstance(t.grad, DTensor) else t.grad for t in leaves]

    losses = {"o.sum()": lambda o, a: o.sum(), "(a**2).sum()": lambda o, a: (a ** 2).sum()}
    out["penalty"] = {}
    for loss_name, loss_of in losses.items():
        ref = penalty(torch_impl.attn_reference, lambda: [t.clone().requires_grad_() for t in (q, k, v)], loss_of)
        for where, entry, make in (("ring_attn", ring_mesh, sharded), ("ring_attn_local", ring_local, local)):
            got = penalty(entry, make, loss_of)
            part = (lambda t: t) if where == "ring_attn" else (lambda t: t[rows])
            out["penalty"][(where, loss_name)] = [_diff(x, None if r is None else part(r)) for x, r in zip(got, ref)]

    out["second_order"] = {}
    for where in ("ring_attn", "ring_attn_local"):
        for case in SECOND_ORDER_CASES:
            try:
                r = _second_order(rank, world, mesh, sizes if case != "n = 0" else [0] * world, where, case,
                                  torch_impl, ring)
            except Exception as exc:                   # noqa: BLE001 -- recorded, so the other checks still run
                r = {"raised": f"{type(exc).__name__}: {exc}"}
            out["second_order"][(where, case)] = r

    # --- local shards, each rank with its own loss: what arrives and what is needed differs between ranks ------
    out["asymmetric"] = {}
    for case in ASYMMETRIC_CASES:
        try:
            out["asymmetric"][case] = _asymmetric(rank, world, sizes, case, torch_impl, ring)
        except Exception as exc:                       # noqa: BLE001 -- recorded, so the other checks still run
            out["asymmetric"][case] = [f"{type(exc).__name__}: {exc}"]

    # --- third order: refused on every rank -------------------------------------------------------------------
    def third(entry, make):
        def run():
            leaves = make()
            o, a = entry(*leaves)
            g_q, = torch.autograd.grad(o.sum(), leaves[0], create_graph=True)
            h_q, = torch.autograd.grad((g_q ** 2).sum(), leaves[0], create_graph=True)
            (h_q ** 2).sum().backward()
        return run

    out["third_order"] = {where: _outcome(third(entry, make))
                          for where, entry, make in (("ring_attn", ring_mesh, sharded),
                                                     ("ring_attn_local", ring_local, local))}

    # The alternative the refusal names: the rows layout, the same third derivative, against the reference.
    def third_grads(fn, leaves):
        g_q, = torch.autograd.grad(fn(*leaves)[0].sum(), leaves[0], create_graph=True)
        h_q, = torch.autograd.grad((g_q ** 2).sum(), leaves[0], create_graph=True)
        return torch.autograd.grad((h_q ** 2).sum(), leaves)

    ref = third_grads(torch_impl.attn_reference, [t.clone().requires_grad_() for t in (q, k, v)])
    if rules.HIGHER_ORDERS:
        got = third_grads(LAYOUTS["rows"].fn,
                          [t.requires_grad_() for t in distribute_inputs(mesh, LAYOUTS["rows"], q, k, v)])
        out["rows_third_order"] = [_diff(x.full_tensor(), y) for x, y in zip(got, ref)]
    else:                                              # torch < 2.13: the rows layout refuses it too, alike
        out["rows_third_order"] = _outcome(lambda: third_grads(
            LAYOUTS["rows"].fn, [t.requires_grad_() for t in distribute_inputs(mesh, LAYOUTS["rows"], q, k, v)]))

    # --- in-place writes on what the backward reads ------------------------------------------------------------
    def inplace(entry, make, write, loss_of):
        def run():
            q_, k_, v_ = make()
            q_ = q_ * 1                                 # a non-leaf input, which may be written in place
            o, a = entry(q_, k_, v_)
            write(q_, a)
            loss_of(o, a).backward()
        return run

    def a_mul(q_, a):
        a.mul_(0.5)

    def a_mul_no_grad(q_, a):
        with torch.no_grad():
            a.mul_(0.5)

    def q_mul(q_, a):
        q_.mul_(0.5)

    writes = {"a.mul_": a_mul, "a.mul_ under no_grad": a_mul_no_grad, "q.mul_": q_mul}
    out["inplace"] = {
        (where, write_name, loss_name): _outcome(inplace(entry, make, write, loss_of))
        for where, entry, make in (("ring_attn", ring_mesh, sharded), ("ring_attn_local", ring_local, local))
        for write_name, write in writes.items()
        for loss_name, loss_of in (("o.sum()", lambda o, a: o.sum()), ("a.sum()", lambda o, a: a.sum()))}

    # --- local shards of any layout --------------------------------------------------------------------------
    out["layouts"] = {}
    for dtype in (torch.float64, torch.complex128):
        full = block_inputs(n, n, dtype=dtype, seed=1)
        for name in VIEWS:
            if name == "neg" and dtype.is_complex:
                continue                                # a complex tensor's lazy bit is conj, covered above
            out["layouts"][(str(dtype), name)] = _layout_check(rank, world, sizes, full, name, torch_impl, ring)

    # --- hop counts --------------------------------------------------------------------------------------------
    q_, k_, v_ = sharded()
    with ring.count_hops() as outer:
        o, a = ring.ring_attn(q_, k_, v_)
        with ring.count_hops() as inner:
            torch.autograd.grad((o, a), (q_, k_, v_), (torch.ones_like(o), torch.ones_like(a)))
    ring.ring_attn(q_, k_, v_)                            # outside any count_hops(): counted nowhere
    out["hops"] = {"outer": dict(outer), "inner": dict(inner)}

    # --- ring_attn_local without sizes on uneven blocks, and a wrong sizes on one rank only -------------------
    mine = [t[rows].clone() for t in (q, k, v)]
    o_l, a_l = ring.ring_attn_local(*mine)
    o_r, a_r = torch_impl.attn_reference(q, k, v)
    out["sizes left out"] = max(_diff(o_l, o_r[rows]), _diff(a_l, a_r[rows]), float(a_l.shape != a_r[rows].shape))
    wrong = list(reversed(sizes)) if rank == 0 else sizes          # rank 0 alone passes a wrong sizes
    out["wrong sizes"] = _outcome(lambda: ring.ring_attn_local(*mine, sizes=wrong))
    return out


SECOND_ORDER_CASES = {          # (dtype, outputs used, inputs that require grad, cotangents require grad)
    "both": (torch.float64, (0, 1), (True, True, True), True),
    "o only, constant cotangent": (torch.float64, (0,), (True, True, True), False),
    "a only": (torch.float64, (1,), (True, True, True), True),
    "k only requires grad": (torch.float64, (0, 1), (False, True, False), True),
    "n = 0": (torch.float64, (0, 1), (True, True, True), True),
    "complex": (torch.complex128, (0, 1), (True, True, True), True),
}


def _second_order(rank, world, mesh, sizes, where, case, torch_impl, ring):
    """G = the gradients of ⟨G_O, o⟩ + ⟨G_A, a⟩ with create_graph=True, then the gradients of Re⟨W, G⟩ with
    respect to q, k, v and the cotangents G_O, G_A: the ring's against the reference's on the full tensors (a
    ``None`` counted as zeros).  Also the hops of the second backward."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    dtype, used, need, cot_grad = SECOND_ORDER_CASES[case]
    n = sum(sizes)
    bounds = [sum(sizes[:r]) for r in range(world + 1)]
    rows = slice(bounds[rank], bounds[rank + 1])
    g = torch.Generator().manual_seed(3)
    q, k, v = block_inputs(n, n, dtype=dtype, seed=4)
    cots = [uniform(n, 2, dtype=dtype, g=g), uniform(n, n, dtype=dtype, g=g)]
    weights = [uniform(n, c, dtype=dtype, g=g) for c in (3, 3, 2)]

    def run(entry, shard):
        leaves = [shard(t).requires_grad_(r) for t, r in zip((q, k, v), need)]
        cot = [shard(c).requires_grad_(cot_grad) for c in cots]
        outs = entry(*leaves)
        wanted = [t for t in leaves if t.requires_grad]
        grads = torch.autograd.grad([outs[i] for i in used], wanted, [cot[i] for i in used], create_graph=True,
                                    allow_unused=True)
        w = [shard(x) for x, r in zip(weights, need) if r]
        loss = sum((x.conj() * y).real.sum() for x, y in zip(w, grads) if y is not None)
        with ring.count_hops() as hops:
            second = torch.autograd.grad(loss, wanted + [cot[i] for i in used if cot_grad], allow_unused=True)
        full = [None if t is None else t.full_tensor() if isinstance(t, DTensor) else t for t in second]
        return full, hops

    ref, _ = run(torch_impl.attn_reference, lambda t: t.clone())
    if where == "ring_attn":
        got, hops = run(ring.ring_attn, lambda t: distribute_tensor(t, mesh, [Shard(0)]))
        part = lambda t: t                                                              # noqa: E731
    else:
        got, hops = run(lambda *t: ring.ring_attn_local(*t, sizes=sizes), lambda t: t[rows].clone())
        part = lambda t: t[rows]                                                        # noqa: E731
    errors = [_diff(x, None if y is None else part(y)) for x, y in zip(got, ref)]
    scale = max([float(y.abs().max()) for y in ref if y is not None and y.numel()], default=0.0)
    return {"errors": errors, "scale": scale, "count": len(got), "hops": dict(hops)}


ASYMMETRIC_CASES = ("o on rank 0 only", "v frozen on rank 0 only", "penalty on G_Q on rank 0, on G_K elsewhere")


def _asymmetric(rank, world, sizes, case, torch_impl, ring):
    """``ring_attn_local`` where the ranks' local losses differ: rank 0's reads o and a, the others' a only (and,
    for the penalty, rank 0 penalises its rows of G_Q, the others their rows of G_K), or rank 0's v is frozen.
    The reference differentiates the sum of the ranks' losses on the full tensors; each rank compares its rows."""
    bounds = [sum(sizes[:r]) for r in range(world + 1)]
    rows = [slice(bounds[r], bounds[r + 1]) for r in range(world)]
    q, k, v = block_inputs(sum(sizes), sum(sizes), seed=5)
    need = [(True, True, not (case.startswith("v frozen") and r == 0)) for r in range(world)]

    def first(r, o, a):
        return (o.sum() + a.sum()) if r == 0 else a.sum()

    def penalty(r, g):                                # g: the gradients (q, k, v) of rank r's rows
        return (g[0] ** 2).sum() if r == 0 else (g[1] ** 2).sum()

    second = case.startswith("penalty")
    # the reference: every rank's loss on its rows of the full outputs
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, a = torch_impl.attn_reference(*leaves)
    loss = sum(first(r, o[rows[r]], a[rows[r]]) for r in range(world))
    if second:
        g = torch.autograd.grad(loss, leaves, create_graph=True)
        loss = loss + sum(penalty(r, [t[rows[r]] for t in g]) for r in range(world))
    ref = torch.autograd.grad(loss, leaves)
    # the ring: this rank's loss on its rows
    mine = [t[rows[rank]].clone().requires_grad_(n) for t, n in zip((q, k, v), need[rank])]
    o, a = ring.ring_attn_local(*mine, sizes=sizes)
    loss = first(rank, o, a)
    if second:
        g = torch.autograd.grad(loss, mine, create_graph=True)
        loss = loss + penalty(rank, g)
    wanted = [t for t in mine if t.requires_grad]
    got = torch.autograd.grad(loss, wanted)
    return [_diff(x, y[rows[rank]]) for x, y in zip(got, [r for r, n in zip(ref, need[rank]) if n])]


VIEWS = ("conj", "neg", "strided", "strided on rank 0 only", "conj on the last rank only")


def _view(name, t, r, world):
    """The view ``name`` of ``t`` as rank ``r`` passes it: differentiable, sharing ``t``'s memory."""
    if name == "conj" or (name == "conj on the last rank only" and r == world - 1):
        return t.conj()
    if name == "neg":                   # −t with the lazy negative bit: −imag(conj(0 + i t)), real
        return torch.complex(torch.zeros_like(t), t).conj().imag
    if name == "strided" or (name == "strided on rank 0 only" and r == 0):
        return t.mT.contiguous().mT
    return t


def _values(name, t, r, world):
    """The values of ``_view(name, t, r, world)``, materialised; also the map from the view's gradient to its
    base's (PyTorch's convention: conj for a conjugate view, − for a negative one)."""
    if name == "conj" or (name == "conj on the last rank only" and r == world - 1):
        return t.conj().resolve_conj()
    return -t if name == "neg" else t


def _layout_check(rank, world, sizes, full, name, torch_impl, ring):
    """``ring_attn_local`` on the views ``name`` of this rank's rows of ``full`` against the reference on the full
    tensors made of every rank's view: o, a, the gradients reaching this rank's rows, and the inputs unchanged."""
    bounds = [sum(sizes[:r]) for r in range(world + 1)]
    rows = slice(bounds[rank], bounds[rank + 1])
    leaves = [t[rows].clone().requires_grad_() for t in full]
    inputs = [_view(name, t, rank, world) for t in leaves]
    before = [t.detach().clone() for t in inputs]
    assert name != "neg" or all(t.is_neg() for t in inputs)
    assert name != "conj" or all(t.is_conj() for t in inputs if t.is_complex())
    o, a = ring.ring_attn_local(*inputs, sizes=sizes)
    fulls = [torch.cat([_values(name, t[bounds[r]:bounds[r + 1]], r, world) for r in range(world)]).requires_grad_()
             for t in full]
    ref_o, ref_a = torch_impl.attn_reference(*fulls)
    g = torch.Generator().manual_seed(2)
    g_o, g_a = (uniform(*t.shape, dtype=t.dtype, g=g) for t in (ref_o, ref_a))
    grads = torch.autograd.grad((o, a), leaves, (g_o[rows], g_a[rows]))
    ref_grads = [_values(name, t[rows], rank, world) for t in torch.autograd.grad((ref_o, ref_a), fulls, (g_o, g_a))]
    errors = [float((x - y[rows]).detach().abs().max()) for x, y in ((o, ref_o), (a, ref_a))]
    errors += [float((x - y).abs().max()) for x, y in zip(grads, ref_grads)]
    unchanged = all(torch.equal(x, y.detach()) for x, y in zip(before, inputs))
    return {"errors": errors, "inputs unchanged": unchanged}


# --- the tests -------------------------------------------------------------------------------------------------
# P = 3 (11 s on 2 cores) in the slow tier: P = 2 runs the same checks in the README's test command.
@pytest.fixture(scope="module", params=[2, pytest.param(3, marks=pytest.mark.slow)], ids=["P=2", "P=3"])
def ranks(request, tmp_path_factory):
    world = request.param
    return world, gloo.rank_results(_checks, world, tmp_path_factory.mktemp(f"ring{world}"), timeout_s=LAUNCH_TIMEOUT_S)


def test_gradient_penalty_through_the_ring(ranks):
    """``loss + ‖∂loss/∂q‖²`` with a loss linear in o (the case once_differentiable let through without its
    second-order term) and one reading a: q, k, v gradients as the reference's."""
    world, results = ranks
    for res in results:
        assert len(res["penalty"]) == 4
        for case, errors in res["penalty"].items():
            assert max(errors) <= TOL, (case, errors)


def test_second_order_through_the_ring(ranks):
    world, results = ranks
    for res in results:
        assert len(res["second_order"]) == 2 * len(SECOND_ORDER_CASES)
        for case, r in res["second_order"].items():
            # Relative to the largest reference value: complex tanh near its poles makes second derivatives of
            # ~1e4 at P = 3 (uneven n = 13), where the errors are ~1e-10, i.e. ~1e-14 of the values.
            assert "raised" not in r and r["count"] >= 1 and max(r["errors"]) <= TOL * max(1.0, r["scale"]), (case, r)
        # the double backward's own ring: P − 1 rounds of k/v blocks and their cotangents, P of accumulators
        assert res["second_order"][("ring_attn", "both")]["hops"]["double_backward"] == world + 1


def test_third_order_is_refused_on_every_rank(ranks):
    from torch_impl.sharded.ring import TRIPLE_BACKWARD
    world, results = ranks
    for res in results:
        assert res["third_order"] == {where: f"RuntimeError: {TRIPLE_BACKWARD}"
                                      for where in ("ring_attn", "ring_attn_local")}
    assert "Use the rows layout" in TRIPLE_BACKWARD


def test_the_triple_backward_message_states_where_the_rules_give_every_order():
    """The ring's refusal sends the caller to the rules layouts for the third derivative; those give it only from
    the torch release ``rules.HIGHER_ORDERS`` starts at (older DTensor refuses it), and the message says which:
    the same release as the rules' own refusal, and "every order" only with it."""
    import re

    from torch_impl.sharded import rules
    from torch_impl.sharded.ring import TRIPLE_BACKWARD
    needs = re.search(r"needs torch >= (\d+\.\d+)", rules.HIGHER_ORDERS_REFUSED).group(1)
    assert re.search(rf"every order on torch >= {re.escape(needs)} \(on older torch, the second order\)",
                     TRIPLE_BACKWARD), TRIPLE_BACKWARD
    assert rules.HIGHER_ORDERS == (tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
                                   >= tuple(int(p) for p in needs.split(".")))


def test_the_named_alternative_gives_the_third_derivative(ranks):
    from torch_impl.sharded import rules
    world, results = ranks
    for res in results:
        if not rules.HIGHER_ORDERS:                        # torch < 2.13: refused on every rank (sharded/rules.py)
            assert res["rows_third_order"] == f"NotImplementedError: {rules.HIGHER_ORDERS_REFUSED}", res
            continue
        assert max(res["rows_third_order"]) <= TOL, res["rows_third_order"]


def test_local_shards_with_a_loss_per_rank(ranks):
    """What arrives and what is needed differs between ranks: the ranks agree on what travels, and each rank's
    gradients are its rows of the gradients of the sum of the ranks' losses."""
    world, results = ranks
    for res in results:
        assert set(res["asymmetric"]) == set(ASYMMETRIC_CASES)
        for case, errors in res["asymmetric"].items():
            assert all(isinstance(e, float) for e in errors) and max(errors) <= TOL, (case, errors)


def test_inplace_writes_after_the_forward_raise_on_every_rank(ranks):
    world, results = ranks
    for res in results:
        assert len(res["inplace"]) == 12
        for case, outcome in res["inplace"].items():
            assert outcome.startswith("RuntimeError") and INPLACE in outcome, (case, outcome)


def test_local_shards_of_any_layout(ranks):
    world, results = ranks
    for res in results:
        assert len(res["layouts"]) == 9
        for case, r in res["layouts"].items():
            assert max(r["errors"]) <= TOL, (case, r)
            assert r["inputs unchanged"], case


def test_local_shards_sizes_come_from_the_ranks(ranks):
    """sizes left out on uneven blocks: every rank's real rows (a rank that assumed its own row count for the
    others read blocks of the wrong size: garbage in a on one rank, gloo aborting the other); a sizes wrong on
    one rank only: the same ValueError on every rank, before any P2P."""
    world, results = ranks
    assert all(res["sizes left out"] <= TOL for res in results), [res["sizes left out"] for res in results]
    outcomes = {res["wrong sizes"] for res in results}
    assert len(outcomes) == 1 and next(iter(outcomes)).startswith("ValueError: ring_attn(): sizes "), outcomes


def test_count_hops(ranks):
    world, results = ranks
    for res in results:
        outer, inner = res["hops"]["outer"], res["hops"]["inner"]
        assert outer["forward"] == world - 1 and outer["backward"] == world + 1, outer
        assert inner["forward"] == 0 and inner["backward"] == world + 1, inner
        assert inner["backward_bytes"] == outer["backward_bytes"] > 0 and outer["forward_bytes"] > 0, (outer, inner)


def test_count_hops_closes():
    from torch_impl.sharded import ring
    with ring.count_hops() as hops:
        assert ring._counters == [hops]
    assert ring._counters == []
    assert_close(hops, {f"{d}{w}": 0 for d in ("forward", "backward", "double_backward") for w in ("", "_bytes")})
