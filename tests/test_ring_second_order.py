"""The sequence-parallel ring (``torch_impl.ring``) where it could give a wrong number without an error.

On gloo ranks (one launch per world size, P = 2 and an uneven P = 3), every rank records what each check did:

* a backward asked to build a graph (``create_graph=True``: a gradient penalty, with a loss linear in ``o`` or
  one reading ``a``) raises on every rank, on DTensors and on local shards, naming the layouts that support it;
  the rows layout it names gives the penalty's gradient of the reference;
* an in-place write on the ring's ``a`` (with grad mode on or off) or on a non-leaf input, after the forward,
  makes the backward raise autograd's "modified by an inplace operation" on every rank;
* ``ring_attn_local`` takes local shards of any layout (conjugate views, negative views, strided, on some ranks
  only) and matches ``attn_reference`` on the full tensors (o, a and the gradients), leaving the inputs as they
  were;
* ``count_hops()`` counts the hops run inside it: P − 1 forward, P + 1 backward, nothing outside it.
"""

from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.testing import assert_close

from crosscheck.ranks import run_ranks

LAUNCH_TIMEOUT_S = 180
TOL = 1e-12          # float64 / complex128 against the reference; measured errors are ~1e-15
INPLACE = "modified by an inplace operation"


def _rand(n, cols, dtype, g):
    draw = lambda: torch.rand(n, cols, generator=g, dtype=torch.float64) * 2 - 1  # noqa: E731
    return torch.complex(draw(), draw()) if dtype.is_complex else draw()


def _make(n, dtype=torch.float64, seed=0, d=3, e=2):
    """q (n, d), k (n, d), v (n, e) in U[-1, 1) (independent imaginary parts for complex dtypes)."""
    g = torch.Generator().manual_seed(seed)
    return _rand(n, d, dtype, g), _rand(n, d, dtype, g), _rand(n, e, dtype, g)


def _outcome(fn) -> str:
    """``"ok"`` or ``"<exception type>: <message>"``: what a check did on this rank."""
    try:
        fn()
        return "ok"
    except Exception as exc:                           # noqa: BLE001 -- the type and message are the result
        return f"{type(exc).__name__}: {exc}"


def _worker(rank: int, world: int, port: int, outdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.save(_checks(rank, world), os.path.join(outdir, f"rank{rank}.pt"))
    except BaseException:
        raise RuntimeError(f"rank {rank}: {traceback.format_exc()}")
    finally:
        dist.destroy_process_group()


def _checks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import torch_impl
    from torch_impl import distributed as D, ring

    mesh = init_device_mesh("cpu", (world,))
    sizes = ring.block_sizes(4 * world + 1, world)              # uneven blocks
    n = sum(sizes)
    rows = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
    out = {}
    q, k, v = _make(n)

    def sharded():
        return [distribute_tensor(t, mesh, [Shard(0)]).requires_grad_() for t in (q, k, v)]

    def local():
        return [t[rows].clone().requires_grad_() for t in (q, k, v)]

    def ring_mesh(q_, k_, v_):
        return ring.ring_attn(q_, k_, v_)

    def ring_local(q_, k_, v_):
        return ring.ring_attn_local(q_, k_, v_, sizes=sizes)

    # --- double backward: refused on every rank, whatever the loss ------------------------------------------
    def penalty(entry, make, loss_of):
        def run():
            leaves = make()
            o, a = entry(*leaves)
            loss = loss_of(o, a)
            g_q, = torch.autograd.grad(loss, leaves[0], create_graph=True)
            (loss + (g_q ** 2).sum()).backward()
        return run

    losses = {"o.sum()": lambda o, a: o.sum(), "(a**2).sum()": lambda o, a: (a ** 2).sum()}
    out["double_backward"] = {
        (where, loss_name): _outcome(penalty(entry, make, loss_of))
        for where, entry, make in (("ring_attn", ring_mesh, sharded), ("ring_attn_local", ring_local, local))
        for loss_name, loss_of in losses.items()}

    # The alternative the refusal names: the rows layout, the same penalty, against the reference.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_o = torch_impl.attn_reference(*leaves).o
    g_q, = torch.autograd.grad(ref_o.sum(), leaves[0], create_graph=True)
    ref_grads = torch.autograd.grad(ref_o.sum() + (g_q ** 2).sum(), leaves)
    dts = [t.requires_grad_() for t in D.distribute_inputs(mesh, D.LAYOUTS["rows"], q, k, v)]
    o = D.LAYOUTS["rows"].fn(*dts)[0]
    g_q, = torch.autograd.grad(o.sum(), dts[0], create_graph=True)
    grads = torch.autograd.grad(o.sum() + (g_q ** 2).sum(), dts)
    out["rows_penalty_errors"] = [float((g.full_tensor() - r).abs().max()) for g, r in zip(grads, ref_grads)]

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
        full = _make(n, dtype=dtype, seed=1)
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
    return out


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
    g_o, g_a = (_rand(*t.shape, t.dtype, g) for t in (ref_o, ref_a))
    grads = torch.autograd.grad((o, a), leaves, (g_o[rows], g_a[rows]))
    ref_grads = [_values(name, t[rows], rank, world) for t in torch.autograd.grad((ref_o, ref_a), fulls, (g_o, g_a))]
    errors = [float((x - y[rows]).detach().abs().max()) for x, y in ((o, ref_o), (a, ref_a))]
    errors += [float((x - y).abs().max()) for x, y in zip(grads, ref_grads)]
    unchanged = all(torch.equal(x, y.detach()) for x, y in zip(before, inputs))
    return {"errors": errors, "inputs unchanged": unchanged}


# --- the tests -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[2, 3], ids=["P=2", "P=3"])
def ranks(request, tmp_path_factory):
    world = request.param
    outdir = tmp_path_factory.mktemp(f"ring{world}")
    try:
        run_ranks(_worker, world, (str(outdir),), timeout_s=LAUNCH_TIMEOUT_S,
                  preload=("torch", "torch.distributed.tensor", "torch_impl", "torch_impl.distributed"))
    except TimeoutError as exc:
        pytest.fail(str(exc))
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        pytest.fail(f"a rank failed:\n{exc}")
    return world, [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(world)]


def test_double_backward_is_refused_on_every_rank(ranks):
    from torch_impl.ring import DOUBLE_BACKWARD
    world, results = ranks
    for res in results:
        assert len(res["double_backward"]) == 4
        for case, outcome in res["double_backward"].items():
            assert outcome == f"RuntimeError: {DOUBLE_BACKWARD}", (case, outcome)
    assert "rows or keys layout" in DOUBLE_BACKWARD


def test_the_named_alternative_gives_the_penalty_gradient(ranks):
    world, results = ranks
    for res in results:
        assert max(res["rows_penalty_errors"]) <= TOL, res["rows_penalty_errors"]


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


def test_count_hops(ranks):
    world, results = ranks
    for res in results:
        outer, inner = res["hops"]["outer"], res["hops"]["inner"]
        assert outer["forward"] == world - 1 and outer["backward"] == world + 1, outer
        assert inner["forward"] == 0 and inner["backward"] == world + 1, inner
        assert inner["backward_bytes"] == outer["backward_bytes"] > 0 and outer["forward_bytes"] > 0, (outer, inner)


def test_count_hops_closes():
    from torch_impl import ring
    with ring.count_hops() as hops:
        assert ring._counters == [hops]
    assert ring._counters == []
    assert_close(hops, {"forward": 0, "backward": 0, "forward_bytes": 0, "backward_bytes": 0})
