"""Tanh attention as dispatcher operators in the ``attn_lab`` namespace (lab parts III and IV).

    >>> import torch, torch_impl                     # importing the package registers the operators
    >>> o, a = torch.ops.attn_lab.attn(q, k, v)      # explicit kernel + hand-written backward (part IV)
    >>> o, a = torch.ops.attn_lab.attn_composite(q, k, v)   # CompositeImplicitAutograd (part III)

Out of tree, the pieces of an in-tree operator (``native_functions.yaml``, ``derivatives.yaml``: see ``upstream/``)
are public ``torch.library`` calls: ``SCHEMA`` (``Library.define``, outputs named ``o``, ``a``), a
``CompositeImplicitAutograd`` kernel (part III) and a ``CompositeExplicitAutograd`` one (part IV), an
``Autograd`` kernel (``_autograd_kernel``: applies ``AttnFunction``, backward (9)-(13), jvp (14)-(16); under
``torch.func`` transforms, where PyTorch cannot apply a Function from a kernel, the formulas' aten ops),
``register_fake``, ``register_vmap`` (``_vmap_rule``) and ``Autocast<CPU|CUDA>`` kernels (casting as ``matmul``
would).  The piece-by-piece table, and why not ``torch.library.custom_op`` + ``register_autograd`` (its
Function has no ``jvp``): docs/operators.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import internals, performance
from .function import AttnFunction
from .internals import Answer
from .support import batch_first, sharded
from .validation import check_inputs

__all__ = ["NAMESPACE", "SCHEMA"]

NAMESPACE = "attn_lab"
# One schema for both operators, outputs named as in native_functions.yaml (``torch.ops`` returns a plain tuple;
# ``torch_impl.attn`` returns the ``AttnOutput`` named tuple).
SCHEMA = "(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)"


def _kernel(q: Tensor, k: Tensor, v: Tensor):
    """Eqs. (1)-(3) after validation: the kernel of both operators.  ``tanh`` in place on the fresh scores
    (``performance.attn_forward``) is one n×n buffer, not two, and every transform and autograd differentiate
    the in-place op."""
    check_inputs(q, k, v)
    return performance.attn_forward(q, k, v)                                        # (1)-(3)


def _autograd_kernel(q: Tensor, k: Tensor, v: Tensor):
    """``Autograd`` kernel of ``attn_lab::attn`` (its derivatives.yaml entry): ``AttnFunction`` records the
    hand-written backward and computes the forward-mode tangent.  Under a ``torch.func`` transform, (1)-(3)
    as aten ops instead (see ``internals.transforms_active``): the transform differentiates them."""
    if sharded(q, k, v):                   # DTensors: the block operator under its sharding rules
        from .sharded import rules
        return tuple(rules.attn(q, k, v))
    if internals.transforms_active() is not Answer.NO:
        return _kernel(q, k, v)                                                     # (1)-(3), aten ops
    check_inputs(q, k, v)
    return AttnFunction.apply(q, k, v)


def _fake(q: Tensor, k: Tensor, v: Tensor):
    """Fake (meta) kernel: validation and output metadata only, no compute."""
    check_inputs(q, k, v)
    return q.new_empty((q.shape[0], v.shape[1])), q.new_empty((q.shape[0], q.shape[0]))


def _example(t: Tensor, dim):
    """One vmap example of ``t`` (``dim``: its batch dimension, or ``None``: unbatched, ``t`` itself), as a
    tensor with the per-example shape, dtype and device, also for an empty batch: what ``check_inputs`` sees."""
    if dim is None:
        return t
    return t.select(dim, 0) if t.shape[dim] > 0 else t.new_empty(t.movedim(dim, 0).shape[1:])


def _vmap_rule(info, in_dims, q: Tensor, k: Tensor, v: Tensor):
    """Batching rule of both operators: validate one example with the 2-D contract (the same errors as an
    unbatched call), then (1)-(3) on the stacks as aten ops, which whatever transform is outside the vmap
    differentiates -- as an in-tree ``OP_DECOMPOSE`` would.  (Inside a ``register_vmap`` rule the vmap level is
    still active, where ``AttnFunction.apply`` cannot run; ``vmap(torch_impl.attn)`` keeps the hand-written
    rules through the Function's own vmap staticmethod.)"""
    check_inputs(*(_example(t, d) for t, d in zip((q, k, v), in_dims)))
    return performance.attn_forward(*batch_first(info.batch_size, in_dims, (q, k, v))), (0, 0)   # (1)-(3)


def _autocast_kernel(device_type: str):
    """``Autocast<device>`` kernel, what ``autocast_mode.cpp`` does for ``matmul``: validate, cast floating
    inputs other than float64 to the autocast dtype in effect, run the op with autocast off for the device.
    (``torch.library.register_autocast`` would fix one dtype at registration.)"""
    def kernel(q: Tensor, k: Tensor, v: Tensor):
        check_inputs(q, k, v)
        dtype = torch.get_autocast_dtype(device_type)
        cast = [t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t for t in (q, k, v)]
        with torch.autocast(device_type, enabled=False):
            return torch.ops.attn_lab.attn(*cast)
    return kernel


# --------------------------------------------------------------------------------------- registration
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIB.define("attn_composite" + SCHEMA)                                             # part III
_LIB.impl("attn_composite", _kernel, "CompositeImplicitAutograd")
_LIB.define("attn" + SCHEMA)                                                       # part IV
_LIB.impl("attn", _kernel, "CompositeExplicitAutograd")
_LIB.impl("attn", _autograd_kernel, "Autograd")
for _device_type in ("cpu", "cuda"):
    _LIB.impl("attn", _autocast_kernel(_device_type), "Autocast" + _device_type.upper())
for _name in ("attn", "attn_composite"):
    torch.library.register_vmap(f"{NAMESPACE}::{_name}", _vmap_rule, lib=_LIB)
torch.library.register_fake(f"{NAMESPACE}::attn", _fake, lib=_LIB)
