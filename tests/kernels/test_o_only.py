"""``torch_impl.attn_o`` on its ATen path (CPU): values, gradients to second order, forward mode, torch.func,
the causal mask (37)-(39), the input contract, and that no n×n tensor is ever created.

The ATen path runs by tiles of at most ``KEY_BLOCK`` keys and ``TILE_ELEMENTS`` elements; the ``small_tiles``
fixture shrinks them so that these small shapes cross several row and key blocks, with tails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attn_contract
import torch_impl
from tests.conftest import ROOT, attn_inputs
from torch_impl.kernels import o_only
from torch_impl.kernels.o_only import AttnOFunction, attn_o_reference


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 8 keys and 8·8·batch elements (batch 2 below: 8 rows), so n = 37 is 5 × 5 tiles with tails."""
    monkeypatch.setattr(o_only, "KEY_BLOCK", 8)
    monkeypatch.setattr(o_only, "TILE_ELEMENTS", 8 * 8 * 2)


def _attn_o(causal):
    return lambda q, k, v: torch_impl.attn_o(q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("n, d, e, batch", [(37, 3, 5, (2,)), (1, 2, 3, ()), (9, 4, 2, (2, 1)), (0, 3, 2, (2,)),
                                            (6, 0, 2, (2,)), (6, 3, 0, (2,)),
                                            (11, 2, 3, (4, 5))])    # 20 stacks: split, 16 per tile
def test_values_and_gradients_match_the_composite(small_tiles, causal, dtype, n, d, e, batch):
    q, k, v = attn_inputs(n, d, e, dtype, batch=batch, requires_grad=True)
    o = torch_impl.attn_o(q, k, v, causal=causal)
    ref = attn_o_reference(q, k, v, causal=causal)
    torch.testing.assert_close(o, ref)
    g = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(o, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_forward_mode_and_double_backward(monkeypatch, causal, dtype):
    monkeypatch.setattr(o_only, "KEY_BLOCK", 3)                 # n = 7: 3 × 3 tiles with a tail
    monkeypatch.setattr(o_only, "TILE_ELEMENTS", 3 * 3 * 2)
    inputs = attn_inputs(7, 2, 3, dtype, batch=(2,), requires_grad=True)
    assert torch.autograd.gradcheck(_attn_o(causal), inputs, check_forward_ad=True, fast_mode=True)
    assert torch.autograd.gradgradcheck(_attn_o(causal), inputs, fast_mode=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_func_grad_jvp_vmap(small_tiles, causal):
    q, k, v = attn_inputs(13, 3, 4, batch=(2,))
    f, ref = _attn_o(causal), lambda q, k, v: attn_o_reference(q, k, v, causal=causal)
    loss = lambda fn: lambda q, k, v: fn(q, k, v).sin().sum()                                 # noqa: E731
    torch.testing.assert_close(torch.func.grad(loss(f), (0, 1, 2))(q, k, v),
                               torch.func.grad(loss(ref), (0, 1, 2))(q, k, v))
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    torch.testing.assert_close(torch.func.jvp(f, (q, k, v), tangents), torch.func.jvp(ref, (q, k, v), tangents))
    # vmap over a new leading dimension, v shared (unbatched): one Function call on the stacks
    qs, ks = q.unsqueeze(0).expand(3, -1, -1, -1) * torch.arange(1., 4.).view(3, 1, 1, 1), k.expand(3, -1, -1, -1)
    torch.testing.assert_close(torch.func.vmap(f, (0, 0, None))(qs, ks, v),
                               torch.func.vmap(ref, (0, 0, None))(qs, ks, v))
    # reverse over vmap, and vmap over grad (the Function's own vmap rule under both)
    torch.testing.assert_close(torch.func.grad(lambda q: torch.func.vmap(f, (0, 0, None))(q, ks, v).sum())(qs),
                               torch.func.grad(lambda q: torch.func.vmap(ref, (0, 0, None))(q, ks, v).sum())(qs))
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(loss(f)), (0, 0, None))(qs, ks, v),
                               torch.func.vmap(torch.func.grad(loss(ref)), (0, 0, None))(qs, ks, v))


def test_causal_row_i_does_not_see_keys_after_i(small_tiles):
    q, k, v = attn_inputs(20, 3, 4, batch=(2,))
    o = torch_impl.attn_o(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 12:, :] += 1.0
    v2[..., 12:, :] -= 2.0
    o2 = torch_impl.attn_o(q, k2, v2, causal=True)
    torch.testing.assert_close(o2[..., :12, :], o[..., :12, :], rtol=0, atol=0)
    assert not torch.allclose(o2[..., 12:, :], o[..., 12:, :])
    # and the gradient of row 0 reaches k and v through key 0 only
    q, k, v = attn_inputs(20, 3, 4, requires_grad=True)
    g_k, g_v = torch.autograd.grad(torch_impl.attn_o(q, k, v, causal=True)[0].sum(), (k, v))
    assert g_k[1:].abs().max() == 0 and g_v[1:].abs().max() == 0 and g_v[0].abs().max() > 0


@pytest.mark.parametrize("wanted", [(True, False, False), (False, True, False), (False, False, True),
                                    (True, False, True)])
def test_only_the_gradients_asked_for(small_tiles, wanted):
    q, k, v = attn_inputs(10, 3, 4, batch=(2,), requires_grad=wanted)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        o = torch_impl.attn_o(q, k, v)
    grads = torch.autograd.grad(o.sum(), [t for t in (q, k, v) if t.requires_grad], retain_graph=True)
    ref = attn_o_reference(q, k, v)
    ref_grads = torch.autograd.grad(ref.sum(), [t for t in (q, k, v) if t.requires_grad])
    torch.testing.assert_close(grads, ref_grads)
    # q and k always (tiles of A are recomputed from them), v only for G_Q or G_K
    assert len(saved) == 2 + (wanted[0] or wanted[1]), len(saved)
    o.sum().backward()
    assert [t.grad is not None for t in (q, k, v)] == list(wanted)


def test_backward_computes_only_the_masked_in_gradients(small_tiles):
    q, k, v = attn_inputs(10, 3, 4)
    g = torch.ones(10, 4, dtype=q.dtype)
    assert o_only.o_only_backward(g, q, k, None, False, (False, False, True))[:2] == (None, None)
    g_q, g_k, g_v = o_only.o_only_backward(g, q, k, v, True, (True, False, False))
    assert g_k is None and g_v is None and g_q.shape == q.shape


def test_inputs_are_not_modified(small_tiles):
    q, k, v = attn_inputs(12, 3, 4, batch=(2,), requires_grad=True)
    before = [t.detach().clone() for t in (q, k, v)]
    versions = [t._version for t in (q, k, v)]
    o = torch_impl.attn_o(q, k, v, causal=True)
    g = torch.ones_like(o)
    torch.autograd.grad(o, (q, k, v), g)
    torch.func.jvp(_attn_o(True), (q.detach(), k.detach(), v.detach()), tuple(before))
    for t, b, ver in zip((q, k, v), before, versions):
        assert torch.equal(t, b) and t._version == ver
    assert torch.equal(g, torch.ones_like(o))


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an ATen op returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def _square(shapes, n):
    return [s for s in shapes if sum(size >= n for size in s) >= 2]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_no_n_by_n_tensor_forward_backward_jvp_double_backward(monkeypatch, causal):
    n = 64
    monkeypatch.setattr(o_only, "KEY_BLOCK", 16)
    monkeypatch.setattr(o_only, "TILE_ELEMENTS", 16 * 16 * 2)
    q, k, v = attn_inputs(n, 3, 4, batch=(2,), requires_grad=True)
    with _Shapes() as rec:
        o = torch_impl.attn_o(q, k, v, causal=causal)
        g_q, g_k, g_v = torch.autograd.grad(o.sin().sum(), (q, k, v), create_graph=True)
        torch.autograd.grad((g_q.sum() + g_k.sum() + g_v.sum()), (q, k, v))
        torch.func.jvp(_attn_o(causal), (q.detach(), k.detach(), v.detach()),
                       tuple(torch.ones_like(t) for t in (q, k, v)))
    assert rec.shapes and not _square(rec.shapes, n), _square(rec.shapes, n)
    assert max(s[-1] * s[-2] for s in rec.shapes if len(s) >= 2) <= 16 * 16       # one tile at most
    with _Shapes() as ref:                      # the check sees the composite's n×n
        attn_o_reference(q, k, v, causal=causal)
    assert _square(ref.shapes, n)


_Q, _V = torch.ones(3, 2), torch.ones(3, 5)


@pytest.mark.parametrize("args, kwargs, exc, text", [
    (([1.0], _Q, _V), {}, TypeError,
     attn_contract.message("type", "attn_o", name="q", accepted="torch.Tensor", type="list")),
    ((_Q, torch.ones(3), _V), {}, ValueError,
     o_only.MESSAGES["ndim"].format(name="k", dims="..., n, d", ndim=1, shape=(3,))),
    ((_Q, _Q, torch.ones(3, 5, dtype=torch.int64)), {}, TypeError,
     attn_contract.message("dtype", "attn_o", name="v", dtype="int64")),
    ((_Q, _Q, _V), {"causal": 1}, TypeError, o_only.MESSAGES["causal"].format(type="int")),
    ((_Q, torch.ones(3, 4), _V), {}, ValueError, o_only.MESSAGES["d"].format(q=(3, 2), k=(3, 4))),
    ((torch.ones(2, 3, 2), torch.ones(1, 3, 2), torch.ones(2, 3, 5)), {}, ValueError,
     o_only.MESSAGES["n"].format(q=(2, 3, 2), k=(1, 3, 2), v=(2, 3, 5))),
    ((_Q, _Q, torch.ones(4, 5)), {}, ValueError, o_only.MESSAGES["n"].format(q=(3, 2), k=(3, 2), v=(4, 5))),
    ((_Q, _Q.double(), _V), {}, TypeError,
     attn_contract.message("same_dtype", "attn_o", q="float32", k="float64", v="float32")),
    ((_Q, _Q.to("meta"), _V), {}, ValueError,
     attn_contract.message("same_device", "attn_o", q="cpu", k="meta", v="cpu")),
])
def test_bad_input_is_named(args, kwargs, exc, text):
    with pytest.raises(exc) as info:
        torch_impl.attn_o(*args, **kwargs)
    assert str(info.value) == text


def test_function_has_the_documented_staticmethods():
    for name in ("forward", "setup_context", "backward", "jvp", "vmap"):
        assert name in vars(AttnOFunction), name


def test_the_environment_switch_turns_the_kernels_off():
    """``TANH_ATTN_FUSED=0`` (read when torch_impl.kernels is imported) is ``use_fused(False)``."""
    code = "import torch_impl.kernels as k; print(k.fused_enabled())"
    for value, expected in (("0", "False"), ("1", "True")):
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TANH_ATTN_FUSED": value})
        assert done.stdout.strip() == expected, done.stderr[-2000:]


# --- autocast (issue 37): the usual training loop, forward under autocast, backward() outside it ---------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_outside_autocast_matches_the_composite_under_autocast(causal, dtype):
    """Red before: the backward recomputed tiles of A in float32 and multiplied them with the bfloat16 G_O
    ("expected m1 and m2 to have the same dtype").  Gradients as the composite's under the same autocast.
    One tile (n below KEY_BLOCK): the same products in the same dtype as the composite's, so the comparison
    can be at float32's tolerance; over several tiles each key block's partial sum is rounded to the autocast
    dtype (as before this fix, without autocast, in bfloat16 inputs)."""
    grads = []
    for fn in (torch_impl.attn_o, attn_o_reference):
        q, k, v = attn_inputs(13, 3, 4, torch.float32, batch=(2,), requires_grad=True, uniform=True)
        with torch.autocast("cpu", dtype):
            o = fn(q, k, v, causal=causal)
            loss = (o.float().sin() * torch.arange(4.0)).sum()
        loss.backward()
        assert o.dtype == dtype
        grads.append((o, q.grad, k.grad, v.grad))
    for got, want in zip(*grads):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_function_computes_in_its_inputs_dtype_under_autocast(small_tiles):
    """AttnOFunction itself computes in its inputs' dtype, forward and backward, whatever autocast is in
    effect (attn_o casts for autocast before applying it; its in-place tiles and the Triton kernels are not
    autocast's): applied under autocast, or differentiated under an autocast opened around the backward, it
    gives float32's values and gradients on float32 inputs.  (The second order is taken outside autocast: the
    engine runs the recorded ops' own backward under the caller's autocast, the composite's too.)"""
    q, k, v = attn_inputs(13, 3, 4, torch.float32, batch=(2,), requires_grad=True, uniform=True)
    want_o = attn_o_reference(q, k, v, causal=True)
    want = torch.autograd.grad(want_o.sin().sum(), (q, k, v), create_graph=True)
    want2 = torch.autograd.grad(sum(g.square().sum() for g in want), (q, k, v))
    with torch.autocast("cpu", torch.bfloat16):
        o = AttnOFunction.apply(q, k, v, True)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o, want_o)
    with torch.autocast("cpu", torch.bfloat16):
        got = torch.autograd.grad(o.sin().sum(), (q, k, v), create_graph=True)
    got2 = torch.autograd.grad(sum(g.square().sum() for g in got), (q, k, v))
    for g, w in zip((*got, *got2), (*want, *want2)):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w)


# --- nested tensors (issue 37): refused naming the argument, before anything reads their sizes ---------------
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
@pytest.mark.parametrize("layout", ["strided", "jagged"])
@pytest.mark.parametrize("index", [0, 1, 2])
def test_nested_tensor_is_refused_naming_it(layout, index):
    """Red before: q passed the contract, then "Internal error: NestedTensorImpl doesn't support sizes"
    (strided layout) or "ge: relation is indeterminate" (jagged)."""
    parts = [torch.randn(3, 4), torch.randn(5, 4)]
    nested = torch.nested.nested_tensor(parts, layout=getattr(torch, layout))
    args = [torch.randn(2, 5, 4)] * 3
    args[index] = nested
    name = "qkv"[index]
    with pytest.raises(TypeError) as info:
        torch_impl.attn_o(*args)
    assert str(info.value) == attn_contract.message("nested", "attn_o", name=name, layout=layout)
