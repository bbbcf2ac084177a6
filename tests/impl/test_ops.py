"""The ``attn_lab`` operators (lab parts III and IV) and the transforms of every torch entry point.

Registration (schema, dispatch keys, re-import), that the explicit op's autograd *is* ``torch_impl.formulas``,
``torch.library.opcheck``, ``torch.func`` transforms, ``torch.compile(fullgraph=True)``, ``torch.export``,
FakeTensor / meta, CPU autocast, and inference.  The OpInfo-driven gradient and consistency tests are in
``tests/impl/test_opinfo.py``.  CPU only here: CUDA copies of the device-generic checks come from tests/impl/test_opinfo.py.
"""

from __future__ import annotations

import contextlib
import functools
import re
from unittest import mock

import pytest
import torch
import torch._dynamo.testing
from torch.autograd import forward_ad as fwAD
from torch.func import hessian, jacfwd, jacrev, vmap
from torch.testing import assert_close

import torch_impl
from torch_impl import formulas, performance
from torch_impl.validation import message
from tests.conftest import attn_inputs, loss

OP = torch.ops.attn_lab.attn.default
COMPOSITE = torch.ops.attn_lab.attn_composite.default
ENTRY_POINTS = {"function": torch_impl.attn, "composite": COMPOSITE, "explicit": OP}
ENTRY_IDS = list(ENTRY_POINTS)


# CPU always; CUDA wherever a GPU exists (these variants skip cleanly here).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


make = functools.partial(attn_inputs, uniform=True)


def fwd_bwd(fn, q, k, v):
    o, a = fn(q, k, v)
    grads = torch.autograd.grad(loss(o, a), (q, k, v))
    return (o, a), grads


def detached(*ts, requires_grad=True):
    return [t.detach().clone().requires_grad_(requires_grad) for t in ts]


# ------------------------------------------------------------------------------------------ registration
def test_schemas_have_named_outputs():
    for name in ("attn", "attn_composite"):
        schema = getattr(torch.ops.attn_lab, name).default._schema
        assert str(schema) == f"attn_lab::{name}(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)"
        assert [r.name for r in schema.returns] == ["o", "a"]


def test_dispatch_registrations():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    # part III: one CompositeImplicitAutograd kernel, nothing else (autograd, meta, ... come from decomposing)
    assert has("attn_lab::attn_composite", "CompositeImplicitAutograd")
    assert not has("attn_lab::attn_composite", "CompositeExplicitAutograd")
    assert not has("attn_lab::attn_composite", "Autograd")
    # part IV: an explicit kernel, its own autograd, a meta (fake) kernel, a batching rule, autocast
    for key in ("CompositeExplicitAutograd", "Autograd", "Meta", "FuncTorchBatched", "AutocastCPU", "AutocastCUDA"):
        assert has("attn_lab::attn", key), key
    assert not has("attn_lab::attn", "CompositeImplicitAutograd")


def test_explicit_op_backward_is_the_hand_written_backward():
    q, k, v = make(2, 3, 4, requires_grad=True)
    with mock.patch.object(performance, "attn_backward", wraps=performance.attn_backward) as spy:
        o, a = OP(q, k, v)
        assert type(o.grad_fn).__name__ == "AttnFunctionBackward" and a.grad_fn is o.grad_fn
        torch.autograd.grad(loss(o, a), (q, k, v))
    assert spy.call_count == 1
    # ... and the composite's is autograd's own (it never calls the formulas' VJP)
    with mock.patch.object(performance, "attn_backward", wraps=performance.attn_backward) as spy:
        torch.autograd.grad(loss(*COMPOSITE(q, k, v)), (q, k, v))
    assert spy.call_count == 0


