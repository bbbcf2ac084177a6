"""``AttnFunction``: tanh attention as a new-style ``torch.autograd.Function``.

``forward`` / ``setup_context`` / ``backward`` / ``jvp`` are thin: they validate, save, and call
``torch_impl.formulas`` (equation numbers from ``derivation.md``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import formulas
from .validation import check_inputs

__all__ = ["AttnFunction", "AttnOutput", "BatchedAttnFunction", "attn", "attn_reference"]


class AttnOutput(NamedTuple):
    """Result of :func:`attn`: ``o = tanh(q kᵀ) v`` of shape (n, e) and ``a = tanh(q kᵀ)`` of shape (n, n)."""

    o: Tensor
    a: Tensor


def _autocast_dtype(device_type: str):
    """The autocast dtype in effect for ``device_type``, or ``None`` (autocast off, or none for this device)."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class AttnFunction(torch.autograd.Function):
    """``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with the hand-written VJP (9)-(13) and JVP (14)-(16).

    Saved for backward: the output ``a`` and only those of ``q, k, v`` the requested gradients need; never
    ``x = q kᵀ``.  Missing output gradients arrive as ``None`` (``set_materialize_grads(False)``).
    """

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor):
        check_inputs(q, k, v)
        return formulas.attn_forward(q, k, v)                       # (1)-(3)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        _, a = output
        need_q, need_k, need_v = ctx.needs_input_grad
        # Save only what (9)-(13) will read: k for G_Q, q for G_K, v for G_O Vᴴ, and the output a always.
        ctx.save_for_backward(
            q if need_k else None,
            k if need_q else None,
            v if (need_q or need_k) else None,
            a,
        )
        ctx.save_for_forward(q, k, v, a)
        ctx.set_materialize_grads(False)
        # torch.amp's custom_fwd / custom_bwd contract: backward runs under the forward's autocast state (so
        # its matmuls cast saved fp32 inputs like the forward's did).  Done by hand because those decorators
        # take one fixed device_type and expect an old-style forward(ctx, ...).
        ctx.autocast = (a.device.type, _autocast_dtype(a.device.type))

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        device_type, dtype = ctx.autocast
        if dtype is None and _autocast_dtype(device_type) is None:     # the usual case: no autocast anywhere
            return formulas.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)   # (9)-(13)
        with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
            return formulas.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)   # (9)-(13)

    @staticmethod
    def jvp(ctx, q_dot, k_dot, v_dot):
        q, k, v, a = ctx.saved_tensors
        return formulas.attn_jvp(q, k, v, a, q_dot, k_dot, v_dot)   # (14)-(16)

    @staticmethod
    def vmap(info, in_dims, q, k, v):
        return attn_vmap(info, in_dims, q, k, v)


