"""Solutions as students write them in their first hour (tests/crosscheck/test_first_hour.py).

``ReadmeSession``: the README's "Check your own solution" session: ``set_materialize_grads(False)`` and no ``None``
checks, so the backward raises TypeError whenever one output is unused (and in second order, for the same reason).
``UnpacksFourSavesThree``: saves three tensors, unpacks four: every backward raises the same ValueError.
``SavesAllWhenTwo``: right numbers, but saves q, k and v whenever two or more inputs require grad (q is not read
when only q, v require grad, k not when only k, v do).
"""

from __future__ import annotations

import torch

from torch_impl import check_inputs
from torch_impl import formulas as TF


class ReadmeSession(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v):
        a = torch.tanh(q @ k.T)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        ctx.save_for_backward(q, k, v, output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        grad_x = (grad_o @ v.T + grad_a) * (1 - a * a)
        return grad_x @ k, grad_x.T @ q, a.T @ grad_o


class UnpacksFourSavesThree(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v):
        a = torch.tanh(q @ k.mT)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)                 # a is not saved ...

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors                 # ... but read: ValueError on every request
        return TF.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)


class SavesAllWhenTwo(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v):
        check_inputs(q, k, v)
        return TF.attn_forward(q, k, v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        need_q, need_k, need_v = ctx.needs_input_grad
        if need_q + need_k + need_v >= 2:
            ctx.save_for_backward(q, k, v, output[1])
        else:                                          # one input: only what its gradient reads
            ctx.save_for_backward(q if need_k else None, k if need_q else None, v if need_q or need_k else None,
                                  output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)
