"""The sharded entries with a loss of each rank's own (issue 37): the second order with a gradient penalty, and an
in-place write on an output gradient between the orders.

On 2 gloo ranks (a short process-group timeout: a rank left waiting in a collective the other never enters fails
the test in seconds instead of hanging it), for the rules layouts (``torch_impl.attn`` on DTensors: rows,
replicate, keys, q, k, v all ``Shard(0)``) and the ring (``ring_attn`` on DTensors):

* **rank-dependent losses**: rank 0's loss reads ``o.to_local()`` (linear), rank 1's ``a.to_local()``
  (``|a|²``), or rank 0 both and rank 1 ``a`` only; then ``create_graph=True``, a penalty ‖G_K‖² read by every
  rank (``full_tensor()``) and the second-order backward.  Where the outputs are ``Shard(0)`` (rows, ring) each
  rank's local output is its rows, so the truth is autograd of ``attn_reference`` on the full tensors with the
  ranks' losses summed; elsewhere (replicate, keys: ``to_local``'s own gradient convention for Replicate and
  Partial outputs) it is ``attn_reference`` on the same DTensors.  n = 4, 3 (uneven) and 1 (an empty shard),
  float64 and complex128.  Before the fix the rows layout hung (a rank's graph reached v, the other's did not:
  one rank alone in the all-reduce behind v's redistribution), and the ring on DTensors hung (each rank decided
  from its own cotangents what travels).
* **in-place writes between the orders** on ``grad_o`` (every entry) and ``grad_a`` (the ring): autograd's
  "modified by an inplace operation" on every rank, as autograd of ``attn_reference`` on DTensors gives; a write
  on ``a`` between the orders likewise; a write on ``grad_a`` in the rules layouts, which no graph of (33)-(35)
  saves (it is a sum term), changes nothing and gives the reference's numbers, as the reference does.

Each rank records what every check did; the test process assembles the gradients from the ranks' local parts
(a Partial's terms summed, shards concatenated), so no check needs a collective to report.
"""

from __future__ import annotations

import pytest
import torch

from tests.support import gloo
from tests.support.inputs import block_inputs, uniform

PG_TIMEOUT_S = 10          # a rank left waiting in a collective raises after this instead of hanging
LAUNCH_TIMEOUT_S = 300
INPLACE = "modified by an inplace operation"
WORLD = 2


def _loss(kind, rank, o_local, a_local):
    """Rank ``rank``'s loss of its local outputs."""
    sq = (a_local * a_local.conj()).real.sum()
    if kind == "o | a":                    # rank 0 reads o (linear), rank 1 reads a
        return (o_local * 1.5).real.sum() if rank == 0 else sq
    if kind == "o+a | a":                  # rank 0 reads both, rank 1 a only
        return (o_local.real.sum() + sq) if rank == 0 else a_local.real.sum()
    raise AssertionError(kind)