@pytest.mark.parametrize("no_grad", [False, True])
def test_explicit_op_forward_ad_is_formulas_attn_jvp(no_grad):
    """Forward AD through the op calls (14)-(16), also under no_grad (forward grad mode is separate)."""
    q, k, v = make(2, 3, 4)
    tangents = make(2, 3, 4, seed=1)
    with mock.patch.object(formulas, "attn_jvp", wraps=formulas.attn_jvp) as spy:
        with fwAD.dual_level(), torch.set_grad_enabled(not no_grad):
            o, a = OP(*(fwAD.make_dual(p, t) for p, t in zip((q, k, v), tangents)))
            o_dot, a_dot = fwAD.unpack_dual(o).tangent, fwAD.unpack_dual(a).tangent
    assert spy.call_count == 1
    _, (o_ref, a_ref) = torch.func.jvp(torch_impl.attn_reference, (q, k, v), tuple(tangents))
    assert_close(o_dot, o_ref)
    assert_close(a_dot, a_ref)


def test_explicit_op_double_backward_matches_reference():
    q, k, v = make(3, 2, 4, requires_grad=True)
    results = []
    for fn in (OP, torch_impl.attn_reference):
        grads = torch.autograd.grad(loss(*fn(q, k, v)), (q, k, v), create_graph=True)
        results.append(torch.autograd.grad(sum((g * g).sum() for g in grads), (q, k, v)))
    assert_close(results[0], results[1])


# ----------------------------------------------------------------------------------------------- opcheck
# opcheck runs on every OpInfo sample in float64 with grad (tests/impl/test_opinfo.py::TestAttnOpcheck); these add
# the cases that set does not have: a complex dtype, and inputs that do not require grad.  (The first opcheck
# call in a process compiles and costs ~1-2 s, later ones ~0.2 s.)
OPCHECK_SAMPLES = [
    pytest.param(lambda: make(3, 1, 2, dtype=torch.complex128, requires_grad=True), id="c128_grad"),
    pytest.param(lambda: make(2, 3, 4, dtype=torch.float32), id="f32_nograd"),
    pytest.param(lambda: make(0, 3, 4, dtype=torch.complex64), id="c64_n0_nograd"),
]


@pytest.mark.parametrize("op", [OP, COMPOSITE], ids=["attn", "attn_composite"])
@pytest.mark.parametrize("sample", OPCHECK_SAMPLES)
def test_opcheck(op, sample):
    result = torch.library.opcheck(op, sample())      # all default test_utils
    assert set(result) >= {"test_schema", "test_autograd_registration", "test_faketensor",
                           "test_aot_dispatch_dynamic"}
    assert all(v == "SUCCESS" for v in result.values()), result


# ------------------------------------------------------------------------------------- torch.func transforms
@pytest.fixture
def no_vmap_fallback():
    """Make functorch's slow per-example fallback an error, so vmap must use a real batching rule: the
    Function's vmap staticmethod, OP_DECOMPOSE-style decomposition (composite), register_vmap (explicit)."""
    previous = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(previous)


@pytest.mark.parametrize("name", ENTRY_IDS)
def test_vmap_matches_loop(name, no_vmap_fallback):
    fn = ENTRY_POINTS[name]
    q, k, v = make(2, 3, 4, batch=(5,))
    expected = [torch.stack(t) for t in zip(*(torch_impl.attn_reference(*x) for x in zip(q, k, v)))]
    assert_close(list(vmap(fn)(q, k, v)), expected)
    # unbatched k, batch dimension last for v, and an empty batch
    o, a = vmap(fn, in_dims=(0, None, 2))(q, k[0], v.movedim(0, 2))
    assert_close([o[1], a[1]], list(torch_impl.attn_reference(q[1], k[0], v[1])))
    assert vmap(fn)(*make(2, 3, 4, batch=(0,)))[0].shape == (0, 2, 4)


@pytest.mark.parametrize("name", ENTRY_IDS)
def test_vmap_validates_each_example(name):
    q, k, v = make(2, 3, 4, batch=(5,))
    with pytest.raises(ValueError, match="^" + re.escape(message("d", q=(2, 3), k=(2, 2))) + "$"):
        vmap(ENTRY_POINTS[name])(q, k[..., :2], v)