class BatchedAttnFunction(AttnFunction):
    """``AttnFunction`` on a stack of examples: ``q, k: (B, n, d)``, ``v: (B, n, e)`` -> ``o: (B, n, e)``,
    ``a: (B, n, n)``; the batched path of ``torch.vmap`` (see :func:`attn_vmap`).

    Same ``setup_context`` / ``backward`` / ``jvp``: the formulas run on the 3-D tensors (``@`` and
    ``baddbmm``), with the same buffer discipline as the 2-D path (``tanh_`` in place on ``q kᵀ``; one new
    ``(B, n, n)`` buffer in backward).  No validation here: the vmap rule checked one example."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor):
        return formulas.attn_forward(q, k, v)                       # (1)-(3), batched

    @staticmethod
    def vmap(info, in_dims, q, k, v):
        # Nested vmap (batch x heads): fold the outer batch dimension into the stack, run one 3-D call.
        q, k, v = _batch_first(info.batch_size, in_dims, (q, k, v))
        size, inner = q.shape[0], q.shape[1]
        o, a = _apply_batched(*(t.reshape(size * inner, *t.shape[2:]) for t in (q, k, v)))
        return (o.unflatten(0, (size, inner)), a.unflatten(0, (size, inner))), (0, 0)


def _example(t, dim: Optional[int]):
    """One vmap example of ``t`` (batched along ``dim``; ``None``: not batched, ``t`` itself) as a plain tensor
    with the per-example shape, dtype and device, also when the batch is empty: what ``check_inputs`` sees."""
    if dim is None:
        return t
    # ``select``, not ``t[0]``: Python indexing of a fake CUDA tensor raises in a CPU-only build
    return t.select(dim, 0) if t.shape[dim] > 0 else t.new_empty(t.movedim(dim, 0).shape[1:])


def _batch_first(size: int, in_dims, tensors):
    """The tensors with their vmap dimension first (unbatched ones expanded, a view: no copy)."""
    return tuple(t.movedim(d, 0) if d is not None else t.expand(size, *t.shape) for t, d in zip(tensors, in_dims))


def vmap_inputs(info, in_dims, q, k, v):
    """Validate one vmap example with the 2-D contract (the same messages as an unbatched call), then return
    ``q, k, v`` as 3-D stacks with the vmap dimension first: the shared start of both vmap rules."""
    check_inputs(*(_example(t, d) for t, d in zip((q, k, v), in_dims)))
    return _batch_first(info.batch_size, in_dims, (q, k, v))


def attn_vmap(info, in_dims, q, k, v):
    """The vmap rule of ``AttnFunction`` (``torch.vmap(torch_impl.attn)``).

    Applies ``BatchedAttnFunction`` to the plain 3-D stacks: autograd outside the vmap records one node whose
    backward is ``formulas.attn_backward`` on the whole stack, and the in-place scratch writes stay on
    (nothing outside can see them).  Transforms inside the vmap (``vmap(grad(f))``, ``jacrev``) reach this
    rule below their own level and differentiate through the Function as usual."""
    return tuple(_apply_batched(*vmap_inputs(info, in_dims, q, k, v))), (0, 0)


def attn(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """Tanh attention ``o = tanh(q kᵀ) v`` with a hand-written, memory-frugal gradient.

    Args:
        q: ``(n, d)`` queries.  k: ``(n, d)`` keys.  v: ``(n, e)`` values.  One floating-point or complex
            dtype, one device (CPU or CUDA); n, d, e may be 0.
    Returns:
        ``AttnOutput(o, a)`` with ``o: (n, e)`` and ``a = tanh(q kᵀ): (n, n)``; both are differentiable.
    Raises:
        TypeError / ValueError naming the offending argument (see ``torch_impl.validation``).
    """
    if torch.compiler.is_compiling():
        # Dynamo cannot trace an autograd.Function that defines ``jvp`` (graph break "Unsupported custom jvp",
        # gb0144), so compiled code reaches this Function through the ``attn_lab::attn`` operator: its Autograd
        # kernel applies AttnFunction's setup_context / backward / jvp (``torch_impl.ops._AttnOpFunction``),
        # and its fake kernel lets FakeTensor trace it.  While torch.compile traces, that kernel emits the formulas'
        # aten ops rather than the opaque op (``ops._inline_for_compiler``), so inductor fuses forward and backward
        # as it does for the reference; torch.export keeps the op.  Registered on ``import torch_impl``.
        return AttnOutput(*torch.ops.attn_lab.attn.default(q, k, v))
    return AttnOutput(*_apply(AttnFunction, _apply_eager, q, k, v))


def _apply(function, apply_eager, q, k, v):
    """``function.apply(q, k, v)``, through the C++ apply ``apply_eager`` in plain eager mode (below)."""
    if (not formulas._CAN_CHECK_WRAPPERS or torch._C._are_functorch_transforms_active()
            or any(isinstance(t, Tensor) and formulas._is_functorch_wrapped(t) for t in (q, k, v))):
        return function.apply(q, k, v)
    return apply_eager(q, k, v)


def _apply_batched(q, k, v):
    return _apply(BatchedAttnFunction, _apply_batched_eager, q, k, v)


# ``Function.apply`` first binds default arguments with ``inspect.signature`` on every call (about 11 µs, more
# than the whole forward at the lab's size), then calls the C++ ``_FunctionBase.apply``.  ``forward`` has no
# default arguments, so in plain eager mode ``attn`` calls the C++ apply directly: the same autograd node,
# ``setup_context``, ``backward`` and ``jvp``.  Under functorch transforms or torch.compile, or given a tensor
# that escaped a transform (``Function.apply`` unwraps those), it uses ``Function.apply``.
_apply_eager = super(torch.autograd.Function, AttnFunction).apply
_apply_batched_eager = super(torch.autograd.Function, BatchedAttnFunction).apply


def attn_reference(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """The plain composite of three torch ops, differentiated by autograd: the oracle for comparisons.

    Same input checks as :func:`attn`, so both raise the same errors."""
    check_inputs(q, k, v)
    a = torch.tanh(q @ k.mT)
    return AttnOutput(a @ v, a)
