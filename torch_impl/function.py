"""``AttnFunction``: tanh attention as a ``torch.autograd.Function`` (lab part II), and ``attn``.

Read this file first, after derivation.md.  The Function is thin: every staticmethod saves, unpacks and
calls ``torch_impl.formulas`` (the backward through ``torch_impl.performance``, which only schedules the same
formulas to allocate less), citing the equations of derivation.md.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch import Tensor

from . import blocks, formulas, internals, performance
from .validation import check_inputs

__all__ = ["AttnFunction", "AttnOutput", "attn", "attn_reference", "batch_first"]


class AttnOutput(NamedTuple):
    """Result of :func:`attn`: ``o = tanh(q kᵀ) v`` of shape (n, e) and ``a = tanh(q kᵀ)`` of shape (n, n)."""

    o: Tensor
    a: Tensor


class AttnFunction(torch.autograd.Function):
    """``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with the hand-written VJP (9)-(13) and JVP (14)-(16).

    Takes validated inputs (call :func:`attn`, which checks them): ``q, k: (n, d)``, ``v: (n, e)``, or
    stacks ``(B, n, ·)`` of them (what the vmap rule passes).  Saved for backward: the output ``a`` and only
    those of ``q, k, v`` the requested gradients need; never ``x = q kᵀ``.  A missing output gradient
    arrives as ``None`` (``set_materialize_grads(False)``): no zeros are built for it."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor):
        return formulas.attn_forward(q, k, v)                                       # (1)-(3)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        need_q, need_k = ctx.needs_input_grad[:2]
        # (9)-(13) read k for G_Q, q for G_K, v for G_O Vᴴ, and the output a always.
        ctx.save_for_backward(q if need_k else None, k if need_q else None, v if need_q or need_k else None,
                              output[1])
        ctx.save_for_forward(q, k, v, output[1])                                    # (14)-(16)
        ctx.set_materialize_grads(False)
        ctx.autocast = _autocast_state(q)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        with _autocast_like(ctx.autocast, a):
            return performance.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)  # (9)-(13)

    @staticmethod
    def jvp(ctx, q_dot, k_dot, v_dot):
        _refuse_nested_forward_levels()        # where PyTorch would get the second order wrong (see below)
        q, k, v, a = ctx.saved_tensors
        return formulas.attn_jvp(q, k, v, a, q_dot, k_dot, v_dot)                   # (14)-(16)

    @staticmethod
    def vmap(info, in_dims, q, k, v):
        # One call on the stacks (B, n, ·): the batch dimension first, unbatched inputs expanded.  Under nested
        # vmap (batch x heads) the stacks arrive as (B_outer, B_inner, n, ·): fold them to one (a copy where an
        # input was expanded).
        stacks = batch_first(info.batch_size, in_dims, (q, k, v))
        batch = stacks[0].shape[:-2]
        o, a = AttnFunction.apply(*(t.flatten(0, -3) for t in stacks))
        return (o.unflatten(0, batch), a.unflatten(0, batch)), (0, 0)


def _refuse_nested_forward_levels():
    """PyTorch runs a Function's jvp with forward-mode AD off, so an outer forward level cannot see it: under two
    ``torch.func`` forward levels the second order would come out wrong with no error.  Refuse instead (and
    refuse all forward mode where ``internals`` cannot see the levels)."""
    nested = internals.nested_forward_levels()
    if nested is not False:
        raise NotImplementedError(_NESTED_FORWARD_MESSAGES[nested])


_NESTED_FORWARD_MESSAGES = {
    True: "AttnFunction.jvp under two torch.func forward-mode levels (jacfwd(jacfwd(f)), jvp(jvp(f))) would give "
          "wrong second derivatives (PyTorch does not differentiate a custom Function's jvp), so it refuses; call "
          "torch_impl.attn, which differentiates the formulas there, or use jacfwd(jacrev(f)).",
    None: "AttnFunction.jvp: this torch does not let torch_impl see its torch.func levels, and under two "
          "forward-mode levels a Function's jvp gives wrong second derivatives, so forward mode through "
          "AttnFunction is refused here; use torch.ops.attn_lab.attn_composite, or reverse mode.",
}


def batch_first(size: int, in_dims, tensors):
    """A vmap rule's tensors with the vmapped dimension first; unbatched ones expanded (a view, no copy)."""
    return [t.movedim(d, 0) if d is not None else t.expand(size, *t.shape) for t, d in zip(tensors, in_dims)]


def attn(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """Tanh attention ``o = tanh(q kᵀ) v`` with hand-written, memory-frugal gradients.

    Args:
        q: ``(n, d)`` queries.  k: ``(n, d)`` keys.  v: ``(n, e)`` values.  One floating-point or complex
            dtype, one device; n, d, e may be 0.
    Returns:
        ``AttnOutput(o, a)`` with ``o: (n, e)`` and ``a = tanh(q kᵀ): (n, n)``; both are differentiable, to
        any order, in reverse and forward mode, under ``torch.func`` transforms, and in reverse mode under
        ``torch.compile`` (forward mode needs ``torch_impl.internals``' private checks: see the README).
    Raises:
        TypeError / ValueError naming the offending argument (see ``torch_impl.validation``).
    """
    if blocks.sharded(q, k, v):            # DTensors: the block operators' sharding rules (torch_impl.distributed)
        from . import distributed
        return distributed.attn(q, k, v)
    check_inputs(q, k, v)
    if torch.compiler.is_compiling():
        # Dynamo cannot trace a Function that defines jvp; the operator has the same backward and a fake kernel.
        return AttnOutput(*torch.ops.attn_lab.attn(q, k, v))
    if internals.nested_forward_levels():
        return AttnOutput(*formulas.attn_forward(q, k, v))        # (1)-(3), differentiated by torch.func
    return AttnOutput(*AttnFunction.apply(q, k, v))


def attn_reference(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """The plain composite of three torch ops, differentiated by autograd: the oracle for comparisons.

    Same input checks as :func:`attn`, so both raise the same errors."""
    check_inputs(q, k, v)
    a = torch.tanh(q @ k.mT)
    return AttnOutput(a @ v, a)


# --- autocast: backward runs under the forward's autocast state ----------------------------------------------
# torch.amp's custom_fwd / custom_bwd contract, done by hand because those decorators take one fixed device type
# and an old-style forward(ctx, ...).  The backward's matmuls then cast the saved inputs as the forward's did,
# and an autocast the caller opened around backward() does not change its precision.
def _autocast_state(t: Tensor):
    """The autocast dtype in effect for ``t``'s device, or ``None`` (autocast off, or none for this device)."""
    device_type = t.device.type
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _autocast_like(dtype, t: Tensor):
    """Enter autocast at ``dtype`` for ``t``'s device (``None``: autocast off there), unless already so."""
    if _autocast_state(t) == dtype:
        return nullcontext()
    return torch.autocast(t.device.type, dtype=dtype, enabled=dtype is not None)


# ``Function.apply`` binds its arguments with ``inspect.signature(forward)`` on every call: about 20 µs, a fifth of
# a whole fwd+bwd at the lab's n=2.  ``inspect`` takes a precomputed ``__signature__`` as is (a Python protocol).
AttnFunction.forward.__signature__ = inspect.signature(AttnFunction.forward)