@pytest.mark.parametrize("name", ENTRY_IDS)
def test_jacrev_jacfwd_hessian_match_reference(name):
    fn, ref = ENTRY_POINTS[name], torch_impl.attn_reference
    q, k, v = make(2, 3, 4, seed=3)
    for transform in (jacrev, jacfwd):
        got = transform(lambda *x: tuple(fn(*x)), argnums=(0, 1, 2))(q, k, v)
        want = transform(lambda *x: tuple(ref(*x)), argnums=(0, 1, 2))(q, k, v)
        assert_close(got, want)
    assert_close(hessian(lambda *x: loss(*fn(*x)), argnums=(0, 1, 2))(q, k, v),
                 hessian(lambda *x: loss(*ref(*x)), argnums=(0, 1, 2))(q, k, v))


@pytest.mark.parametrize("name", ENTRY_IDS)
def test_per_example_grads_and_grad_of_vmap(name):
    fn, ref = ENTRY_POINTS[name], torch_impl.attn_reference
    q, k, v = make(2, 3, 4, batch=(4,), seed=5)
    got = vmap(torch.func.grad(lambda *x: loss(*fn(*x)), argnums=(0, 1, 2)))(q, k, v)
    want = vmap(torch.func.grad(lambda *x: loss(*ref(*x)), argnums=(0, 1, 2)))(q, k, v)
    assert_close(got, want)
    got = torch.func.grad(lambda *x: sum(loss(*y) for y in zip(*vmap(fn)(*x))), argnums=(0, 1, 2))(q, k, v)
    want = torch.func.grad(lambda *x: sum(loss(*y) for y in zip(*vmap(ref)(*x))), argnums=(0, 1, 2))(q, k, v)
    assert_close(got, want)


NESTED = {
    "hessian": lambda f, q, k, v: hessian(f, argnums=(0, 1, 2))(q, k, v),            # jacfwd(jacrev(f))
    "jacrev_jacrev": lambda f, q, k, v: jacrev(jacrev(f, argnums=(0, 1, 2)), argnums=(0, 1, 2))(q, k, v),
    "grad_grad": lambda f, q, k, v: torch.func.grad(lambda q: torch.func.grad(f)(q, k, v).sin().sum())(q),
    "jvp_grad": lambda f, q, k, v: torch.func.jvp(lambda q: torch.func.grad(f)(q, k, v), (q,), (q.cos(),))[1],
    "grad_jvp": lambda f, q, k, v: torch.func.grad(
        lambda q: torch.func.jvp(lambda q: f(q, k, v), (q,), (q.cos(),))[1])(q),
    "autograd_over_grad": lambda f, q, k, v: torch.autograd.grad(
        torch.func.grad(f)(q.requires_grad_(), k, v).sin().sum(), q)[0],
}


@pytest.mark.parametrize("transform", list(NESTED))
@pytest.mark.parametrize("name", ENTRY_IDS)
def test_nested_transforms_match_reference(name, transform):
    """Second-order transforms: reverse-over-reverse, forward-over-reverse, reverse-over-forward, and
    torch.autograd over torch.func.  Under torch.func the explicit op's Autograd kernel runs the formulas'
    aten ops (see torch_impl.ops._autograd_kernel)."""
    fn = ENTRY_POINTS[name]
    q, k, v = make(2, 3, 4, seed=7)
    got = NESTED[transform](lambda *x: loss(*fn(*x)), q.clone(), k, v)
    want = NESTED[transform](lambda *x: loss(*torch_impl.attn_reference(*x)), q.clone(), k, v)
    assert_close(got, want)


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
@pytest.mark.parametrize("outer", ["jacfwd", "jvp"])
def test_forward_over_forward(name, outer):
    """Forward-over-forward: PyTorch runs a custom Function's jvp with forward AD off, so through any
    autograd.Function the second order comes out wrong with no error (see
    test_forward_over_forward_through_a_bare_function).  ``torch_impl.attn`` routes two forward levels to
    autograd of the formulas, the explicit operator runs its formulas' aten ops under any torch.func level,
    and the composite is aten ops: all three must match the reference's Hessian."""
    fn = ENTRY_POINTS[name]
    q, k, v = make(2, 3, 4, seed=7)
    want = hessian(lambda q: loss(*torch_impl.attn_reference(q, k, v)))(q)
    f = lambda q: loss(*fn(q, k, v))  # noqa: E731
    if outer == "jacfwd":
        got = jacfwd(jacfwd(f))(q)
    else:   # a Hessian-vector product by jvp of jvp, along q's first basis direction
        e = torch.zeros_like(q).view(-1).index_fill_(0, torch.tensor([0]), 1.0).view_as(q)
        got = torch.func.jvp(lambda x: torch.func.jvp(f, (x,), (e,))[1], (q,), (e,))[1]
        want = (want.reshape(q.numel(), q.numel()) @ e.reshape(-1)).reshape(-1)[0]
    assert_close(got, want)


