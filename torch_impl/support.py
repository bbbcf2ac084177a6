"""What ``AttnFunction`` needs around the math that is not the math: autocast state for backward, the vmap rule's
batch-first layout, the refusal of nested forward-mode levels, and ``sharded``: whether an argument is a DTensor
(the entries then go to ``torch_impl.sharded``).  (Read ``function.py`` first.)"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import torch
from torch import Tensor

from . import internals
from .internals import Answer

__all__ = ["autocast_state", "autocast_like", "batch_first", "refuse_nested_forward_levels", "sharded"]


def sharded(*tensors) -> bool:
    """Some argument is a DTensor: the lab's entries then run ``torch_impl.sharded.rules.attn``.  Asked without
    importing ``torch.distributed.tensor`` (seconds to import): if nobody imported it, nothing is a DTensor."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and any(isinstance(t, module.DTensor) for t in tensors)


# --- autocast: backward runs under the forward's autocast state ----------------------------------------------
# torch.amp's custom_fwd / custom_bwd contract, done by hand because those decorators take one fixed device type
# and an old-style forward(ctx, ...).  The backward's matmuls then cast the saved inputs as the forward's did,
# and an autocast the caller opened around backward() does not change its precision.
def autocast_state(t: Tensor):
    """The autocast dtype in effect for ``t``'s device, or ``None`` (autocast off, or none for this device)."""
    device_type = t.device.type
    if torch.compiler.is_compiling():
        # torch 2.11's dynamo cannot trace is_autocast_available (2.13's can); a traced tensor is on a device
        # autocast knows, save meta (where is_autocast_enabled raises).
        available = device_type != "meta"
    else:
        available = torch.amp.is_autocast_available(device_type)
    if available and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast_like(dtype, t: Tensor):
    """Enter autocast at ``dtype`` for ``t``'s device (``None``: autocast off there), unless already so."""
    if autocast_state(t) == dtype:
        return nullcontext()
    return torch.autocast(t.device.type, dtype=dtype, enabled=dtype is not None)


def batch_first(size: int, in_dims, tensors):
    """A vmap rule's tensors with the vmapped dimension first; unbatched ones expanded (a view, no copy)."""
    return [t.movedim(d, 0) if d is not None else t.expand(size, *t.shape) for t, d in zip(tensors, in_dims)]


# --- forward over forward -------------------------------------------------------------------------------------
_NESTED_FORWARD_MESSAGES = {
    Answer.YES: "AttnFunction.jvp under two torch.func forward-mode levels (jacfwd(jacfwd(f)), jvp(jvp(f))) would "
                "give wrong second derivatives (PyTorch does not differentiate a custom Function's jvp), so it "
                "refuses; call torch_impl.attn, which differentiates the formulas there, or use jacfwd(jacrev(f)).",
    Answer.UNKNOWN: "AttnFunction.jvp: this torch does not let torch_impl see its torch.func levels, and under two "
                    "forward-mode levels a Function's jvp gives wrong second derivatives, so forward mode through "
                    "AttnFunction is refused here; use torch.ops.attn_lab.attn_composite, or reverse mode.",
}


def refuse_nested_forward_levels() -> None:
    """PyTorch runs a Function's jvp with forward-mode AD off, so an outer forward level cannot see it: under two
    ``torch.func`` forward levels the second order would come out wrong with no error.  Refuse instead (and
    refuse all forward mode where ``internals`` cannot see the levels)."""
    nested = internals.nested_forward_levels()
    if nested is not Answer.NO:
        raise NotImplementedError(_NESTED_FORWARD_MESSAGES[nested])
