"""Planted return-order slips (tests/crosscheck/test_hints.py): each backward computes the three gradients right
(``torch_impl.formulas.attn_backward``) and returns them in the wrong order, or returns two of them.  The hint
must say so ("your backward returns the gradients in the wrong order ...") instead of pointing at a formula.

``SwapsQK`` returns (G_K, G_Q, G_V): q and k share the shape (n, d), so torch accepts it on every shape.
``SwapsQV`` returns (G_V, G_K, G_Q) and ``SwapsKV`` (G_Q, G_V, G_K): v's shape (n, e) is q's and k's only where
d = e; elsewhere torch refuses the gradient's shape.  ``ReturnsTwo`` returns (G_Q, G_K) and forgets G_V.
``Rotates`` returns (G_K, G_V, G_Q) (every gradient in another's place; the shapes agree only where d = e).
"""

from __future__ import annotations

import torch

from torch_impl import check_inputs
from torch_impl import formulas as TF


class _Right(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v):
        check_inputs(q, k, v)
        return TF.attn_forward(q, k, v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def grads(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_backward(grad_o, grad_a, q, k, v, a, (True, True, True))


class SwapsQK(_Right):
    @staticmethod
    def backward(ctx, grad_o, grad_a):
        g_q, g_k, g_v = _Right.grads(ctx, grad_o, grad_a)
        return g_k, g_q, g_v


class SwapsQV(_Right):
    @staticmethod
    def backward(ctx, grad_o, grad_a):
        g_q, g_k, g_v = _Right.grads(ctx, grad_o, grad_a)
        return g_v, g_k, g_q


class SwapsKV(_Right):
    @staticmethod
    def backward(ctx, grad_o, grad_a):
        g_q, g_k, g_v = _Right.grads(ctx, grad_o, grad_a)
        return g_q, g_v, g_k


class Rotates(_Right):
    @staticmethod
    def backward(ctx, grad_o, grad_a):
        g_q, g_k, g_v = _Right.grads(ctx, grad_o, grad_a)
        return g_k, g_v, g_q


class ReturnsTwo(_Right):
    @staticmethod
    def backward(ctx, grad_o, grad_a):
        g_q, g_k, g_v = _Right.grads(ctx, grad_o, grad_a)
        return g_q, g_k


# --- JAX: the same slips in a jax.custom_vjp bwd rule (jax_swaps_qk, ...), built on first use ------------------------

def _jax_slip(order):
    from tests.support.planted_bugs import _jax_function   # repository root on sys.path
    from jax_impl import formulas as JF

    def bwd(go, ga, q, k, v, a):
        g = dict(zip("qkv", JF.attn_backward(go, ga, q, k, v, a)))
        return tuple(g[name] for name in order)

    return _jax_function(bwd)


JAX_ORDERS = {"swaps_qk": "kqv", "swaps_qv": "vkq", "swaps_kv": "qvk", "rotates": "kvq", "returns_two": "qk"}


def __getattr__(name):
    if name.startswith("jax_") and name[4:] in JAX_ORDERS:
        globals()[name] = _jax_slip(JAX_ORDERS[name[4:]])
        return globals()[name]
    raise AttributeError(name)
