"""Fused Triton kernels of tanh attention, and when they are used (docs/kernels.md).

    >>> o = torch_impl.attn_o(q, k, v, causal=True)     # o only, never an n×n tensor (kernels.o_only)
    >>> o, a = torch_impl.attn(q, k, v)                 # on CUDA: the fused kernels below, by default

Two entries share the kernels of ``triton_attn``: ``o_only.attn_o`` (Triton on CUDA, ATen by blocks elsewhere)
and the lab's op, whose ``AttnFunction`` calls ``fused_forward`` / ``fused_backward`` here when ``fused_applies``
(the operators ``attn_lab::fused_forward`` / ``attn_lab::fused_backward``, ``torch.library.triton_op`` where
torch has it).

``triton_applies``: the tensors are on a device of ``DEVICES`` (CUDA); float16, bfloat16, or float32 with TF32
enabled (exact float32 stays on ATen on a GPU: no spill-free kernel with useful tiles; interpreted tests still run
it); the launch table has a proven configuration at that (arch, dtype, width) (``triton_attn.proven``); d, e ≤
``triton_attn.MAX_HEAD_DIM``; triton imports; and the switch is on (``use_fused(False)`` or
``TANH_ATTN_FUSED=0`` at import sends everything to ATen).  triton is imported on the first call that could use
it.  Tests run the kernels on CPU tensors under ``TRITON_INTERPRET=1`` by putting ``"cpu"`` in ``DEVICES``
(``kernel_devices("cuda", "cpu")`` for a block).  Under ``torch.compile``, ``compiled_applies`` chooses between the
``triton_op`` operators (the kernels in the compiled graph) and the opaque / ATen ones: docs/kernels.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch.autograd import forward_ad

__all__ = ["DEVICES", "DTYPES", "use_fused", "fused_enabled", "kernel_devices", "triton_available",
           "triton_applies", "compiled_applies", "differentiated",
           "fused_applies", "dot_precision", "fused_forward", "fused_backward", "triton_module"]

DEVICES = ("cuda",)                                   # device types the Triton kernels run on
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_enabled = os.environ.get("TANH_ATTN_FUSED", "1") != "0"
_module = None                                        # triton_attn once imported; False: triton failed to import


def use_fused(flag: bool = True) -> None:
    """Turn the Triton kernels on (the default) or off (everything on ATen, as on CPU)."""
    global _enabled
    _enabled = bool(flag)


def fused_enabled() -> bool:
    """Whether the switch is on (``use_fused``, ``TANH_ATTN_FUSED``)."""
    return _enabled


@contextlib.contextmanager
def kernel_devices(*device_types: str):
    """Inside the block the Triton kernels take tensors of these device types (``"cpu"``: the interpreter, with
    ``TRITON_INTERPRET=1`` set before triton is imported); ``DEVICES`` is restored after it."""
    global DEVICES
    before, DEVICES = DEVICES, tuple(device_types)
    try:
        yield
    finally:
        DEVICES = before


def triton_available() -> bool:
    """Whether triton is installed (without importing it)."""
    return _module not in (None, False) or (_module is None and importlib.util.find_spec("triton") is not None)


def triton_module():
    """``triton_attn`` (importing triton on first use), or ``None`` where triton cannot be imported."""
    global _module
    if _module is None:
        if importlib.util.find_spec("triton") is None:
            _module = False
        else:
            try:
                from . import triton_attn
                _module = triton_attn
            except ImportError:       # a triton that does not import (no compiler for this platform, ...)
                _module = False
    return _module or None


def triton_applies(*tensors: Optional[Tensor]) -> bool:
    """Whether the Triton kernels take these tensors (``None`` entries ignored): see the module docstring."""
    ts = [t for t in tensors if t is not None]
    if not (_enabled and ts):
        return False
    first = ts[0]
    if first.dtype not in DTYPES or not (type(first) is Tensor or torch.compiler.is_compiling()):
        return False          # another dtype; a DTensor or another subclass, whose buffer the kernels cannot read
        # (under torch.compile the tensors are the compiler's own, fake ones under torch.export; a subclass
        # reaches either operator as itself, and neither has a rule for one: the check would change nothing)
    if not (first.is_cuda and "cuda" in DEVICES) and not (DEVICES != ("cuda",) and first.device.type in DEVICES):
        return False          # another device (reading .device costs a microsecond: only when DEVICES is not CUDA's)
    if first.dtype == torch.float32 and first.is_cuda and dot_precision(torch.float32) == "ieee":
        return False          # exact float32 on a GPU: ATen (no spill-free kernel with useful tiles: docs/kernels.md)
    if triton_module() is None:
        return False
    width = max(ts[0].shape[-1], ts[-1].shape[-1])
    if width > _module.MAX_HEAD_DIM:
        return False
    if first.is_cuda:         # a GPU: only where the static check proved every kernel's launch configuration
        key = _module.dtype_key(first.dtype, dot_precision(first.dtype))
        return _module.proven(_module.cuda_arch(first.device), key, _module.width_of(width, width))
    return True



def compiled_applies(*tensors: Optional[Tensor]) -> bool:
    """Under ``torch.compile``: whether the entries call the ``triton_op`` operators (their kernels visible in
    the compiled graph): ``triton_applies``, on a torch whose ``wrap_triton`` traces these launches
    (``triton_attn.TRACEABLE``)."""
    return triton_applies(*tensors) and _module.TRACEABLE


def differentiated(*tensors: Optional[Tensor]) -> bool:
    """Whether autograd must see through a backward computed from ``tensors``: grad mode is on (a
    ``create_graph=True`` backward) or one of them carries a forward-mode tangent (a backward run on dual
    tensors, as a forward-over-reverse Hessian-vector product does).  The kernels are opaque to both, so the
    backward then runs the ATen formulas (a kernel would drop the tangent: a wrong second order, silently)."""
    if torch.is_grad_enabled():
        return True
    for t in tensors:
        if t is not None:
            try:
                if forward_ad.unpack_dual(t).tangent is not None:
                    return True
            except RuntimeError:          # cannot tell (below autograd, under a dispatch mode): assume it does
                return True
    return False


def fused_applies(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether ``AttnFunction`` runs the lab's op on the fused kernels: ``triton_applies`` to q, k, v, outside
    ``torch.compile`` (where ``attn`` calls an operator instead: ``compiled_applies``)."""
    return triton_applies(q, k, v) and not torch.compiler.is_compiling()


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of the kernels' float32 dots: ``"tf32"`` where the user enabled TF32 for CUDA
    matmuls (``torch.backends.cuda.matmul.fp32_precision`` / ``allow_tf32``), else ``"ieee"`` (exact float32,
    as ATen's matmul).  float16 / bfloat16 dots ignore it."""
    if dtype != torch.float32:
        return "ieee"
    return _float32_matmul_precision()


@torch.compiler.assume_constant_result        # Dynamo cannot trace the getter: read once while tracing, a constant
def _float32_matmul_precision() -> str:
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):              # torch >= 2.9: the new API (legacy setters update it)
        setting = matmul.fp32_precision
        if setting == "none":
            setting = getattr(torch.backends, "fp32_precision", "none")
        return "tf32" if setting == "tf32" else "ieee"
    return "tf32" if matmul.allow_tf32 else "ieee"


# --- the lab's op (o, a) on the fused kernels: what AttnFunction calls ------------------------------------------
def fused_forward(q: Tensor, k: Tensor, v: Tensor):
    """``(o, a)`` (1)-(3) by the fused forward kernel; q (n, d) or a stack (B, n, d), and so on.  o and a are
    two tensors of their own (allocated at the inputs' rank), not views of one buffer: an in-place write on
    either works as on the ATen path."""
    return triton_module().fused_forward_op(q, k, v, dot_precision(q.dtype))


def fused_backward(grad_o: Optional[Tensor], grad_a: Optional[Tensor], q: Optional[Tensor], k: Optional[Tensor],
                   v: Optional[Tensor], a: Tensor, output_mask: Sequence[bool]):
    """(9)-(13) by the fused backward kernels from the saved ``a``; the same arguments and ``None`` rules as
    ``formulas.attn_backward``.  Not differentiable: ``AttnFunction`` calls it only with grad mode off."""
    module = triton_module()
    mask = module.effective_mask(grad_o, grad_a, output_mask)
    grads = module.fused_backward_op(grad_o, grad_a, q, k, v, a, *mask, dot_precision(a.dtype))
    return tuple(g if want else None for g, want in zip(grads, mask))