def test_forward_over_forward_through_a_bare_function():
    """The PyTorch behaviour the routing exists for: ``AttnFunction.apply`` itself refuses two forward levels
    with a clear error rather than return the wrong second derivative a Function's jvp gives there."""
    q, k, v = make(2, 3, 4, seed=7)
    with pytest.raises(NotImplementedError, match="two torch.func forward-mode levels"):
        jacfwd(jacfwd(lambda q: loss(*torch_impl.AttnFunction.apply(q, k, v))))(q)


# ------------------------------------------------------------------------------------------ torch.compile
def _compile_and_check(fn, backend, shapes=((2, 3, 4),), dynamic=None, dtype=torch.float32, device="cpu"):
    """Compile ``loss(fn(...))`` with fullgraph=True, run forward + backward on each shape, compare with the
    eager reference, and return the compile counter."""
    torch.compiler.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(lambda q, k, v: loss(*fn(q, k, v)), backend=counter, fullgraph=True, dynamic=dynamic)
    for seed, shape in enumerate(shapes):
        inputs = make(*shape, dtype=dtype, requires_grad=True, seed=seed, device=device)
        value = compiled(*inputs)
        grads = torch.autograd.grad(value, inputs)
        ref_inputs = detached(*inputs)
        ref_value = loss(*torch_impl.attn_reference(*ref_inputs))
        assert_close(value, ref_value)
        assert_close(grads, torch.autograd.grad(ref_value, ref_inputs))
    return counter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", ENTRY_IDS)
def test_compile_fullgraph(name, backend, device):
    counter = _compile_and_check(ENTRY_POINTS[name], backend, device=device)
    assert counter.frame_count == 1                     # one graph, no graph break (fullgraph would raise)


@pytest.mark.parametrize("name", ["function", "explicit"])
def test_compile_dynamic_shapes_no_recompile(name):
    counter = _compile_and_check(ENTRY_POINTS[name], "aot_eager", shapes=((2, 3, 4), (5, 2, 7), (3, 4, 3)),
                                 dynamic=True)
    assert counter.frame_count == 1


@pytest.mark.parametrize("no_grad", [False, True], ids=["train", "inference"])
@pytest.mark.parametrize("name", ["function", "explicit"])
def test_compiled_graphs_hold_the_formulas_not_the_opaque_op(name, no_grad):
    """Under torch.compile the op's kernel emits (1)-(3) as aten ops (so inductor can fuse tanh with its
    neighbours) and AOTAutograd traces formulas.attn_backward (9)-(13) as written (nothing is in place while
    compiling) for the backward: neither graph holds the opaque attn_lab.attn.  Inference graphs too."""
    torch.compiler.reset()
    backend = torch._dynamo.testing.AotEagerAndRecordGraphs()
    fn = ENTRY_POINTS[name]
    compiled = torch.compile(lambda q, k, v: loss(*fn(q, k, v)), backend=backend, fullgraph=True)
    inputs = make(2, 3, 4, dtype=torch.float32, requires_grad=True)
    if no_grad:
        with torch.no_grad():
            assert_close(compiled(*inputs), loss(*torch_impl.attn_reference(*inputs)))
        (fw,), bws = backend.fw_graphs, backend.bw_graphs
        assert bws == []
    else:
        with mock.patch.object(performance, "attn_forward", wraps=performance.attn_forward) as fwd_spy, \
                mock.patch.object(formulas, "attn_backward", wraps=formulas.attn_backward) as spy:
            torch.autograd.grad(compiled(*inputs), inputs)
        assert spy.call_count == 1                      # called while AOTAutograd traced the backward
        assert fwd_spy.call_count >= 1                  # Dynamo's fake run and AOTAutograd's trace
        (fw,), (bw,) = backend.fw_graphs, backend.bw_graphs
        bw_targets = {n.target for n in bw.graph.nodes if n.op == "call_function"}
        assert {torch.ops.aten.mm.default, torch.ops.aten.tanh_backward.default} <= bw_targets
        assert torch.ops.aten.addmm.default not in bw_targets     # performance's fused (9) was not traced
        assert OP not in bw_targets
    fw_targets = [n.target for n in fw.graph.nodes if n.op == "call_function"]
    assert OP not in fw_targets
    assert fw_targets.count(torch.ops.aten.mm.default) == 2 and torch.ops.aten.tanh.default in fw_targets


