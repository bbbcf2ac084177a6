"""What a compiled graph on CUDA holds, traced here with fake CUDA tensors and triton's real JIT (no interpreter,
no GPU): run as ``python -m tests.support.compiled_kernels`` by tests/kernels/test_attn_o_compile.py, it prints JSON.

* ``routes``: the operators ``torch.export`` (Dynamo, as torch.compile traces) records for ``attn_o`` and the lab's
  ``attn`` per dtype: the ``triton_op``s where the kernels apply, else the opaque / ATen operators.
* ``graphs``: the call targets AOTAutograd hands a backend for each ``triton_op`` (forward and backward): the
  Triton kernels by name (``triton_kernel_wrapper_functional``), no operator around them.  Without a GPU driver
  torch cannot read which arguments a kernel writes (it warns, and assumes all); the kernels are the same.
"""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)          # the JIT's kernels: interpreted ones cannot be traced

import torch                                      # noqa: E402
from functorch.compile import aot_function        # noqa: E402
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table   # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode                  # noqa: E402

import torch_impl                                 # noqa: E402
from torch_impl import kernels                    # noqa: E402
from torch_impl.kernels.o_only import attn_o_triton_backward_op, attn_o_triton_op   # noqa: E402


class _Captured(Exception):
    """Raised by the backend once it has the graph: running it would need a GPU."""


def _targets(gm) -> list:
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "kernel_idx" in node.kwargs:
            out.append(f"{node.target}:{kernel_side_table.get_kernel(node.kwargs['kernel_idx']).fn.__name__}")
        elif node.op == "call_function" and str(node.target).startswith("attn_lab."):
            out.append(str(node.target))
    return out


def _aot_graph(fn, *args) -> list:
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        raise _Captured

    try:
        aot_function(fn, fw_compiler=backend)(*args)
    except _Captured:
        pass
    return _targets(graphs[0])


def _routes() -> dict:
    class AttnO(torch.nn.Module):
        def forward(self, q, k, v):
            return torch_impl.attn_o(q, k, v, causal=True)

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return tuple(torch_impl.attn(q, k, v))

    out = {}
    for dtype, tf32 in ((torch.bfloat16, False), (torch.float16, False), (torch.float32, False),
                        (torch.float32, True), (torch.float64, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32          # kernels.dot_precision: TF32 for float32 dots
        for name, module, lead in (("attn_o", AttnO(), (2,)), ("attn", Attn(), ())):
            args = [torch.randn(*lead, 33, m, device="cuda", dtype=dtype) for m in (16, 16, 8)]
            program = torch.export.export(module, tuple(args))
            out[f"{name} {str(dtype).removeprefix('torch.')}{' tf32' if tf32 else ''}"] = [
                str(n.target) for n in program.graph.nodes if n.op == "call_function" and "attn_lab" in str(n.target)]
    return out


def main() -> None:
    logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)
    with FakeTensorMode():
        q, k, v, g = (torch.randn(2, 33, m, device="cuda", dtype=torch.bfloat16) for m in (16, 16, 8, 8))
        q2, k2, v2, g2 = (torch.randn(33, m, device="cuda", dtype=torch.bfloat16) for m in (16, 16, 8, 8))
        a = q.new_empty(33, 33)
        report = {
            "traceable": kernels.triton_module().TRACEABLE,
            "routes": _routes(),
            "graphs": {
                "attn_o_triton": _aot_graph(lambda q, k, v: attn_o_triton_op(q, k, v, True, "ieee"), q, k, v),
                "attn_o_triton_backward": _aot_graph(
                    lambda g, q, k, v: attn_o_triton_backward_op(g, q, k, v, True, True, False, True, "ieee"),
                    g, q, k, v),
                "fused_forward": _aot_graph(kernels.fused_forward, q2, k2, v2),
                "fused_backward": _aot_graph(
                    lambda g, q, k, v, a: kernels.fused_backward(g, None, q, k, v, a, (True, True, True)),
                    g2, q2, k2, v2, a),
            },
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
