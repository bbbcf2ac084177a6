"""The series' C++ as a torch.autograd.Function: forward = the in-tree kernel (``at::native::_tanh_attention``),
backward = ``tanh_attention_backward``, jvp = ``tanh_attention_jvp`` — called exactly as the generated
autograd node and VariableType kernel call them (grad_input_mask, wrap_opt_if'd inputs, undefined gradients).

The compiled extension is found through ``$ATTN_UPSTREAM_EXT`` (the .so that tests/upstream/test_upstream.py builds),
so that ``python -m crosscheck --torch-impl upstream/harness/cpp_attn.py:CppAttn`` checks the C++ too.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os

import torch

__all__ = ["CppAttn", "load"]

_ext = None


def load(path: str | None = None):
    """Import the compiled extension (``path`` or ``$ATTN_UPSTREAM_EXT``) once; it registers
    ``torch.ops.upstream_attn.tanh_attention`` and provides ``backward`` and ``jvp``."""
    global _ext
    if _ext is None:
        path = path or os.environ.get("ATTN_UPSTREAM_EXT")
        if not path:
            raise RuntimeError("set ATTN_UPSTREAM_EXT to the extension built by tests/upstream/test_upstream.py")
        name = os.path.basename(path).split(".")[0]
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        _ext = importlib.util.module_from_spec(spec)
        loader.exec_module(_ext)
    return _ext


class CppAttn(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v):
        load()
        return tuple(torch.ops.upstream_attn.tanh_attention(q, k, v))

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        need_q, need_k, _ = ctx.needs_input_grad
        # What derivatives.yaml's wrap_opt_if saves: q only for grad k, k only for grad q, v for either.
        ctx.save_for_backward(q if need_k else None, k if need_q else None,
                              v if (need_q or need_k) else None, output[1])
        ctx.set_materialize_grads(False)
        ctx.primals, ctx.a = inputs, output[1]   # for jvp only (forward AD runs it at once)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        return tuple(load().backward(grad_o, grad_a, q, k, v, a, list(ctx.needs_input_grad)))

    @staticmethod
    def jvp(ctx, q_t, k_t, v_t):
        q, k, v = ctx.primals
        a = ctx.a
        o_t, a_t = load().jvp(q, k, v, a, q_t, k_t, v_t)
        # The generated kernel leaves an undefined tangent unset; a Function's jvp must return a tensor.
        return o_t, (torch.zeros_like(a) if a_t is None else a_t)


def attn(q, k, v):
    return CppAttn.apply(q, k, v)


def generated(q, k, v):
    """The op through the codegen's generated Autograd kernel and TanhAttentionBackward0 node."""
    load()
    return tuple(torch.ops.upstream_attn.tanh_attention(q, k, v))