@pytest.mark.parametrize("name", ["function", "explicit"])
def test_compiled_forward_ad_and_double_backward(name):
    """With the forward graph made of the formulas' aten ops under compile, forward AD (dual tensors and
    torch.func.jvp) and double backward through the compiled function still agree with the reference."""
    torch.compiler.reset()
    fn = ENTRY_POINTS[name]
    compiled = torch.compile(lambda q, k, v: tuple(fn(q, k, v)), backend="aot_eager")
    q, k, v = make(3, 2, 4, seed=2)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    want = torch.func.jvp(lambda *x: tuple(torch_impl.attn_reference(*x)), (q, k, v), tangents)
    assert_close(torch.func.jvp(compiled, (q, k, v), tangents), want)
    with fwAD.dual_level():
        o, a = compiled(*(fwAD.make_dual(t, d) for t, d in zip((q, k, v), tangents)))
        assert_close((fwAD.unpack_dual(o).tangent, fwAD.unpack_dual(a).tangent), want[1])
    hvps = []
    for f in (compiled, lambda *x: tuple(torch_impl.attn_reference(*x))):
        inputs = detached(q, k, v)
        grads = torch.autograd.grad(loss(*f(*inputs)), inputs, create_graph=True)
        hvps.append(torch.autograd.grad(sum((g * g).sum() for g in grads), inputs))
    assert_close(*hvps)


@pytest.mark.compile
@pytest.mark.parametrize("device", DEVICES)
def test_compile_inductor_function_with_backward(device):
    """One inductor run (C++ codegen on CPU, Triton on CUDA; a few seconds) for the Function, fwd and bwd."""
    counter = _compile_and_check(torch_impl.attn, "inductor", device=device)
    assert counter.frame_count == 1


def test_compile_traces_the_formulas_themselves():
    """Dynamo can trace torch_impl.formulas directly (AttnFunction.apply on inputs that need no grad, and the
    backward / jvp formulas): the functorch-wrapper checks and OpOverload._op are skipped while compiling."""
    from torch_impl import formulas
    torch.compiler.reset()
    q, k, v = make(3, 2, 4, dtype=torch.float64)
    go, ga = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    fwd = torch.compile(lambda *x: torch_impl.AttnFunction.apply(*x), backend="eager", fullgraph=True)
    bwd = torch.compile(formulas.attn_backward, backend="eager", fullgraph=True)
    jvp = torch.compile(formulas.attn_jvp, backend="eager", fullgraph=True)
    with torch.no_grad():
        o, a = fwd(q, k, v)
        assert_close((o, a), tuple(torch_impl.attn_reference(q, k, v)))
        assert_close(bwd(go, ga, q, k, v, a, (True, True, True)),
                     formulas.attn_backward(go, ga, q, k, v, a, (True, True, True)))
        assert_close(jvp(q, k, v, a, q, k, v), formulas.attn_jvp(q, k, v, a, q, k, v))


