"""``torch_impl.attn_o`` under ``torch.compile(fullgraph=True)`` (issue 36): the operators ``attn_lab::attn_o`` and
``attn_lab::attn_o_backward`` that it calls while compiling, their fake kernels and autograd registration
(``torch.library.opcheck``), the route on CUDA checked with fake CUDA tensors, and (``compile`` tier) the same
step through Inductor.

Red before: ``Unsupported: Attempted to call function marked as skipped`` (Dynamo reached functorch's
interpreter stack through ``internals.nested_forward_levels``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_impl
from tests.conftest import ROOT, attn_inputs
from torch_impl.kernels.o_only import attn_o_backward_op, attn_o_op


def _graphs_backend(graphs):
    """A torch.compile backend that records the forward and backward graphs AOTAutograd gives it (no codegen)."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    def compiler(gm, _inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    return lambda gm, inputs: aot_module_simplified(gm, inputs, fw_compiler=compiler, bw_compiler=compiler)


def _step(causal):
    return lambda q, k, v: torch_impl.attn_o(q, k, v, causal=causal).sin().sum()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("wanted", [(True, True, True), (True, False, False), (False, False, True)])
def test_fullgraph_forward_and_backward_are_the_operators(causal, wanted):
    graphs = []
    q, k, v = attn_inputs(37, 3, 5, batch=(2,), requires_grad=wanted)
    step = torch.compile(_step(causal), fullgraph=True, backend=_graphs_backend(graphs))
    inputs = [t for t in (q, k, v) if t.requires_grad]
    got = torch.autograd.grad(step(q, k, v), inputs)
    want = torch.autograd.grad(_step(causal)(q, k, v), inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)          # the same code as eager's: the same numbers
    forward, backward = graphs
    assert "torch.ops.attn_lab.attn_o.default" in forward
    assert "torch.ops.attn_lab.attn_o_backward.default" in backward and "attn_o.default" not in backward


def test_fullgraph_under_autocast():
    q, k, v = attn_inputs(13, 3, 4, torch.float32, batch=(2,), requires_grad=True)
    step = torch.compile(lambda q, k, v: torch_impl.attn_o(q, k, v), fullgraph=True, backend=_graphs_backend([]))
    with torch.autocast("cpu", torch.bfloat16):
        o = step(q, k, v)
        ref = torch_impl.attn_o(q, k, v)
    assert o.dtype == ref.dtype == torch.bfloat16
    got = torch.autograd.grad(o.float().sum(), (q, k, v))
    want = torch.autograd.grad(ref.float().sum(), (q, k, v))
    torch.testing.assert_close(o, ref, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128, torch.float32])
def test_opcheck(dtype):
    """Schema, fake kernel against the real one (shapes, strides, dtypes), autograd registration, AOT dispatch."""
    q, k, v = attn_inputs(9, 3, 4, dtype, batch=(2,), requires_grad=True)
    for causal in (False, True):
        for args in ((q, k, v, causal), (q.detach(), k.detach(), v, causal)):
            result = torch.library.opcheck(attn_o_op, args)
            assert all(r == "SUCCESS" for r in result.values()), result
    g = torch.randn(2, 9, 4, dtype=dtype)
    for mask in ((True, True, True), (True, False, False), (False, False, True)):
        result = torch.library.opcheck(attn_o_backward_op, (g, q.detach(), k.detach(), v.detach(), True, *mask))
        assert all(r == "SUCCESS" for r in result.values()), result


def test_the_operator_double_backward_in_eager_runs_the_differentiable_blocks():
    """Outside compile, create_graph=True through the operator records the differentiable blocks."""
    q, k, v = attn_inputs(7, 2, 3, batch=(2,), requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda q, k, v: attn_o_op(q, k, v, True), (q, k, v), fast_mode=True)


