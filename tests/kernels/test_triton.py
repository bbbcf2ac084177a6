"""The Triton kernels (torch_impl/kernels/triton_attn.py) against the composite, and the entries that dispatch to
them (``attn_o``, and ``torch_impl.attn`` through ``AttnFunction``).

Without a GPU the kernels run under triton's interpreter on CPU tensors (tests/conftest.py sets
``TRITON_INTERPRET=1`` before triton is imported), and the dispatch tests put ``"cpu"`` in ``kernels.DEVICES``.
The interpreter runs the programs one after another: it checks the tiling, masks, tails and flags, not races,
TF32 or speed (docs/kernels.md).  Shapes stay small (n ≤ 100) with tiles of 16 / 32 so that every tile has a
tail; d ≠ e throughout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.autograd import forward_ad

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

import torch_impl  # noqa: E402
from tests.conftest import ROOT, attn_inputs  # noqa: E402
from torch_impl import kernels  # noqa: E402
from torch_impl.kernels import o_only  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1 (set it before triton is imported)", allow_module_level=True)

T = kernels.triton_module()
if T is None:
    pytest.skip("triton does not import here", allow_module_level=True)


@triton.jit
def _loop_probe(X, N, B: triton.language.constexpr):
    acc = 0.0
    for _ in range(0, N, B):
        acc += 1.0
    triton.language.store(X, acc)


def _interpreter_problem() -> str:
    """Why this triton's interpreter cannot run the kernels' loops (a ``range`` over a runtime bound), or ''.
    Observed with triton 3.6.0 (what torch 2.11 installs) and numpy 2.5.5: its interpreter's ``__index__`` calls
    ``int()`` on an array that numpy refuses to convert ("only 0-dimensional arrays ...").  The skip is decided by
    running such a loop, not by version.  Compiled on a GPU the same loop is plain."""
    x = torch.zeros(1)
    try:
        _loop_probe[(1,)](x, 8, 4)
    except Exception as exc:                                   # noqa: BLE001 - any failure means: cannot run here
        return (f"triton {triton.__version__}'s interpreter cannot run a loop over a runtime bound here "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    return "" if x.item() == 2.0 else f"triton {triton.__version__}'s interpreter miscounts a loop ({x.item()} != 2)"


if DEVICE == "cpu" and _interpreter_problem():
    pytest.skip(_interpreter_problem(), allow_module_level=True)


@pytest.fixture(autouse=True, params=[DEVICE], ids=["cuda" if DEVICE == "cuda" else "cpu-interpreted"])
def _device_id(request):
    """Every test id names where the kernels ran, so that ``pytest -k cuda`` (scripts/gpu_check.py) selects them
    on a GPU machine."""

# Relative Frobenius error allowed against the float64 composite: float32 accumulates in float32 throughout; float16 and
# bfloat16 round the inputs, the tile of A before (3) and each stored result (8 and 11 significant bits).
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _close(actual, expected, dtype):
    actual, expected = actual.double(), expected.double()
    err = (actual - expected).norm() / expected.norm().clamp_min(1e-30)
    assert err <= RTOL[dtype], (float(err), RTOL[dtype])


def _inputs(B, n, d, e, dtype, seed=0):
    """U[-1, 1) entries: q kᵀ stays of order one, where tanh is not saturated (where it is, 1 − A² from a rounded
    A has no correct digits in any low precision, ATen's included, and a relative check would measure that)."""
    q, k, v = attn_inputs(n, d, e, torch.float64, batch=(B,), seed=seed, uniform=True)
    return [t.to(DEVICE, dtype) for t in (q, k, v)]


def _reference(q, k, v, causal=False, g_o=None, g_a=None):
    """``(o, a)`` of the composite in float64 and, given cotangents, its gradients (G_A None: o only)."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    a = torch.tanh(q @ k.mT)
    if causal:
        a = a.masked_fill(~torch.ones(a.shape[-2:], dtype=torch.bool, device=a.device).tril(), 0)
    o = a @ v
    if g_o is None and g_a is None:
        return o.detach(), a.detach()
    outs = [t for t, g in ((o, g_o), (a, g_a)) if g is not None]
    grads = torch.autograd.grad(outs, (q, k, v), [g.double() for g in (g_o, g_a) if g is not None],
                                allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, (q, k, v)))


F32, F16 = torch.float32, torch.float16
# (B, n, d, e, dtype): tails in n, d and e; n = 1 is one entry of one tile
CASES = [(1, 1, 16, 16, F32), (2, 33, 5, 7, F32), (1, 100, 24, 9, F32), (1, 1, 16, 16, F16), (2, 33, 5, 7, F16)]


def _ids(cases):
    return [f"B{B}-n{n}-d{d}-e{e}-{str(dtype).removeprefix('torch.')}" for B, n, d, e, dtype in cases]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("B, n, d, e, dtype", CASES, ids=_ids(CASES))
def test_o_only_kernels(B, n, d, e, dtype, causal):
    q, k, v = _inputs(B, n, d, e, dtype)
    g_o = torch.randn(B, n, e, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    o = T.o_only_forward(q, k, v, causal, block_q=16, block_k=32)
    _close(o, _reference(q, k, v, causal)[0], dtype)
    grads = T.o_only_backward(g_o, q, k, v, causal, block_q=32, block_k=16)
    for got, want in zip(grads, _reference(q, k, v, causal, g_o=g_o)):
        _close(got, want, dtype)


def test_o_only_kernels_bfloat16():
    q, k, v = _inputs(2, 33, 5, 7, torch.bfloat16)
    g_o = torch.randn(2, 33, 7).to(DEVICE, torch.bfloat16)
    _close(T.o_only_forward(q, k, v, True, block_q=16, block_k=16), _reference(q, k, v, True)[0], torch.bfloat16)
    for got, want in zip(T.o_only_backward(g_o, q, k, v, True, block_q=16, block_k=16),
                         _reference(q, k, v, True, g_o=g_o)):
        _close(got, want, torch.bfloat16)


def test_o_only_backward_where_tanh_saturates():
    """q kᵀ between 8 and 11: 1 − A² is 10⁻⁹ to 10⁻⁷, below float32's resolution of A near 1, so it is taken
    from the recomputed exponential (41); from the rounded A the gradients of q and k would be 6 % to 100 % off."""
    gen = torch.Generator().manual_seed(3)
    q = (0.75 + 0.05 * torch.rand(1, 20, 16, generator=gen, dtype=torch.float64)).to(DEVICE, torch.float32)
    k = (0.75 + 0.05 * torch.rand(1, 20, 16, generator=gen, dtype=torch.float64)).to(DEVICE, torch.float32)
    v = torch.randn(1, 20, 9, generator=gen).to(DEVICE)
    g_o = torch.randn(1, 20, 9, generator=gen).to(DEVICE)
    x = q.double() @ k.double().mT
    assert 8 < x.min() and x.max() < 11
    g_q, g_k, _ = T.o_only_backward(g_o, q, k, v, False, block_q=16, block_k=16)
    want = _reference(q, k, v, g_o=g_o)
    _close(g_q, want[0], torch.float32)
    _close(g_k, want[1], torch.float32)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False), (False, False, True)])
def test_o_only_backward_computes_only_what_is_asked(mask):
    q, k, v = _inputs(1, 33, 5, 7, torch.float32)
    g_o = torch.randn(1, 33, 7).to(DEVICE)
    grads = T.o_only_backward(g_o, q, k, v if mask[0] or mask[1] else None, False, mask, block_q=16, block_k=16)
    assert [g is not None for g in grads] == list(mask)
    (got,) = [g for g in grads if g is not None]
    (want,) = [w for w, m in zip(_reference(q, k, v, g_o=g_o), mask) if m]
    _close(got, want, torch.float32)


@pytest.mark.parametrize("B, n, d, e, dtype", FUSED_CASES := [(2, 33, 5, 7, F32), (1, 100, 24, 9, F32),
                                                               (2, 33, 5, 7, F16)], ids=_ids(FUSED_CASES))
def test_fused_kernels(B, n, d, e, dtype):
    q, k, v = _inputs(B, n, d, e, dtype)
    gen = torch.Generator().manual_seed(2)
    g_o = torch.randn(B, n, e, generator=gen).to(DEVICE, dtype)
    g_a = torch.randn(B, n, n, generator=gen).to(DEVICE, dtype)
    o, a = T.fused_forward(q, k, v, block_q=16, block_k=32)
    o_ref, a_ref = _reference(q, k, v)
    _close(o, o_ref, dtype)
    _close(a, a_ref, dtype)
    for g_o_, g_a_ in ((g_o, g_a), (g_o, None), (None, g_a)):
        grads = T.fused_backward(g_o_, g_a_, q, k, v, a, block_q=32, block_k=16)
        for got, want in zip(grads, _reference(q, k, v, g_o=g_o_, g_a=g_a_)):
            if got is None:                                  # G_V with no G_O: the zero never built
                assert g_o_ is None and not want.any()
            else:
                _close(got, want, dtype)


def test_fused_backward_reads_only_what_was_saved():
    """q only for G_K, k only for G_Q, v only when G_O reaches q or k (section 6): the others may be None."""
    q, k, v = _inputs(1, 33, 5, 7, torch.float32)
    g_o = torch.randn(1, 33, 7).to(DEVICE)
    o, a = T.fused_forward(q, k, v, block_q=16, block_k=16)
    want = _reference(q, k, v, g_o=g_o)
    g_q, g_k, g_v = T.fused_backward(g_o, None, None, k, v, a, (True, False, False), block_q=16, block_k=16)
    assert g_k is None and g_v is None
    _close(g_q, want[0], torch.float32)
    g_q, g_k, g_v = T.fused_backward(g_o, None, None, None, None, a, (False, False, True), block_q=16, block_k=16)
    assert g_q is None and g_k is None
    _close(g_v, want[2], torch.float32)


def test_rows_over_128_use_the_width_256_configs():
    """d or e above 128: the width-256 entry of the launch table (smaller tiles); values unchanged."""
    q, k, v = _inputs(1, 40, 130, 9, torch.float32)
    assert T.width_of(130, 9) == 256
    with T.record_launches("sm_90a") as launches:
        T.o_only_forward(q.to("meta"), k.to("meta"), v.to("meta"), True)
    assert launches[0].configs == T.launch_configs("sm_90a", "fp32", "o_forward", 256)
    _close(T.o_only_forward(q, k, v, True), _reference(q, k, v, True)[0], torch.float32)


def test_empty_sizes():
    for B, n, d, e in [(0, 4, 3, 2), (2, 0, 3, 2), (2, 5, 0, 2), (2, 5, 3, 0)]:
        q, k, v = _inputs(B, n, d, e, torch.float32)
        o, a = T.fused_forward(q, k, v)
        torch.testing.assert_close(o, _reference(q, k, v)[0].float())
        torch.testing.assert_close(T.o_only_forward(q, k, v, True), _reference(q, k, v, True)[0].float())
        grads = T.o_only_backward(torch.ones_like(o), q, k, v, True)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


# --- the entries on the kernels ---------------------------------------------------------------------------------
@pytest.fixture
def on_kernels(monkeypatch):
    """Send this device's float16 / bfloat16 / float32 tensors to the Triton kernels, with 16×16 tiles."""
    monkeypatch.setattr(kernels, "DEVICES", ("cuda", DEVICE))
    kernels.use_fused(True)
    with T.tiles(16, 16):
        yield


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen ops called, the shapes they return, and how many new buffers of at least ``nbytes`` they
    allocate (an output whose storage is none of the inputs': not a view, not an in-place or out= write)."""

    def __init__(self, nbytes=None):
        super().__init__()
        self.ops, self.shapes, self.nbytes, self.new_buffers = [], [], nbytes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append(func.overloadpacket.__name__)
        given = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
                storage = t.untyped_storage()
                if self.nbytes is not None and storage.nbytes() >= self.nbytes and storage.data_ptr() not in given:
                    self.new_buffers += 1
        return out


def test_attn_o_runs_the_kernels_and_no_square_tensor(on_kernels):
    n = 48
    q, k, v = (t.requires_grad_() for t in _inputs(2, n, 5, 7, torch.float32))
    before = [t.detach().clone() for t in (q, k, v)]
    with _Ops() as rec:
        o = torch_impl.attn_o(q.unflatten(0, (1, 2)), k.unflatten(0, (1, 2)), v.unflatten(0, (1, 2)), causal=True)
        grads = torch.autograd.grad(o.sin().sum(), (q, k, v))
    assert not {"mm", "bmm", "matmul", "tanh"} & set(rec.ops), rec.ops          # the kernels did the math
    assert not [s for s in rec.shapes if sum(x >= n for x in s) >= 2]
    assert all(torch.equal(t, b) for t, b in zip((q, k, v), before))             # inputs unchanged
    ref_o = _reference(q, k, v, True)[0]
    _close(o.flatten(0, 1), ref_o, torch.float32)
    for got, want in zip(grads, _reference(q, k, v, True, g_o=torch.cos(ref_o).float())):
        _close(got, want, torch.float32)


def test_attn_o_forward_mode_on_the_kernels(on_kernels):
    """torch.func.jvp: the forward on the kernel, the tangent by ATen's blocks (36), (39)."""
    q, k, v = _inputs(2, 33, 5, 7, torch.float32)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    o, o_dot = torch.func.jvp(lambda q, k, v: torch_impl.attn_o(q, k, v, causal=True), (q, k, v), tangents)
    d = lambda t: t.double()                                                              # noqa: E731
    o_ref, o_dot_ref = torch.func.jvp(lambda q, k, v: o_only.attn_o_reference(q, k, v, causal=True),
                                      tuple(map(d, (q, k, v))), tuple(map(d, tangents)))
    _close(o, o_ref, torch.float32)
    _close(o_dot, o_dot_ref, torch.float32)


def test_attn_o_double_backward_runs_the_differentiable_blocks(on_kernels):
    """create_graph=True: the backward runs ATen's blocks (differentiable), not the kernels; the second order
    matches the composite's."""
    q, k, v = (t.requires_grad_() for t in _inputs(1, 20, 3, 4, torch.float32))
    g = torch.autograd.grad(torch_impl.attn_o(q, k, v, causal=True).sin().sum(), (q, k), create_graph=True)
    second = torch.autograd.grad(g[0].sum() + g[1].square().sum(), (q, k, v))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    gr = torch.autograd.grad(o_only.attn_o_reference(qd, kd, vd, causal=True).sin().sum(), (qd, kd),
                             create_graph=True)
    for got, want in zip(second, torch.autograd.grad(gr[0].sum() + gr[1].square().sum(), (qd, kd, vd))):
        _close(got, want, torch.float32)


_LOSSES = {"o": lambda o, a: o.sin().sum(), "a": lambda o, a: a.square().sum(),
           "both": lambda o, a: o.sin().sum() + a.square().sum()}


@pytest.mark.parametrize("wanted", [(True, True, True), (True, False, False), (False, False, True)])
@pytest.mark.parametrize("outputs", ["o", "a", "both"])
def test_attn_runs_the_fused_kernels(on_kernels, wanted, outputs):
    n = 40
    q, k, v = _inputs(1, n, 5, 7, torch.float32)
    q, k, v = (t[0].requires_grad_(w) for t, w in zip((q, k, v), wanted))
    before = [t.detach().clone() for t in (q, k, v)]
    loss = _LOSSES[outputs]
    with _Ops(nbytes=n * n * 4) as rec:
        o, a = torch_impl.attn(q, k, v)
        grads = torch.autograd.grad(loss(o, a), [t for t in (q, k, v) if t.requires_grad], allow_unused=True)
    assert not {"mm", "bmm", "addmm", "matmul", "tanh", "tanh_backward"} & set(rec.ops), rec.ops
    # the n×n buffers: a, and those of the loss itself (a.square() and its backward), measured on a leaf; not
    # G_A's zeros when a is unused, not Ĝ_A, not G_X
    leaf = a.detach().requires_grad_()
    with _Ops(nbytes=n * n * 4) as loss_only:
        if outputs != "o":
            torch.autograd.grad(loss(o.detach(), leaf), (leaf,))
    assert rec.new_buffers == 1 + loss_only.new_buffers, (rec.new_buffers, loss_only.new_buffers)
    assert all(torch.equal(t, b) for t, b in zip((q, k, v), before))             # inputs unchanged
    o_ref, a_ref = _reference(q, k, v)
    _close(o, o_ref, torch.float32)
    _close(a, a_ref, torch.float32)
    g_o = torch.cos(o_ref) if outputs != "a" else None
    g_a = 2 * a_ref if outputs != "o" else None
    want = [w for w, m in zip(_reference(q, k, v, g_o=g_o, g_a=g_a), wanted) if m]
    for got, w in zip(grads, want):
        if got is None:
            assert outputs == "a" and not w.any()           # G_V without G_O: a zero, not built
        else:
            _close(got, w, torch.float32)


def test_attn_fused_vmap_and_double_backward(on_kernels):
    q, k, v = (t.requires_grad_() for t in _inputs(3, 20, 5, 7, torch.float32))
    o, a = torch.func.vmap(torch_impl.attn)(q, k, v)
    o_ref, a_ref = _reference(q, k, v)
    _close(o, o_ref, torch.float32)
    _close(a, a_ref, torch.float32)
    # create_graph=True: AttnFunction's backward runs the differentiable formulas, not the kernels
    g_q, = torch.autograd.grad(torch_impl.attn(q[0], k[0], v[0]).o.sin().sum(), (q,), create_graph=True)
    second = torch.autograd.grad(g_q.square().sum(), (k,))[0][0]
    qd, kd, vd = (t[0].detach().double().requires_grad_() for t in (q, k, v))
    gr, = torch.autograd.grad((torch.tanh(qd @ kd.mT) @ vd).sin().sum(), (qd,), create_graph=True)
    _close(second, torch.autograd.grad(gr.square().sum(), (kd,))[0], torch.float32)


@pytest.mark.parametrize("entry", ["attn", "attn_o"])
def test_forward_over_reverse_hvp_leaves_the_kernels(on_kernels, entry):
    """A backward run on dual tensors (forward-over-reverse: forward_ad around autograd.grad, grad mode off) must
    not reach the kernels, which would drop the tangents (kernels.differentiated): the HVP equals the composite's."""
    fwd = forward_ad
    q, k, v = _inputs(1, 20, 5, 7, torch.float32)
    q, k, v = q[0], k[0], v[0]
    t = tuple(torch.randn_like(x) for x in (q, k, v))
    f = (lambda q, k, v: torch_impl.attn(q, k, v).o) if entry == "attn" else torch_impl.attn_o

    def hvp(fn, dtype):
        with fwd.dual_level():
            leaves = tuple(x.detach().to(dtype).requires_grad_() for x in (q, k, v))
            duals = tuple(fwd.make_dual(x, ti.to(dtype)) for x, ti in zip(leaves, t))
            grads = torch.autograd.grad(fn(*duals).sin().sum(), duals)
            return [fwd.unpack_dual(g).tangent for g in grads]

    got = hvp(f, torch.float32)
    want = hvp(lambda q, k, v: torch.tanh(q @ k.mT) @ v, torch.float64)
    for g, w in zip(got, want):
        _close(g, w, torch.float32)


def test_the_switch_sends_attn_to_aten(on_kernels):
    q, k, v = _inputs(1, 20, 5, 7, torch.float32)
    kernels.use_fused(False)
    try:
        with _Ops() as rec:
            torch_impl.attn(q[0], k[0], v[0])
            torch_impl.attn_o(q, k, v)
        assert "mm" in rec.ops and "bmm" in rec.ops
    finally:
        kernels.use_fused(True)
    for dtype in (torch.float64, torch.complex64):             # ATen for these whatever the switch
        assert not kernels.triton_applies(q.to(dtype))


def test_fused_operator_registered_with_autograd_and_refuses_create_graph():
    q, k, v = (t.requires_grad_() for t in _inputs(1, 20, 5, 7, torch.float32))
    o, a = torch.ops.attn_lab.fused_forward(q, k, v, "ieee")
    with _Ops(nbytes=20 * 20 * 4) as rec:
        grads = torch.autograd.grad(o.sin().sum(), (q, k, v), retain_graph=True)
    assert rec.new_buffers == 0                           # a unused: its gradient stays None, no n×n zeros
    for got, want in zip(grads, _reference(q, k, v, g_o=torch.cos(o.detach()))):
        _close(got, want, torch.float32)
    with pytest.raises(NotImplementedError, match="create_graph"):
        torch.autograd.grad(o.sin().sum(), (q,), create_graph=True)


def test_dot_precision_follows_the_tf32_setting():
    assert kernels.dot_precision(torch.float16) == "ieee"
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch < 2.9: the legacy allow_tf32 flag only")
    saved = matmul.fp32_precision
    try:
        matmul.fp32_precision = "ieee"
        assert kernels.dot_precision(torch.float32) == "ieee"
        matmul.fp32_precision = "tf32"
        assert kernels.dot_precision(torch.float32) == "tf32"
    finally:
        matmul.fp32_precision = saved


def test_operators_have_fake_kernels():
    """Under FakeTensorMode (what torch.compile traces with) the triton_op operators give the outputs' metadata
    without launching a kernel.  In a subprocess without the interpreter: the interpreter would run the
    kernel on the fake tensors."""
    if not T._HAS_TRITON_OP:
        pytest.skip("torch < 2.6: no torch.library.triton_op")
    code = """if True:
        import torch, torch_impl
        from torch._subclasses.fake_tensor import FakeTensorMode
        torch_impl.kernels.triton_module()
        with FakeTensorMode():
            q, v = torch.randn(2, 8, 4), torch.randn(2, 8, 3)
            o, a = torch.ops.attn_lab.fused_forward(q, q, v, "ieee")
            g = torch.ops.attn_lab.fused_backward(o, None, None, q, v, a, True, False, True, "ieee")
            print([tuple(t.shape) for t in (o, a, *g)])
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.stdout.strip() == "[(2, 8, 3), (2, 8, 8), (2, 8, 4), (0,), (2, 8, 3)]", done.stderr[-3000:]


# --- tanh in the kernels (docs/kernels.md "tanh in the kernels"), issue 37's small scores ------------------------
@triton.jit
def _tanh_probe(X, A, S, N, TANH: triton.language.constexpr, TANH_ERR: triton.language.constexpr):
    offs = triton.language.arange(0, 1024)
    ok = offs < N
    a, s = T._tanh_and_slope(triton.language.load(X + offs, mask=ok), TANH, TANH_ERR)
    triton.language.store(A + offs, a, mask=ok)
    triton.language.store(S + offs, s, mask=ok)


def _probe(x: torch.Tensor, mode="exact", err=0.0):
    a, s = torch.empty_like(x), torch.empty_like(x)
    for i in range(0, x.numel(), 1024):
        sl = slice(i, i + 1024)
        _tanh_probe[(1,)](x[sl], a[sl], s[sl], x[sl].numel(), TANH=mode, TANH_ERR=err)
    return a, s


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got − want| in float32 ulps of want (want in float64)."""
    spacing = torch.from_numpy(__import__("numpy").spacing(want.float().abs().numpy())).double()
    return (got.double() - want).abs() / spacing


def test_exact_tanh_keeps_relative_precision_at_every_scale():
    """float32 kernels' tanh within 4 ulps over |x| in [1e-30, 10] (2σ(2x) − 1 returned 0 below |x| ≈ 3e-8 and
    loses relative precision long before); 1 − tanh² x too (from the exponential, (41))."""
    mag = torch.logspace(-30, 1, 4000, dtype=torch.float64)
    x = torch.cat([mag, -mag]).float()
    a, s = _probe(x.to(DEVICE))
    want = torch.tanh(x.double())
    assert _ulps(a.cpu(), want).max() <= 4, float(_ulps(a.cpu(), want).max())
    slope = 1 / torch.cosh(x.double()) ** 2
    assert ((s.cpu().double() - slope).abs() / slope).max() <= 8 * 2.0 ** -24


def test_emulated_hardware_tanh_is_the_exact_one_times_the_perturbation():
    x = torch.linspace(-6, 6, 999).to(DEVICE)
    exact, _ = _probe(x)
    err = T.TANH_APPROX_REL_ERR
    a, s = _probe(x, "emulate", err)
    torch.testing.assert_close(a, (exact * (1 + err)).clamp(-1, 1), rtol=2e-7, atol=0)
    torch.testing.assert_close(s, (1 - a.double() ** 2).clamp_min(0).float(), rtol=1e-6, atol=1e-7)


def test_tiny_scores_give_tiny_outputs_not_zeros():
    """q kᵀ ~ 1e-20: a = tanh x = x to float32 precision, and o, G_V with it (they were exactly 0)."""
    q, k, v = _inputs(1, 20, 5, 7, torch.float32)
    q = q * 1e-20
    o, a = T.fused_forward(q, k, v, block_q=16, block_k=16)
    o_ref, a_ref = _reference(q, k, v)
    _close(a, a_ref, torch.float32)
    _close(o, o_ref, torch.float32)
    _close(T.o_only_forward(q, k, v, block_q=16, block_k=16), o_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("sign", [1, -1], ids=["plus", "minus"])
def test_hardware_tanh_error_bound_keeps_results_within_tolerance(dtype, sign):
    """The GPU's tanh.approx.f32 for float16 / bfloat16 (relative error up to 2^-10.987, PTX ISA), emulated by
    perturbing the exact tanh by that bound (and 1 − a² from it, as the GPU path computes): outputs and
    gradients of both entries' kernels stay within this file's tolerance for the dtype (RTOL) — the tolerance
    crosscheck does not set for these dtypes (it checks the kernels in float32)."""
    q, k, v = _inputs(2, 33, 5, 7, dtype)
    gen = torch.Generator().manual_seed(4)
    g_o = torch.randn(2, 33, 7, generator=gen).to(DEVICE, dtype)
    g_a = torch.randn(2, 33, 33, generator=gen).to(DEVICE, dtype)
    with T.perturb_tanh(sign * T.TANH_APPROX_REL_ERR), T.tiles(16, 16):
        assert T.tanh_mode(dtype) == "emulate"
        o = T.o_only_forward(q, k, v, True)
        grads = T.o_only_backward(g_o, q, k, v, True)
        o2, a2 = T.fused_forward(q, k, v)
        grads2 = T.fused_backward(g_o, g_a, q, k, v, a2)
    _close(o, _reference(q, k, v, True)[0], dtype)
    for got, want in zip(grads, _reference(q, k, v, True, g_o=g_o)):
        _close(got, want, dtype)
    o_ref, a_ref = _reference(q, k, v)
    _close(o2, o_ref, dtype)
    _close(a2, a_ref, dtype)
    for got, want in zip(grads2, _reference(q, k, v, g_o=g_o, g_a=g_a)):
        _close(got, want, dtype)


def test_the_perturbation_is_seen():
    """The emulation is not a no-op: perturbed by 1 %, the float16 forward is off by about 1 % (so the test above
    measures the bound, not an unchanged kernel)."""
    q, k, v = _inputs(1, 33, 5, 7, torch.float16)
    with T.tiles(16, 16):
        base = T.o_only_forward(q, k, v).double()
        with T.perturb_tanh(0.01):
            off = T.o_only_forward(q, k, v).double()
    assert 0.005 < float((off - base).norm() / base.norm()) < 0.02


def test_tanh_modes():
    assert T.tanh_mode(torch.float32) == "exact"
    assert T.tanh_mode(torch.bfloat16) == ("emulate" if T.INTERPRET else "approx")


# --- grids, launch configurations ----------------------------------------------------------------------------
def test_batch_over_65535_is_on_grid_axis_0():
    """B = 70,000 stacks: one grid axis of B × tiles programs (CUDA allows 2^31 − 1 there, 65,535 on axes 1
    and 2); recorded, not run."""
    B, n = 70_000, 100
    q, k, v = (torch.empty(B, n, s, device="meta", dtype=torch.float16) for s in (16, 16, 8))
    with T.record_launches("sm_90a") as launches:
        T.o_only_forward(q, k, v, True)
        T.o_only_backward(torch.empty(B, n, 8, device="meta", dtype=torch.float16), q, k, v, True)
        T.fused_forward(q, k, v)
    assert [l.name for l in launches] == ["forward", "dkdv", "dq", "forward"]
    assert [T.table_name(l.name, l.constexprs) for l in launches] == ["o_forward", "o_dkdv", "o_dq", "fused_forward"]
    for launch in launches:
        c = launch.configs[0]
        tile = c.block_k if launch.name == "dkdv" else c.block_q
        assert launch.grid == (B * triton.cdiv(n, tile),), launch.grid


def test_grid_over_the_limit_is_refused_before_any_launch():
    q = torch.empty(2 ** 28, 1024, 16, device="meta", dtype=torch.float16)
    with T.record_launches("sm_90a") as launches, pytest.raises(ValueError, match="grid limit"):
        T.o_only_forward(q, q, q)
    assert launches == []


def test_launch_table_is_complete_and_autotune_prunes_to_it():
    """Every (arch, dtype, kernel, width) has an entry; the empty ones (no proven configuration: the entries run
    ATen on a GPU) are width 256 and TF32 dK/dV at width 128 on sm_90a, nothing else."""
    empty = set()
    for arch in T.ARCHS:
        for key in T.DTYPE_KEYS:
            for kernel in T.KERNELS:
                for width in T.WIDTHS:
                    configs = T.launch_configs(arch, key, kernel, width)
                    assert len(set(configs)) == len(configs)
                    if not configs:
                        empty.add((arch, key, kernel, width))
    assert empty == {(a, k, kernel, 256) for a in T.ARCHS for k in ("fp16", "bf16", "tf32") for kernel in T.KERNELS
                     } | {("sm_90a", "tf32", "o_dkdv", 128), ("sm_90a", "tf32", "fused_dkdv", 128)}
    assert not T.proven("sm_90a", "tf32", 128) and T.proven("sm_80", "tf32", 128)
    assert all(T.proven(a, k, w) for a in T.ARCHS for k in ("fp16", "bf16") for w in (64, 128))
    with pytest.raises(ValueError, match="no launch configuration"):
        T.launch_configs("sm_70", "fp16", "o_forward", 64)
    tuned = T._autotuned("o_dkdv")
    q = torch.empty(1, 64, 128, device="meta", dtype=torch.bfloat16)
    with T.record_launches("sm_80"):                     # the arch the pruning reads
        kept = tuned.early_config_prune(tuned.configs, {"Q": q}, PRECISION="ieee", BLOCK_D=128, BLOCK_E=128)
    assert [(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in kept] == sorted(
        (c.block_q, c.block_k, c.num_warps, c.num_stages) for c in T.launch_configs("sm_80", "bf16", "o_dkdv", 128))


def test_tiles_refuses_bad_sizes():
    with pytest.raises(ValueError, match="block_q must be a power of two"):
        with T.tiles(24, 16):
            pass


# --- issue 37: the fused op's outputs are tensors of their own --------------------------------------------------
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "aten"])
def test_in_place_on_the_outputs_of_attn(on_kernels, fused):
    """o.mul_(2) / a.add_(1) after torch_impl.attn: legal on the ATen path, and on the kernels (o and a were
    views of one stacked buffer there: "Output 0 of AttnFunction is a view ... returns multiple views")."""
    q, k, v = (t[0].requires_grad_() for t in _inputs(1, 20, 5, 7, torch.float32))
    kernels.use_fused(fused)
    try:
        assert kernels.fused_applies(q, k, v) == fused
        o, a = torch_impl.attn(q, k, v)
        assert o.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
        o.mul_(2)
        grads = torch.autograd.grad(o.sum(), (q, k, v))
        o2, a2 = torch_impl.attn(q, k, v)
        a2.add_(1)
    finally:
        kernels.use_fused(True)
    o_ref, a_ref = _reference(q, k, v)
    _close(o, 2 * o_ref, torch.float32)
    _close(a2, a_ref + 1, torch.float32)
    for got, want in zip(grads, _reference(q, k, v, g_o=2 * torch.ones_like(o_ref))):
        _close(got, want, torch.float32)
