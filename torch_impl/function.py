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


# One C call that answers "is autocast on for any device?" (a torch without it: assume it may be, and ask per
# device).  Autocast is off in almost every call, and asking per device costs several µs per fwd+bwd at the
# lab's n=2, a tenth of what the whole op costs there.  It does not look at every device type (not at MPS, for
# one), so it is trusted only for CPU and CUDA tensors; others are asked per device.
_any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def _autocast_state(t: Tensor):
    """``(device type, autocast dtype)`` when autocast is on for ``t``'s device, else ``None``."""
    if (t.is_cpu or t.is_cuda) and not _any_autocast_enabled():
        return None
    device_type = t.device.type
    dtype = _autocast_dtype(device_type)
    return None if dtype is None else (device_type, dtype)


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
        ctx.autocast = _autocast_state(a)                               # None: autocast was off

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        state = ctx.autocast
        if state is None and _autocast_state(a) is None:                # the usual case: no autocast anywhere
            return formulas.attn_backward(grad_o, grad_a, q, k, v, a, ctx.needs_input_grad)   # (9)-(13)
        # Re-enter the forward's autocast state, or switch autocast off for a's device if the forward ran
        # without it (an autocast the caller opened around backward must not change its precision).
        device_type, dtype = state if state is not None else (a.device.type, None)
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
    ``(B, n, n)`` buffer in backward, or on CPU from 32 MiB on none: blocks of whole examples or rows, eq.
    (31)).  No validation here: the vmap rule checked one example."""

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
    return tuple(t if d == 0 else t.movedim(d, 0) if d is not None else t.expand(size, *t.shape)
                 for t, d in zip(tensors, in_dims))


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
    if torch._C._are_functorch_transforms_active():
        out = _vmap_direct(q, k, v)          # torch.vmap (nested or not) and nothing else: skip functorch's glue
        return AttnOutput(*(out if out is not None else AttnFunction.apply(q, k, v)))
    return AttnOutput(*_apply(AttnFunction, _apply_eager, q, k, v))


def _plain(q, k, v) -> bool:
    """No functorch transform is active and no input is a tensor that escaped one (``Function.apply``
    unwraps those): the C++ apply below is safe."""
    if not formulas._CAN_CHECK_WRAPPERS or torch._C._are_functorch_transforms_active():
        return False
    wrapped = formulas._is_functorch_wrapped
    try:
        return not (wrapped(q) or wrapped(k) or wrapped(v))
    except TypeError:          # not a tensor: Function.apply runs forward, whose check_inputs names the argument
        return False


def _apply(function, apply_eager, q, k, v):
    """``function.apply(q, k, v)``, through the C++ apply ``apply_eager`` in plain eager mode (below)."""
    return apply_eager(q, k, v) if _plain(q, k, v) else function.apply(q, k, v)


def _apply_batched(q, k, v):
    return _apply(BatchedAttnFunction, _apply_batched_eager, q, k, v)


# ``Function.apply`` first binds default arguments with ``inspect.signature`` on every call (about 11 µs, more
# than the whole forward at the lab's size), then calls the C++ ``_FunctionBase.apply``.  ``forward`` has no
# default arguments, so in plain eager mode ``attn`` calls the C++ apply directly: the same autograd node,
# ``setup_context``, ``backward`` and ``jvp``.  Under functorch transforms or torch.compile, or given a tensor
# that escaped a transform (``Function.apply`` unwraps those), it uses ``Function.apply``.
_apply_eager = super(torch.autograd.Function, AttnFunction).apply
_apply_batched_eager = super(torch.autograd.Function, BatchedAttnFunction).apply


# --- torch.vmap without functorch's per-call glue ------------------------------------------------------------
# ``torch.vmap(attn)`` reaches ``AttnFunction.vmap`` through ``custom_function_call``'s vmap rule, which
# flattens inputs and outputs with pytree and checks output identity on every call: about 0.35 ms per
# fwd+bwd, 2-4% of a whole 32 x 256 step.  When every transform on functorch's stack is a vmap (the
# batch-and-heads case), ``_vmap_direct`` does what that rule and ``attn_vmap`` do together, with the C
# functions they use: unwrap each vmap level (innermost first), validate one example with the 2-D contract,
# apply ``BatchedAttnFunction`` to the plain stacks with the vmap levels popped (as ``interpreter.lower()``
# does), and wrap the outputs back.  Anything else -- another transform on the stack, an argument that is not
# a tensor, no input batched, a torch without these functions -- returns ``None`` and takes the general path.
_fc = torch._C._functorch
_VMAP_API = all(hasattr(_fc, name) for name in (
    "get_interpreter_stack", "CVmapInterpreterPtr", "TransformType", "_unwrap_batched", "_add_batch_dim",
    "pop_dynamic_layer_stack", "push_dynamic_layer_stack"))


def _vmap_direct(q, k, v):
    """``torch.vmap``-ed ``attn`` as one ``BatchedAttnFunction`` call on plain 3-D stacks, or ``None``."""
    if not _VMAP_API or not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
        return None
    stack = _fc.get_interpreter_stack()
    if not stack or any(i.key() != _fc.TransformType.Vmap for i in stack):
        return None
    tensors, batched = (q, k, v), []               # batched: (level, size) of the levels that batch an input
    for interpreter in reversed(stack):            # innermost level first, the order the wrappers are nested in
        level, size = interpreter.level(), _fc.CVmapInterpreterPtr(interpreter).batchSize()
        unwrapped = [_fc._unwrap_batched(t, level) for t in tensors]
        if all(dim is None for _, dim in unwrapped):
            continue                               # as custom_function_call does: this level is not ours
        tensors = _batch_first(size, [d for _, d in unwrapped], [t for t, _ in unwrapped])
        batched.append((level, size))
    if not batched or (formulas._CAN_CHECK_WRAPPERS and any(formulas._is_functorch_wrapped(t) for t in tensors)):
        return None                                # nothing batched, or a tensor from a transform now gone
    depth = len(batched)                           # tensors: (B_outer, ..., B_inner, n, .) after the loop
    check_inputs(*(_example_nd(t, depth) for t in tensors))
    if depth > 1:
        tensors = [t.flatten(0, depth - 1) for t in tensors]
    saved = []
    try:
        for _ in stack:                            # pop the vmap levels: plain autograd, as interpreter.lower()
            saved.append(_fc.pop_dynamic_layer_stack())
        outputs = _apply_batched(*tensors)
    finally:
        while saved:
            _fc.push_dynamic_layer_stack(saved.pop())
    shape = [size for _, size in reversed(batched)]
    wrapped = []
    for t in outputs:
        if depth > 1:
            t = t.unflatten(0, shape)
        for level, _ in reversed(batched):         # outermost level first: each wrap hides the leading dim
            t = _fc._add_batch_dim(t, 0, level)
        wrapped.append(t)
    return wrapped


def _example_nd(t: Tensor, depth: int) -> Tensor:
    """One example of a stack whose first ``depth`` dimensions are batch dimensions (see ``_example``)."""
    for _ in range(depth):
        t = _example(t, 0)
    return t


def attn_reference(q: Tensor, k: Tensor, v: Tensor) -> AttnOutput:
    """The plain composite of three torch ops, differentiated by autograd: the oracle for comparisons.

    Same input checks as :func:`attn`, so both raise the same errors."""
    check_inputs(q, k, v)
    a = torch.tanh(q @ k.mT)
    return AttnOutput(a @ v, a)