def test_compile_inference_and_autocast():
    """Under no_grad and under CPU autocast the compiled explicit op matches eager (the fake kernel must
    report the autocast dtype, which the Autocast kernel's cast makes the inputs' dtype)."""
    torch.compiler.reset()
    compiled = torch.compile(lambda *x: OP(*x), backend="aot_eager", fullgraph=True)
    q, k, v = make(2, 3, 4, dtype=torch.float32)
    with torch.no_grad():
        assert_close(compiled(q, k, v), tuple(torch_impl.attn_reference(q, k, v)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = compiled(q, k, v), torch_impl.attn_reference(q, k, v)
    assert [t.dtype for t in got] == [torch.bfloat16] * 2
    assert_close(got, tuple(want))


# ------------------------------------------------------------------------------------------- torch.export
@pytest.mark.parametrize("name", ["function", "explicit"])
def test_export_keeps_the_op(name):
    fn = ENTRY_POINTS[name]

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return tuple(fn(q, k, v))

    n, d, e = (torch.export.Dim(s, min=1, max=64) for s in "nde")
    ep = torch.export.export(Attn(), tuple(make(2, 3, 4)),
                             dynamic_shapes=({0: n, 1: d}, {0: n, 1: d}, {0: n, 1: e}))
    assert [node.target for node in ep.graph.nodes if node.op == "call_function"].count(OP) == 1
    for shape in ((2, 3, 4), (5, 1, 7)):
        inputs = make(*shape, seed=1)
        assert_close(ep.module()(*inputs), tuple(torch_impl.attn_reference(*inputs)))
    with pytest.raises(Exception):                       # the exported guards keep d shared by q and k
        ep.module()(*make(2, 3, 4)[:2], torch.zeros(3, 4, dtype=torch.float64))


# ------------------------------------------------------------------------------------ FakeTensor and meta
@pytest.mark.parametrize("name", ENTRY_IDS)
def test_fake_and_meta_tensors(name):
    from torch._subclasses.fake_tensor import FakeTensorMode

    fn = ENTRY_POINTS[name]
    with FakeTensorMode() as mode:
        q, k, v = (mode.from_tensor(t) for t in make(3, 2, 5))
        o, a = fn(q, k, v)
    assert (o.shape, a.shape, o.dtype) == ((3, 5), (3, 3), torch.float64)
    o, a = fn(*(t.to("meta") for t in make(3, 2, 5, dtype=torch.complex64)))
    assert (o.shape, a.shape, o.dtype, o.device.type) == ((3, 5), (3, 3), torch.complex64, "meta")
    with pytest.raises(ValueError, match="same first dimension n"):
        fn(*(t.to("meta") for t in (torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(4, 5))))


# ------------------------------------------------------------------------------------------------ autocast
@pytest.mark.parametrize("name", ENTRY_IDS)
def test_cpu_autocast_matches_reference(name):
    """Under autocast every entry point does what the three-op reference does there: the matmuls of (1) and
    (3) run in the autocast dtype, so o and a come out bfloat16, and the gradients reach the float32 inputs
    in float32.  The backward runs outside the autocast region, as recommended (the Function re-enters the
    forward's autocast state itself: custom_bwd semantics)."""
    q, k, v = make(3, 4, 5, dtype=torch.float32, requires_grad=True)
    results = []
    for fn in (ENTRY_POINTS[name], torch_impl.attn_reference):
        inputs = detached(q, k, v)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            o, a = fn(*inputs)
        grads = torch.autograd.grad(loss(o.float(), a.float()), inputs)
        results.append(((o, a), grads))
    (outs, grads), (ref_outs, ref_grads) = results
    assert [t.dtype for t in outs] == [torch.bfloat16] * 2 and [g.dtype for g in grads] == [torch.float32] * 3
    # bfloat16 has 8 mantissa bits; the entry points differ from the reference only in rounding order
    # (e.g. addmm vs mm + add in the backward), so compare at bfloat16's resolution.
    assert_close(outs, tuple(ref_outs), rtol=2e-2, atol=2e-2)
    assert_close(grads, ref_grads, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("name", ENTRY_IDS)
def test_cpu_autocast_contract(name):
    """float64 is left alone (autocast's rule for matmul), and the one-dtype contract still holds: mixed
    dtypes are refused with the same error as outside autocast, as attn_reference does."""
    fn = ENTRY_POINTS[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fn(*make(2, 3, 4))[0].dtype == torch.float64
        q, k, v = make(2, 3, 4, dtype=torch.float32)
        msg = message("same_dtype", q="float32", k="bfloat16", v="float32")
        with pytest.raises(TypeError, match="^" + re.escape(msg) + "$"):
            fn(q, k.bfloat16(), v)


@pytest.mark.parametrize("name", ["function", "explicit"])
def test_autocast_opened_only_around_backward_changes_nothing(name):
    """custom_bwd semantics, other half: a forward run without autocast has a backward without it too, even
    when the caller opens an autocast region around ``backward`` (the Function switches it off for a's
    device), so the gradients are bit-identical to a run with no autocast at all."""
    fn = ENTRY_POINTS[name]
    q, k, v = make(3, 4, 5, dtype=torch.float32, requires_grad=True)
    grads = []
    for region in (contextlib.nullcontext(), torch.autocast("cpu", dtype=torch.bfloat16)):
        inputs = detached(q, k, v)
        o, a = fn(*inputs)
        with region:
            grads.append(torch.autograd.grad(loss(o, a), inputs))
    assert_close(grads[0], grads[1], rtol=0, atol=0)


# ----------------------------------------------------------------------- inference: the in-place scratch path
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", ENTRY_IDS)
def test_inference_matches_and_leaves_inputs_alone(name, mode):
    """Without grad mode formulas.attn_forward applies tanh in place to its own q kᵀ buffer: the results must
    not change and the inputs must not be touched (their version counters included)."""
    q, k, v = make(3, 2, 4)
    copies = [t.clone() for t in (q, k, v)]
    versions = [t._version for t in (q, k, v)]
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with context:
        o, a = ENTRY_POINTS[name](q, k, v)
    assert_close((o, a), tuple(torch_impl.attn_reference(*copies)))
    assert_close([q, k, v], copies, rtol=0, atol=0)
    assert [t._version for t in (q, k, v)] == versions


# ------------------------------------------------------------------- dispatch modes inside a dual level
@pytest.mark.parametrize("name", ["function", "composite", "explicit"])
def test_linearize_and_flop_counter_inside_a_dual_level(name):
    """A TorchDispatchMode active while a forward-AD level is open (``torch.func.linearize`` traces with
    make_fx; FlopCounterMode) must not trip the in-place check below the Autograd key."""
    from torch.utils.flop_counter import FlopCounterMode
    fn = ENTRY_POINTS[name]
    q, k, v = make(3, 2, 4, dtype=torch.float64)
    dq, dk, dv = (torch.randn_like(t) for t in (q, k, v))
    want = torch.func.jvp(lambda *x: tuple(torch_impl.attn_reference(*x)), (q, k, v), (dq, dk, dv))
    out, jvp_fn = torch.func.linearize(lambda *x: tuple(fn(*x)), q, k, v)
    assert_close(out, want[0])
    assert_close(jvp_fn(dq, dk, dv), want[1])
    want_a_dot = torch.func.jvp(lambda q: torch_impl.attn_reference(q, k, v).a, (q,), (dq,))[1]
    with FlopCounterMode(display=False) as counter, fwAD.dual_level():
        o, a = fn(fwAD.make_dual(q, dq), k, v)
        a_dot = fwAD.unpack_dual(a).tangent
    assert_close(a_dot, want_a_dot)
    assert counter.get_total_flops() > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("name", ["function", "explicit"])
def test_forward_ad_in_place_path_under_no_grad(name, dtype):
    """Under no_grad inside a dual level the JVP (15) runs in place on Ẋ (``tanh_backward`` with conj(A)):
    check it for complex too (gradcheck's forward-AD check runs with grad mode on, i.e. out of place)."""
    fn = ENTRY_POINTS[name]
    q, k, v = make(4, 3, 2, dtype=dtype)
    tangents = [torch.randn_like(t) for t in (q, k, v)]
    want = torch.func.jvp(lambda *x: tuple(torch_impl.attn_reference(*x)), (q, k, v), tuple(tangents))[1]
    with torch.no_grad(), fwAD.dual_level():
        o, a = fn(*(fwAD.make_dual(t, d) for t, d in zip((q, k, v), tangents)))
        got = (fwAD.unpack_dual(o).tangent, fwAD.unpack_dual(a).tangent)
    assert_close(got, want)
