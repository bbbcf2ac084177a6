"""Issue 22, torch side: the block operators, the DTensor sharding rules and the sequence-parallel ring.

In this process: ``attn_lab::attn_block`` and ``attn_block_backward`` (opcheck, gradcheck, gradgradcheck, the
block contract, the output mask, fake kernels).  On gloo ranks: one launch per world size (2 and 4) runs every
layout (``torch_impl.sharded.layouts.LAYOUTS``) on float64 inputs against ``attn_reference`` on the full tensors
(o, a, all gradients; one output unused; n not divisible by P; n = 0; complex128), pins the collectives per
layout (``CommDebugMode``) and the ring's P2P hops, runs the lab's entries under ``no_grad`` and
``inference_mode``, and shows the ``local_map`` gradient pitfall.  The ranks are forked from a forkserver that
imported torch once (a fresh interpreter per rank costs seconds of import on this machine); a free port per
launch (bound to port 0), a timeout on each, process groups destroyed.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.testing import assert_close

from crosscheck.ranks import run_ranks
from tests.support import gloo
from tests.support.inputs import block_inputs

import torch_impl
from torch_impl.sharded import blocks
from torch_impl.validation import message

BLOCK, BLOCK_BW = blocks.attn_block, blocks.attn_block_backward
LAUNCH_TIMEOUT_S = 240
TOL = 1e-12        # float64 against the reference on the gathered tensors; measured errors are ~1e-15


# --- the block operators, in this process ----------------------------------------------------------------------
@pytest.mark.parametrize("m, n", [(3, 5), (4, 2), (0, 3), (3, 0)])
def test_block_opcheck(m, n):
    q, k, v = block_inputs(m, n)
    torch.library.opcheck(BLOCK, (q, k, v))
    o, a = BLOCK(q, k, v)
    ga = torch.rand_like(a)
    for mask in ([True, True, True], [False, True, False], [True, False, True]):
        torch.library.opcheck(BLOCK_BW, (q, k, v, a, None, ga, mask))
        torch.library.opcheck(BLOCK_BW, (q, k, v, a, torch.rand_like(o), ga, mask))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_block_gradients_match_reference(dtype):
    """m ≠ n: the block (32) and its autograd through the backward op (33)-(35) against autograd of the three ops."""
    q, k, v = (t.requires_grad_() for t in block_inputs(3, 5, dtype=dtype))
    assert torch.autograd.gradcheck(BLOCK, (q, k, v))
    assert torch.autograd.gradgradcheck(BLOCK, (q, k, v))
    o, a = BLOCK(q, k, v)
    a_ref = torch.tanh(q @ k.mT)
    assert_close((o, a), (a_ref @ v, a_ref))
    for outputs, refs in (((o,), (a_ref @ v,)), ((a,), (a_ref,))):              # one output unused: None
        cot = [torch.rand_like(t) for t in outputs]
        assert_close(torch.autograd.grad(outputs, (q, k, v), cot, retain_graph=True, allow_unused=True),
                     torch.autograd.grad(refs, (q, k, v), cot, retain_graph=True, allow_unused=True))


def test_block_backward_output_mask_and_none():
    q, k, v = block_inputs(3, 4)
    o, a = BLOCK(q, k, v)
    gq, gk, gv = BLOCK_BW(q, k, v, a, None, torch.rand_like(a), [True, False, True])
    assert gq is not None and gk is None and gv is None          # g_v needs G_O; none arrived
    gq, gk, gv = BLOCK_BW(q, k, v, a, torch.rand_like(o), None, [False, True, True])
    assert gq is None and gk is not None and gv is not None


def test_block_contract():
    q, k, v = block_inputs(3, 4)
    with pytest.raises(ValueError) as e:
        BLOCK(q, k, v[:3])
    assert str(e.value) == message("kv_rows", "attn_block", k=(4, 3), v=(3, 2))
    with pytest.raises(ValueError, match=r"attn_block\(\): q and k must have the same second dimension"):
        BLOCK(q[:, :2], k, v)
    o, a = BLOCK(q, k, v)
    with pytest.raises(ValueError, match=r"argument 'a' must have shape \(3, 4\)"):
        BLOCK_BW(q, k, v, a.mT, None, a, [True, True, True])
    with pytest.raises(ValueError, match=r"argument 'grad_o' must have shape \(3, 2\)"):
        BLOCK_BW(q, k, v, a, a, None, [True, True, True])
    with pytest.raises(TypeError, match="argument 'grad_a' must have q's dtype float64, got float32"):
        BLOCK_BW(q, k, v, a, None, a.float(), [True, True, True])


def test_block_forward_ad_is_the_jvp_36():
    """attn_block's Autograd kernel applies BlockFunction, whose jvp is (36): a forward-mode tangent through the
    block operator is carried, not dropped (tests/sharded/test_dtensor_second_order.py checks it against the reference)."""
    q, k, v = block_inputs(3, 4)
    with torch.autograd.forward_ad.dual_level():
        o, a = BLOCK(torch.autograd.forward_ad.make_dual(q, torch.ones_like(q)), k, v)
        a_dot = torch.autograd.forward_ad.unpack_dual(a).tangent
    assert a_dot is not None
    torch.testing.assert_close(a_dot, (1 - a.detach() ** 2) * (torch.ones_like(q) @ k.mT))   # (36), K̇ = 0


# --- gloo ranks ---------------------------------------------------------------------------------------------------
def _late_writer(rank: int, world: int, port: int, seconds: float, outdir: str) -> None:
    time.sleep(seconds)
    open(os.path.join(outdir, f"rank{rank}"), "w").close()


def test_ranks_past_the_deadline_raise_and_are_stopped(tmp_path):
    with pytest.raises(TimeoutError, match="2 gloo ranks did not finish in 1 s"):
        run_ranks(_late_writer, 2, (3.0, str(tmp_path)), preload=(), timeout_s=1)
    time.sleep(4.0)                             # past the ranks' 3 s: a rank left running would have written
    assert os.listdir(tmp_path) == []


def _counts(mode) -> dict:
    return {str(op): c for op, c in mode.get_comm_counts().items()}


def _checks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import local_map

    from crosscheck.shards.torch_layouts import distribute_inputs, run_layout
    from torch_impl.sharded import ring
    from torch_impl.sharded.layouts import LAYOUTS

    mesh = init_device_mesh("cpu", (world,))
    out = {"cases": [], "entries": [], "local_map": {}}

    def err(x, ref):
        if isinstance(x, DTensor) and ref is None:
            # o unused: on DTensors G_V comes back zeros, not None (a rank cannot tell whether another rank's
            # loss read o, so none decides from it: rules.present_cotangents); zeros are what None stands for.
            full = x.full_tensor().detach()
            return 0.0 if not full.numel() or not bool(full.abs().max()) else float("inf")
        if x is None or ref is None:
            return None if x is None and ref is None else float("inf")
        full = (x.full_tensor() if isinstance(x, DTensor) else x).detach()
        return float((full - ref).abs().max()) if ref.numel() else 0.0

    def cotangent(full, placement):          # a Partial output's cotangent is replicated
        return distribute_tensor(full, mesh, [Replicate() if placement.is_partial() else placement])

    cases = [("both", 4 * world, torch.float64), ("o only", 4 * world, torch.float64),
             ("a only", 4 * world, torch.float64), ("k only requires grad", 4 * world, torch.float64),
             ("n not divisible by P", world + 1, torch.float64), ("n = 0", 0, torch.float64),
             ("complex", 2 * world, torch.complex128)]
    for layout in LAYOUTS.values():
        for case, n, dtype in cases:
            q, k, v = block_inputs(n, n, d=3, e=2, dtype=dtype, seed=n)
            go = block_inputs(n, n, d=2, e=n, dtype=dtype, seed=n + 1)[0]
            ga = block_inputs(n, n, d=n, dtype=dtype, seed=n + 2)[0]
            need = (False, True, False) if case == "k only requires grad" else (True, True, True)
            leaves = [t.clone().requires_grad_(r) for t, r in zip((q, k, v), need)]
            ro, ra = torch_impl.attn_reference(*leaves)
            dts = [t.requires_grad_(r) for t, r in zip(distribute_inputs(mesh, layout, q, k, v), need)]
            with ring.count_hops() as hops:
                with CommDebugMode() as fwd:
                    o, a = layout.fn(*dts)
                used = {"o only": (0,), "a only": (1,)}.get(case, (0, 1))
                outs, refs = [(o, a)[i] for i in used], [(ro, ra)[i] for i in used]
                cots = [cotangent((go, ga)[i], (o, a)[i].placements[0]) for i in used]
                wanted = [t for t, r in zip(dts, need) if r]
                with CommDebugMode() as bwd:
                    grads = torch.autograd.grad(outs, wanted, cots, allow_unused=True)
            ref_grads = torch.autograd.grad(refs, [t for t in leaves if t.requires_grad], [(go, ga)[i] for i in used],
                                            allow_unused=True)
            out["cases"].append(dict(
                layout=layout.name, case=case, n=n,
                errors=[err(o, ro), err(a, ra)] + [err(g, r) for g, r in zip(grads, ref_grads)],
                forward=_counts(fwd), backward=_counts(bwd), hops=hops,
                placements=[str(t.placements) for t in (o, a)]))

    # One shape, the gradients asked for changing from call to call: DTensor caches a layout per input
    # placements, not per output_mask, so a frozen input first must not shape a later call's gradients.
    out["masks"] = []
    n = 3 * world                                   # a size no check above uses: nothing cached for it yet
    q, k, v = block_inputs(n, n)
    go, ga = torch.rand(n, 2, dtype=torch.float64), torch.rand(n, n, dtype=torch.float64)
    for name in ("replicate", "rows", "keys"):
        for need in ((False, True, True), (True, True, True), (True, False, False), (True, True, True)):
            leaves = [t.clone().requires_grad_(r) for t, r in zip((q, k, v), need)]
            ref = torch.autograd.grad(torch_impl.attn_reference(*leaves), [t for t in leaves if t.requires_grad],
                                      (go, ga))
            dts = [t.requires_grad_(r) for t, r in zip(distribute_inputs(mesh, LAYOUTS[name], q, k, v), need)]
            o, a = LAYOUTS[name].fn(*dts)
            grads = torch.autograd.grad((o, a), [t for t in dts if t.requires_grad],
                                        (cotangent(go, o.placements[0]), cotangent(ga, a.placements[0])))
            out["masks"].append(dict(layout=name, need=need, types=[type(g).__name__ for g in grads],
                                     errors=[err(g, r) for g, r in zip(grads, ref)]))

    # The checker's callable: one call per layout, full tensors back.
    q, k, v = block_inputs(2 * world + 1, 2 * world + 1)
    go, ga = torch.rand(2 * world + 1, 2, dtype=torch.float64), None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ro, ra = torch_impl.attn_reference(*leaves)
    ref = torch.autograd.grad(ro, leaves, go)
    out["run_layout"] = {
        name: [err(x, y) for x, y in zip((r["o"], r["a"], *r["grads"]), (ro, ra, *ref))]
        for name, r in ((name, run_layout(mesh, layout, q, k, v, go, ga)) for name, layout in LAYOUTS.items())}

    # The lab's entries on DTensors: autograd (checked above), no_grad and inference_mode.
    n = 4 * world
    q, k, v = block_inputs(n, n)
    ro, ra = torch_impl.attn_reference(q, k, v)
    for name in ("rows", "keys", "all_shard0"):
        layout = LAYOUTS[name]
        for entry_name, entry in (("torch_impl.attn", torch_impl.attn), ("attn_lab.attn", torch.ops.attn_lab.attn)):
            for mode_name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
                with mode():
                    dts = distribute_inputs(mesh, layout, q, k, v)
                    with CommDebugMode() as cm:
                        o, a = entry(*dts)
                    out["entries"].append(dict(layout=name, entry=entry_name, mode=mode_name,
                                               errors=[err(o, ro), err(a, ra)], forward=_counts(cm)))

    # local_map over the block op, rows layout: the default in_grad_placements (= in_placements) declares the
    # local gradients of the replicated k, v Replicate, but each rank holds only its rows' term of the sum (35).
    S0 = Shard(0)
    q, k, v = (t.requires_grad_() for t in block_inputs(n, n))
    ref = torch.autograd.grad(torch_impl.attn_reference(q, k, v).o.sum(), (q, k, v))
    for name, grad_placements in (("default", None), ("right", ([S0], [Partial()], [Partial()]))):
        f = local_map(lambda q, k, v: tuple(BLOCK(q, k, v)), out_placements=([S0], [S0]),
                      in_placements=([S0], [Replicate()], [Replicate()]), in_grad_placements=grad_placements,
                      device_mesh=mesh)
        dts = [t.requires_grad_() for t in distribute_inputs(mesh, LAYOUTS["rows"], q, k, v)]
        grads = torch.autograd.grad(f(*dts)[0].sum(), dts)
        out["local_map"][name] = [err(g, r) for g, r in zip(grads, ref)]
    return out


# Collectives per layout, fwd and bwd, as CommDebugMode counts them (P2P is not a collective: the ring's hops
# are counted by torch_impl.sharded.ring).  Pinned exactly where the sharding rules decide (and the ring: none).
ALL_GATHER = "c10d_functional.all_gather_into_tensor"
EXPECTED_COLLECTIVES = {
    "replicate": ({}, {}),
    "rows": ({}, {}),
    "keys": ({}, {}),
    # The ring's backward: its P + 1 hops (P2P, not counted here) and one all-reduce of 5 flags (20 bytes), by
    # which the ranks agree on which output gradients arrived, since each rank may read its own outputs.
    "ring": ({}, {"c10d.allreduce_": 1}),
}
# q, k, v all Shard(0) through the rules: no rule takes that layout, so DTensor redistributes to the cheapest
# one by its own cost model (torch 2.13: all-gathers q into the keys layout, 1 all-gather forward and 1 backward;
# the choice is DTensor's and may differ between releases): only all-gathers, at least one, at most k and v.
ALL_SHARD0_MAX_GATHERS = 2
# P = 4 (19 s on 2 cores) in the slow tier: P = 2 runs the same checks in the README's test command.
@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)], ids=["P=2", "P=4"])
def ranks(request, tmp_path_factory):
    world = request.param
    return world, gloo.rank_results(_checks, world, tmp_path_factory.mktemp(f"gloo{world}"), timeout_s=LAUNCH_TIMEOUT_S)


def test_layouts_match_reference(ranks):
    world, results = ranks
    for res in results:
        for c in res["cases"]:
            assert all(e is not None and e <= TOL for e in c["errors"] if e is not None), c
            assert None not in c["errors"][:2], c


def test_frozen_inputs_from_call_to_call(ranks):
    """The same shapes with a frozen q, then nothing frozen, then only q wanted: each call's gradients are DTensors
    and right (a layout cached for one call's mask must not drop or mis-wrap a later call's gradient)."""
    world, results = ranks
    masks = results[0]["masks"]
    assert len(masks) == 12
    for m in masks:
        assert m["types"] == ["DTensor"] * sum(m["need"]), m
        assert max(m["errors"]) <= TOL, m


def test_run_layout_for_a_checker(ranks):
    world, results = ranks
    res = results[0]["run_layout"]
    assert set(res) == {"replicate", "rows", "keys", "all_shard0", "ring"}
    for name, errors in res.items():
        assert max(errors) <= TOL, (name, errors)


def test_collectives_per_layout(ranks):
    world, results = ranks
    for c in results[0]["cases"]:
        if c["n"] == 0:
            continue           # nothing to move; DTensor may skip the gather of empty shards
        if c["layout"] == "all_shard0":
            assert set(c["forward"]) == {ALL_GATHER}, c
            assert 1 <= c["forward"][ALL_GATHER] <= ALL_SHARD0_MAX_GATHERS, c
            assert set(c["backward"]) <= {ALL_GATHER} and sum(c["backward"].values()) <= ALL_SHARD0_MAX_GATHERS, c
            continue
        fwd, bwd = EXPECTED_COLLECTIVES[c["layout"]]
        assert c["forward"] == fwd, c
        if c["case"] in ("both", "o only", "k only requires grad"):     # cotangent on o: the pinned backward
            assert c["backward"] == bwd, c
        else:
            assert sum(c["backward"].values()) <= sum(bwd.values()), c


def test_ring_hops(ranks):
    world, results = ranks
    for c in results[0]["cases"]:
        if c["layout"] != "ring":
            continue
        assert c["hops"]["forward"] == world - 1, c
        assert c["hops"]["backward"] <= 2 * world - 1, c
        if c["case"] == "both":    # P − 1 k/v messages and P accumulator messages in P + 1 rounds
            assert c["hops"]["backward"] == world + 1, c


def test_placements(ranks):
    world, results = ranks
    by = {(c["layout"], c["case"]): c["placements"] for c in results[0]["cases"]}
    assert by[("rows", "both")] == ["(Shard(dim=0),)", "(Shard(dim=0),)"]
    assert by[("keys", "both")] == ["(Partial(sum),)", "(Shard(dim=1),)"]
    assert by[("ring", "both")] == ["(Shard(dim=0),)", "(Shard(dim=0),)"]


def test_entries_no_grad_and_inference_mode(ranks):
    world, results = ranks
    entries = results[0]["entries"]
    assert len(entries) == 12
    for e in entries:
        assert max(e["errors"]) <= TOL, e
        if e["layout"] == "all_shard0":
            assert set(e["forward"]) == {ALL_GATHER}, e
        else:
            assert e["forward"] == EXPECTED_COLLECTIVES[e["layout"]][0], e


def test_local_map_default_grad_placements_pitfall(ranks):
    """The default in_grad_placements give silently wrong k, v gradients; Partial ones are right."""
    world, results = ranks
    wrong, right = results[0]["local_map"]["default"], results[0]["local_map"]["right"]
    assert wrong[0] <= TOL and wrong[1] > 1e-3 and wrong[2] > 1e-3, wrong
    assert max(right) <= TOL, right
