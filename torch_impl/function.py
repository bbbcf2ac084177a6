"""``AttnFunction``: tanh attention as a ``torch.autograd.Function`` (lab part II), and ``attn``.

Read this file first, after derivation.md.  Each staticmethod saves, unpacks and calls the math: ``forward`` and
``backward`` through ``performance`` (the same formulas, scheduled to allocate less), ``jvp`` straight from
``formulas``.  ``support`` holds the autocast, vmap-layout and refusal helpers.  On CUDA, where
``kernels.fused_applies`` (triton installed, float16 / bfloat16 / float32, the switch ``kernels.use_fused`` on),
forward and backward run the fused Triton kernels instead (docs/kernels.md); a backward with
``create_graph=True`` always runs the differentiable formulas.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from . import formulas, internals, kernels, performance
from .internals import Answer
from .output import AttnOutput
from .support import autocast_like, autocast_state, batch_first, refuse_nested_forward_levels, sharded
from .validation import check_inputs

__all__ = ["AttnFunction", "AttnOutput", "attn", "attn_reference"]


class AttnFunction(torch.autograd.Function):
    """``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with the hand-written VJP (9)-(13) and JVP (14)-(16).

    Takes validated inputs (:func:`attn` checks them), or stacks ``(B, n, ·)`` (what the vmap rule passes).
    Saved: the output ``a`` and only those of ``q, k, v`` the requested gradients read; never ``x = q kᵀ``.  An
    unused output's gradient arrives as ``None`` (``set_materialize_grads(False)``): no zeros are built."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor):
        if kernels.fused_applies(q, k, v):
            return kernels.fused_forward(q, k, v)                                   # (32): a written once
        return performance.attn_forward(q, k, v)                                    # (1)-(3)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        need_q, need_k = ctx.needs_input_grad[:2]
        # (9)-(13) read k for G_Q, q for G_K, v for G_O Vᴴ, and the output a always.
        ctx.save_for_backward(q if need_k else None, k if need_q else None, v if need_q or need_k else None,
                              output[1])
        ctx.save_for_forward(q, k, v, output[1])                                    # (14)-(16)
        ctx.set_materialize_grads(False)
        ctx.autocast = autocast_state(q)
        ctx.fused = kernels.fused_applies(q, k, v)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        if ctx.fused and not kernels.differentiated(grad_o, grad_a, q, k, v, a):   # kernels: first order only
            return kernels.fused_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)   # (33)-(35)
        with autocast_like(ctx.autocast, a):
            return performance.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)  # (9)-(13)

    @staticmethod
    def jvp(ctx, q_dot, k_dot, v_dot):
        refuse_nested_forward_levels()          # where PyTorch would get the second order wrong
        q, k, v, a = ctx.saved_tensors
        return formulas.attn_jvp(q, k, v, a, q_dot, k_dot, v_dot)                   # (14)-(16)

    @staticmethod
    def vmap(info, in_dims, q, k, v):
        # One call on the stacks (B, n, ·), batch dimension first.  Nested vmap (batch x heads) passes
        # (B_outer, B_inner, n, ·): folded to one batch dimension and back.
        stacks = batch_first(info.batch_size, in_dims, (q, k, v))
        batch = stacks[0].shape[:-2]
        o, a = AttnFunction.apply(*(t.flatten(0, -3) for t in stacks))
        return (o.unflatten(0, batch), a.unflatten(0, batch)), (0, 0)


def attn(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """Tanh attention ``o = tanh(q kᵀ) v`` with hand-written, memory-frugal gradients.

    Args: ``q: (n, d)``, ``k: (n, d)``, ``v: (n, e)``; one floating-point or complex dtype, one device; n, d, e
    may be 0.  Returns ``AttnOutput(o, a)``, both differentiable to any order in reverse and forward mode, under
    ``torch.func`` and (reverse mode) ``torch.compile``.  Raises TypeError / ValueError naming the argument."""
    if sharded(q, k, v):                   # DTensors: the block operator under its sharding rules
        from .sharded import rules
        return rules.attn(q, k, v)
    check_inputs(q, k, v)
    if torch.compiler.is_compiling():
        # Dynamo cannot trace a Function that defines jvp: an operator instead, with the same backward and a fake
        # kernel: the fused kernels' triton_op where they apply (the kernels in the compiled graph), else the lab's.
        if kernels.compiled_applies(q, k, v):
            return AttnOutput(*kernels.fused_forward(q, k, v))                     # (32)
        return AttnOutput(*torch.ops.attn_lab.attn(q, k, v))
    if internals.nested_forward_levels() is Answer.YES:
        return AttnOutput(*formulas.attn_forward(q, k, v))        # (1)-(3), differentiated by torch.func
    return AttnOutput(*AttnFunction.apply(q, k, v))


def attn_reference(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """The plain composite of three torch ops, differentiated by autograd: the oracle.  Same checks as attn."""
    check_inputs(q, k, v)
    a = torch.tanh(q @ k.mT)
    return AttnOutput(a @ v, a)


# ``Function.apply`` binds its arguments with ``inspect.signature(forward)`` on every call (about 20 µs at n=2);
# ``inspect`` takes a precomputed ``__signature__`` as is (a Python protocol).
AttnFunction.forward.__signature__ = inspect.signature(AttnFunction.forward)
