"""The only private PyTorch APIs this package uses, each feature-detected, each with a safe fallback.

Three questions have no public answer in PyTorch, and each is worth asking:

* ``may_write_in_place``: "can anything observe an in-place write into a buffer I just allocated?"  The
  backward writes (10) into the buffer of (9), and on CPU fills its gradients block by block (31); that
  keeps it to one n×n buffer instead of three.  Those writes are invisible unless a functorch transform
  (``torch.func.grad`` / ``vmap`` / ``jacrev``...) or gradcheck's legacy vmap has wrapped a tensor, and only
  ``torch._C._functorch`` can tell a wrapper from a plain tensor.  Fallback when that is missing:
  "observable", so the formulas run out of place -- two more n×n buffers, the same numbers.
* ``nested_forward_levels``: "are two forward-mode levels of ``torch.func`` open?"  PyTorch runs a custom
  Function's ``jvp`` with forward-mode AD switched off, so ``jacfwd(jacfwd(f))`` through any
  ``autograd.Function`` gets a wrong second derivative *without an error* (an upstream bug; the tests are
  ``tests/impl/test_ops.py::test_forward_over_forward*``).  Only functorch's
  interpreter stack shows the levels.  ``torch_impl.attn`` routes such calls to autograd of the formulas;
  ``AttnFunction.jvp`` refuses them.  Fallback when the stack cannot be read: ``Answer.UNKNOWN``, and
  ``AttnFunction.jvp`` refuses every forward-mode call (``forward_ad`` too) rather than risk a wrong number;
  the operators keep forward mode (aten ops).
* ``transforms_active``: "is a ``torch.func`` transform active?"  The ``Autograd`` kernel of the explicit
  operator ``attn_lab::attn`` applies ``AttnFunction`` -- which PyTorch cannot do from inside a functorch
  level ("could not find kernel for HigherOrderOperator custom_function_call"); there the kernel runs the
  formulas' aten ops instead, which the transform differentiates.  Fallback when the stack cannot be read:
  always the aten ops (autograd of the formulas: right, without the hand-written rules).

Nothing else in ``torch_impl`` imports ``torch._C`` or ``torch._functorch``.
"""

from __future__ import annotations

import enum
from typing import Optional

import torch
from torch.autograd import forward_ad

__all__ = ["Answer", "CAN_CHECK_WRAPPERS", "CAN_SEE_LEVELS", "may_write_in_place", "nested_forward_levels",
           "transforms_active"]


class Answer(enum.Enum):
    """The answer to a question only a private API can answer: ``UNKNOWN`` when this torch does not let us look."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"

_functorch = getattr(torch._C, "_functorch", None)
_is_wrapped = getattr(_functorch, "is_functorch_wrapped_tensor", None)
_is_legacy_batched = getattr(_functorch, "is_legacy_batchedtensor", None)     # torch._vmap_internals (gradcheck)
_interpreter_stack = getattr(_functorch, "get_interpreter_stack", None)
_Jvp = getattr(getattr(_functorch, "TransformType", None), "Jvp", None)

_PLAIN = (torch.Tensor, torch.nn.Parameter)
CAN_CHECK_WRAPPERS = _is_wrapped is not None and _is_legacy_batched is not None
CAN_SEE_LEVELS = _interpreter_stack is not None and _Jvp is not None


def _has_tangent(t: torch.Tensor) -> bool:
    """``t`` carries a forward-mode tangent (``torch.autograd.forward_ad``).  "Yes" when it cannot tell:
    below the Autograd key with a dispatch mode active, ``unpack_dual`` can hit an internal assert."""
    try:
        return forward_ad.unpack_dual(t).tangent is not None
    except RuntimeError:
        return True


def may_write_in_place(*tensors: Optional[torch.Tensor]) -> bool:
    """True when an in-place write into a fresh buffer computed from ``tensors`` cannot be observed: grad mode
    is off (not a ``create_graph=True`` backward), not compiling (functionalization would copy anyway), every
    tensor is a plain one (no subclass: AOTAutograd traces the backward on functional / fake tensors, and on
    torch 2.11 with ``is_compiling()`` false there), and none is a functorch / legacy-vmap wrapper or carries
    a forward-mode tangent."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or not CAN_CHECK_WRAPPERS:
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or _is_wrapped(t) or _is_legacy_batched(t) or _has_tangent(t)):
            return False
    return True


def _levels() -> Optional[list]:
    """functorch's interpreter stack (one entry per active ``torch.func`` level), or None when this torch does
    not let us look."""
    if not CAN_SEE_LEVELS:
        return None
    try:
        return list(_interpreter_stack() or [])
    except (RuntimeError, AttributeError):
        return None


def transforms_active() -> Answer:
    """Is a ``torch.func`` transform (``grad``, ``vmap``, ``jvp``, ...) active?"""
    levels = _levels()
    return Answer.UNKNOWN if levels is None else Answer.YES if levels else Answer.NO


def nested_forward_levels() -> Answer:
    """Are two or more ``torch.func`` forward-mode (``jvp`` / ``jacfwd``) levels open?"""
    levels = _levels()
    if levels is None:
        return Answer.UNKNOWN
    return Answer.YES if sum(1 for level in levels if level.key() == _Jvp) >= 2 else Answer.NO