def _parts(x):
    """What the test process needs to assemble a DTensor gradient: its local part, placement, global shape."""
    return None if x is None else (x.to_local().detach().clone(), str(x.placements[0]), tuple(x.shape))


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:                    # noqa: BLE001 -- the type and message are the result
        return ("raised", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


RANK_LOSS_CASES = [(layout, kind, n, dtype)
                   for layout in ("rows", "ring", "keys", "replicate", "all_shard0")
                   for kind in ("o | a", "o+a | a")
                   for n, dtype in ((4, torch.float64), (3, torch.complex128), (1, torch.float64))]
INPLACE_CASES = [(layout, what) for layout in ("rows", "keys", "replicate", "all_shard0", "ring")
                 for what in ("grad_o", "grad_a", "a")]


def _to_local_twice(mesh) -> bool:
    """Whether this torch's ``DTensor.to_local()`` is differentiable twice: whether a loss nonlinear in a local
    tensor gets the second-order term through its own cotangent.  torch 2.11's is differentiable once (its
    backward builds the cotangent's DTensor outside autograd: the second derivative of ``(x.to_local()**3).sum()``
    comes back None); 2.13's twice.  Every loss here is nonlinear in a local output, so the truth follows it."""
    from torch.distributed.tensor import Shard, distribute_tensor
    x = distribute_tensor(torch.ones(4, 1, dtype=torch.float64), mesh, [Shard(0)]).requires_grad_()
    g, = torch.autograd.grad(((x * 1.0).to_local() ** 3).sum(), (x,), create_graph=True)
    second, = torch.autograd.grad(g.to_local().sum(), (x,), allow_unused=True)
    return second is not None


def _checks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    import torch_impl
    from crosscheck.shards.torch_layouts import distribute_inputs
    from torch_impl.sharded.layouts import LAYOUTS

    mesh = init_device_mesh("cpu", (world,))
    out = {"rank_losses": {}, "inplace": {}, "to_local_twice": _to_local_twice(mesh)}

    def penalty_second_order(fn, dts, kind):
        o, a = fn(*dts)
        loss = _loss(kind, rank, o.to_local(), a.to_local())
        grads = torch.autograd.grad(loss, dts, create_graph=True, allow_unused=True)
        pen = (grads[1].full_tensor().abs() ** 2).sum()
        second = torch.autograd.grad(loss + pen, dts, allow_unused=True)
        return {"placements": (str(o.placements[0]), str(a.placements[0])),
                "first": [_parts(g) for g in grads], "second": [_parts(g) for g in second]}

    for layout, kind, n, dtype in RANK_LOSS_CASES:
        lay = LAYOUTS[layout]
        q, k, v = block_inputs(n, n, dtype=dtype, seed=n + 7)
        out["rank_losses"][(layout, kind, n, str(dtype))] = _outcome(
            lambda: penalty_second_order(lay.fn, [t.requires_grad_() for t in distribute_inputs(mesh, lay, q, k, v)],
                                         kind))

    def write_between_orders(fn, layout, what):
        lay = LAYOUTS[layout]
        q, k, v = block_inputs(4, 4, dtype=torch.float64, seed=4 + 7)
        g = torch.Generator().manual_seed(3)
        dts = [t.requires_grad_() for t in distribute_inputs(mesh, lay, q, k, v)]
        o, a = fn(*dts)
        cots = [distribute_tensor(uniform(*t.shape, dtype=torch.float64, g=g), mesh,
                                  [Replicate() if t.placements[0].is_partial() else t.placements[0]])
                for t in (o, a)]
        grads = torch.autograd.grad((o, a), dts, cots, create_graph=True)
        with torch.no_grad():
            {"grad_o": cots[0], "grad_a": cots[1], "a": a}[what].mul_(2)
        ws = [distribute_tensor(uniform(*t.shape, dtype=torch.float64, g=g), mesh,
                                [Replicate() if t.placements[0].is_partial() else t.placements[0]]) for t in grads]
        second = torch.autograd.grad(grads, dts, ws, allow_unused=True)
        return [None if s is None else s.full_tensor() for s in second]

    for layout, what in INPLACE_CASES:
        for entry, fn in (("lab", LAYOUTS[layout].fn), ("reference", torch_impl.attn_reference)):
            out["inplace"][(layout, what, entry)] = _outcome(lambda: write_between_orders(fn, layout, what))
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return gloo.rank_results(_checks, WORLD, tmp_path_factory.mktemp("rank_losses"), timeout_s=LAUNCH_TIMEOUT_S,
                             pg_timeout_s=PG_TIMEOUT_S)


def _full(parts):
    """A DTensor gradient from every rank's ``_parts`` (None on a rank: no term / zeros there)."""
    defined = [p for p in parts if p is not None]
    if not defined:
        return None
    placement, shape, like = defined[0][1], defined[0][2], defined[0][0]
    if placement.startswith("P"):
        return sum(p[0] for p in defined)
    if placement == "R":
        assert all(torch.equal(p[0], like) for p in defined), "a Replicate gradient differs between ranks"
        return like
    dim = int(placement[2:-1])
    zeros = torch.zeros(shape, dtype=like.dtype).chunk(len(parts), dim)
    return torch.cat([p[0] if p is not None else zeros[r] for r, p in enumerate(parts)], dim)


def _chunk(t, dim, r):
    """Rank r's part of ``t`` under ``Shard(dim)`` (``torch.chunk``'s split, as DTensor; empty past the end)."""
    size = -(-t.shape[dim] // WORLD)
    return t.narrow(dim, min(r * size, t.shape[dim]), max(0, min(size, t.shape[dim] - r * size)))


def _truth(placements, kind, n, dtype, ranks, through_cotangents=True):
    """Autograd of ``attn_reference`` on the full tensors: the losses of ``ranks`` of what each holds locally,
    summed, then the penalty ‖G_K‖².  What a rank holds: its rows of o and a (rows, ring: ``Shard(0)``); its key
    block's term of o and columns of a (keys: o ``Partial``, whose ``to_local`` gradient DTensor takes as
    Replicate, a ``Shard(1)``); the whole of both (replicate: then each rank's gradients are its own loss's,
    ``Replicate`` DTensors that differ between ranks, as DTensor's own ops give them too).  ``through_cotangents``
    False: the second order without the terms through the losses' own cotangents, which a torch whose
    ``to_local`` is differentiable once drops (``_to_local_twice``); the entries' own terms are all there."""
    import torch_impl
    q, k, v = (t.requires_grad_() for t in block_inputs(n, n, dtype=dtype, seed=n + 7))
    o, a = torch_impl.attn_reference(q, k, v)

    def held(r):
        if placements == ("S(0)", "S(0)"):
            return _chunk(o, 0, r), _chunk(a, 0, r)
        if placements == ("P(sum)", "S(1)"):
            return _chunk(a, 1, r) @ _chunk(v, 0, r), _chunk(a, 1, r)
        assert placements == ("R", "R"), placements
        return o, a
    loss = sum(_loss(kind, r, *held(r)) for r in ranks)
    if through_cotangents:
        first = torch.autograd.grad(loss, (q, k, v), create_graph=True, allow_unused=True)
    else:      # to_local differentiable once: each rank's cotangents of its local outputs enter as constants
        outputs = [t for r in ranks for t in held(r)]
        leaves = [t.detach().requires_grad_() for t in outputs]       # (a is o's ancestor: not through o)
        cotangents = torch.autograd.grad(sum(_loss(kind, r, *leaves[2 * i:2 * i + 2]) for i, r in enumerate(ranks)),
                                         leaves, allow_unused=True)
        used = [(t, c) for t, c in zip(outputs, cotangents) if c is not None]
        first = torch.autograd.grad([t for t, _ in used], (q, k, v), [c for _, c in used], create_graph=True,
                                    allow_unused=True)
    pen = (first[1].abs() ** 2).sum()
    return {"first": first, "second": torch.autograd.grad(loss + pen, (q, k, v), allow_unused=True)}


def _mine(full, placement, r):
    """Rank r's local part of the full tensor ``full`` in ``placement``."""
    return _chunk(full, int(placement[2:-1]), r) if placement.startswith("S") else full


def _err(x, y):
    """max |x − y| relative to max(1, max |y|), None as zeros."""
    x = 0 if x is None else x.detach()
    y = None if y is None else y.detach()
    scale = 1.0 if y is None else max(1.0, float(y.abs().max())) if y.numel() else 1.0
    y = 0 if y is None else y
    d = x - y
    return float(d.abs().max()) / scale if isinstance(d, torch.Tensor) and d.numel() else 0.0


@pytest.mark.parametrize("layout, kind, n, dtype", RANK_LOSS_CASES, ids=lambda x: str(x).replace(" ", ""))
def test_rank_dependent_losses_second_order(ranks, layout, kind, n, dtype):
    """No rank waits or raises, and the first and second order (penalty ‖G_K‖²) are the truth's."""
    key = (layout, kind, n, str(dtype))
    got = [r["rank_losses"][key] for r in ranks]
    for outcome in got:
        assert outcome[0] == "ok", (key, outcome)
    placements = got[0][1]["placements"]
    twice = all(r["to_local_twice"] for r in ranks)
    if n >= WORLD:                 # (n < P: DTensor's propagation may take any layout into replicate)
        assert placements == {"rows": ("S(0)", "S(0)"), "ring": ("S(0)", "S(0)"), "replicate": ("R", "R"),
                              "keys": ("P(sum)", "S(1)"), "all_shard0": ("P(sum)", "S(1)")}[layout]
    if placements == ("R", "R"):   # each rank's gradients are its own loss's: its part of them
        # Where DTensor took sharded inputs into the replicate layout (n < P), a rank's own loss of a Replicate
        # output breaks DTensor's contract (to_local's gradient is taken as the same on every rank, and the
        # gradients of the Shard(0) inputs are then mixed across ranks by DTensor's own accumulation): there only
        # the first order, and that no rank waits or raises.
        orders = ("first", "second") if layout == "replicate" else ("first",)
        for r in range(WORLD):
            truth = _truth(placements, kind, n, dtype, [r], twice)
            for order in orders:
                parts = got[r][1][order]
                errors = [_err(None, truth[order][i]) if parts[i] is None else
                          _err(parts[i][0], _mine(truth[order][i], parts[i][1], r)) for i in range(3)]
                assert max(errors) <= 1e-12, (key, r, order, errors)
        return
    truth = _truth(placements, kind, n, dtype, range(WORLD), twice)
    for order in ("first", "second"):
        errors = [_err(_full([got[r][1][order][i] for r in range(WORLD)]), truth[order][i]) for i in range(3)]
        assert max(errors) <= 1e-12, (key, order, errors)      # float64 / complex128: measured ≤ 2e-15


@pytest.mark.parametrize("layout, what", INPLACE_CASES)
def test_inplace_write_between_orders(ranks, layout, what):
    """A write on grad_o, grad_a or a after the create_graph backward: raised on every rank where autograd of the
    reference raises; where the reference does not raise (grad_a in the rules layouts: no graph saves it), the
    same numbers.  The ring saves grad_a itself (its double backward reads it), so it raises there."""
    lab = [r["inplace"][(layout, what, "lab")] for r in ranks]
    ref = [r["inplace"][(layout, what, "reference")] for r in ranks]
    raises = ref[0][0] == "raised" or (layout == "ring" and what == "grad_a")
    for got, want in zip(lab, ref):
        if raises:
            assert got[0] == "raised" and INPLACE in got[1], (layout, what, got, want)
        else:
            assert got[0] == "ok", (layout, what, got)
            assert want[0] == "ok", (layout, what, want)
            errors = [_err(x, y) for x, y in zip(got[1], want[1])]
            assert max(errors) <= 1e-12, (layout, what, errors)