def test_cuda_route_with_fake_tensors():
    """On CUDA (fake CUDA tensors of this CPU build), with the interpreter of this test process: torch.export,
    which traces with Dynamo as torch.compile does, records the opaque operator (interpreted kernels cannot be
    traced: ``kernels.compiled_applies`` is False); its fake kernels give the CUDA outputs' metadata.  (A fake CUDA
    leaf that requires grad aborts this build, tests/impl/test_fake_cuda.py: the backward operator is checked by
    itself.)  The route with triton's JIT: ``test_compiled_graph_on_cuda_holds_the_kernels``."""

    class Step(torch.nn.Module):
        def forward(self, q, k, v):
            return torch_impl.attn_o(q, k, v, causal=True)

    with FakeTensorMode():
        q, k, v = (torch.randn(2, 33, m, device="cuda", dtype=torch.bfloat16) for m in (16, 16, 8))
        program = torch.export.export(Step(), (q, k, v))
        o = attn_o_op(q, k, v, True)
        grads = attn_o_backward_op(o, q, k, v, True, True, False, True)
    nodes = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert nodes == [torch.ops.attn_lab.attn_o.default], nodes
    assert (o.shape, o.device, o.dtype) == ((2, 33, 8), torch.device("cuda", 0), torch.bfloat16)
    assert [(tuple(g.shape), g.device.type) for g in grads] == [((2, 33, 16), "cuda"), ((0,), "cuda"),
                                                                 ((2, 33, 8), "cuda")]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_compiled_graph_on_cuda_holds_the_kernels():
    """With triton's JIT (a subprocess without the interpreter; tests/support/compiled_kernels.py), on fake CUDA
    tensors: under torch.export / torch.compile ``attn_o`` and the lab's ``attn`` call the ``triton_op``s where
    the kernels apply (float16, bfloat16, TF32), the opaque / ATen operators elsewhere (exact float32, float64);
    AOTAutograd decomposes each ``triton_op`` into its Triton kernels, which is what Inductor receives."""
    run = subprocess.run([sys.executable, "-m", "tests.support.compiled_kernels"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert report["traceable"]
    kernel_ops = {"attn_o": ["attn_lab.attn_o_triton.default"], "attn": ["attn_lab.fused_forward.default"]}
    other_ops = {"attn_o": ["attn_lab.attn_o.default"], "attn": ["attn_lab.attn.default"]}
    for entry in ("attn_o", "attn"):
        for dtype in ("bfloat16", "float16", "float32 tf32"):
            assert report["routes"][f"{entry} {dtype}"] == kernel_ops[entry], (entry, dtype, report["routes"])
        for dtype in ("float32", "float64"):
            assert report["routes"][f"{entry} {dtype}"] == other_ops[entry], (entry, dtype, report["routes"])
    forward = ["triton_kernel_wrapper_functional:_forward_kernel"]
    backward = ["triton_kernel_wrapper_functional:_dkdv_kernel", "triton_kernel_wrapper_functional:_dq_kernel"]
    assert report["graphs"] == {"attn_o_triton": forward, "attn_o_triton_backward": backward,
                                "fused_forward": forward, "fused_backward": backward}


@pytest.mark.compile
def test_inductor_fullgraph_gradients_equal_eager():
    """The issue's own line, through Inductor (C++ code generation): runs, and the gradients are eager's."""
    q, k, v = attn_inputs(37, 3, 5, torch.float32, batch=(2,), requires_grad=True)
    step = torch.compile(_step(True), fullgraph=True)
    got = torch.autograd.grad(step(q, k, v), (q, k, v))
    want = torch.autograd.grad(_step(True)(q, k, v), (q, k, v))
    torch.testing.assert_close(got, want)


@pytest.mark.compile
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("entry", ["attn_o", "attn"])
def test_inductor_on_cuda_holds_the_kernels_and_gradients_equal_eager(entry):
    """On a GPU (scripts/gpu_check.py runs it; skipped here): the graphs AOTAutograd hands Inductor hold the Triton
    kernels (``triton_kernel_wrapper_functional``), and Inductor's compiled step gives eager's gradients.  bfloat16
    tolerances: the kernels are the same, but Inductor fuses the pointwise ops around them its own way."""
    if entry == "attn_o":
        fn, batch = (lambda q, k, v: torch_impl.attn_o(q, k, v, causal=True).float().sin().sum()), (2,)
    else:
        fn, batch = (lambda q, k, v: sum(t.float().sin().sum() for t in torch_impl.attn(q, k, v))), ()
    q, k, v = (torch.randn(*batch, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    graphs = []
    torch.compile(fn, fullgraph=True, backend=_graphs_backend(graphs))(q, k, v).backward()
    assert len(graphs) == 2 and all("triton_kernel_wrapper_functional" in g for g in graphs), graphs
    got = torch.autograd.grad(torch.compile(fn, fullgraph=True)(q, k, v), (q, k, v))
    want = torch.autograd.grad(fn(q, k, v), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
