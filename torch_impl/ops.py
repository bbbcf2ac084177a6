"""Tanh attention as dispatcher operators in the ``attn_lab`` namespace (lab parts III and IV).

    >>> import torch, torch_impl                     # importing the package registers the operators
    >>> o, a = torch.ops.attn_lab.attn(q, k, v)      # explicit kernel + hand-written autograd (part IV)
    >>> o, a = torch.ops.attn_lab.attn_composite(q, k, v)   # CompositeImplicitAutograd (part III)

In-tree, an operator is a ``native_functions.yaml`` entry (schema + ``dispatch:`` section) and, when it has
its own gradient, a ``derivatives.yaml`` entry.  Out of tree the same dispatcher registrations are made with
``torch.library.Library``; the mapping is:

===========================================  ==================================================================
in-tree                                      here
===========================================  ==================================================================
``func: attn(Tensor q, ...) -> (Tensor o,    ``_LIB.define(SCHEMA)`` (named outputs ``o``, ``a``)
Tensor a)``
``dispatch: CompositeImplicitAutograd:``     ``attn_composite``: kernel made of differentiable ops; autograd
                                             (and vmap, forward AD, autocast, FakeTensor, compile) see through
                                             it, exactly like an in-tree composite
``dispatch: CompositeExplicitAutograd:``     ``attn``: one kernel for every backend (it is made of aten ops)
``derivatives.yaml`` ``self: ...`` (VJP)     ``Autograd`` kernel -> ``_AttnOpFunction.backward`` ->
and ``result: ...`` (JVP)                    ``formulas.attn_backward`` / ``.jvp`` -> ``formulas.attn_jvp``
meta function / ``Meta`` dispatch            ``torch.library.register_fake`` (FakeTensor, compile, export)
an inductor decomposition                    under ``torch.compile`` the ``Autograd`` kernel emits
(``torch/_inductor/decomposition.py``)       ``formulas.attn_forward``'s aten ops instead of the op
                                             (``_inline_for_compiler``); ``torch.export`` keeps the op
``BatchRules*.cpp`` batching rule            ``torch.library.register_vmap``
``autocast_mode.cpp`` ``KERNEL_*(...,        ``Autocast{CPU,CUDA}`` kernels: cast like ``matmul`` (the op's
lower_precision_fp)``                        first and last step) would, then run with autocast excluded
===========================================  ==================================================================

Why an ``Autograd`` kernel and not ``torch.library.register_autograd``: ``register_autograd`` (like
``custom_op``) only takes a backward; it has no forward-mode (JVP) hook, so an op registered that way raises
on ``torch.autograd.forward_ad`` / ``torch.func.jvp`` / ``jacfwd``.  ``register_autograd`` itself is
implemented (``torch/_library/autograd.py``) as an ``Autograd``-key kernel that applies a generated
``autograd.Function`` whose ``forward`` redispatches below autograd.  We register the same thing by hand,
with a Function that also has ``jvp`` (and ``setup_context``, which functorch's transforms require): it is
``AttnFunction`` with only ``forward`` overridden, so the op and the Function share ``setup_context``,
``backward`` and ``jvp`` -- one copy of the glue, and ``torch_impl.formulas`` is the one copy of the math.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._functorch.utils import enable_single_level_autograd_function
from torch.autograd.forward_ad import _set_fwd_grad_enabled

from . import formulas
from .function import AttnFunction, BatchedAttnFunction, vmap_inputs
from .validation import check_inputs

__all__ = ["NAMESPACE", "SCHEMA"]

NAMESPACE = "attn_lab"
# One schema for both operators, outputs named as in native_functions.yaml (``torch.ops`` returns a plain tuple;
# ``torch_impl.attn`` returns the ``AttnOutput`` named tuple).
SCHEMA = "(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)"

# Device types whose autocast dispatch key gets a kernel (the keys exist in every build, GPU or not).
_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")


# ------------------------------------------------------------------------------------- parts III and IV
def _attn_forward_kernel(q: Tensor, k: Tensor, v: Tensor):
    """Eqs. (1)-(3) after validation: the kernel of both operators, registered under two keys.

    * ``attn_composite`` (part III), ``CompositeImplicitAutograd``: runs *above* autograd, so autograd records
      and differentiates the aten ops.  ``formulas.attn_forward``'s only in-place write (``tanh_`` on the
      fresh ``x = q kᵀ``) is taken only when ``formulas._owns_scratch`` says nothing can observe it (grad
      mode off, no forward-AD tangent, no functorch / legacy-vmap wrapper): with grad mode on the
      out-of-place ``tanh`` is recorded; under ``no_grad`` / ``inference_mode`` the write saves an n×n buffer.
    * ``attn`` (part IV), ``CompositeExplicitAutograd``: the forward for every backend, reached below
      autograd; its gradient comes from the ``Autograd`` kernel below.
    """
    check_inputs(q, k, v)
    return formulas.attn_forward(q, k, v)                       # (1)-(3)


def _attn_fake(q: Tensor, k: Tensor, v: Tensor):
    """Fake (meta) kernel: validation and output metadata only, no compute.

    Outputs are fresh contiguous tensors like the real kernel's matmul results: ``o: (n, e)``,
    ``a: (n, n)``, in the inputs' (single, validated) dtype."""
    check_inputs(q, k, v)
    n, e = q.shape[0], v.shape[1]
    return q.new_empty((n, e)), q.new_empty((n, n))


def _inline_for_compiler() -> bool:
    """``torch.compile`` is tracing (Dynamo's fake run, AOTAutograd's joint / inference graph), and not
    ``torch.export``.

    Then the op's autograd kernel runs ``_attn_forward_kernel``'s aten ops (``mm``, ``tanh``, ``mm``) instead of
    redispatching to the opaque ``attn_lab::attn``, so the forward graph holds the formulas and inductor can
    fuse them, as it already did with the backward (AOTAutograd traces ``formulas.attn_backward``).  The
    backward and forward-AD rules stay the hand-written ones.  ``torch.export`` keeps the op (a portable
    graph; ``run_decompositions`` preserves custom ops): its pre-dispatch trace records the op above autograd
    and never reaches this kernel, so the ``is_exporting`` test is a guard for export paths that might (not
    needed by ``tests/test_ops.py::test_export_keeps_the_op``).  Eager code and ``make_fx`` outside
    torch.compile keep the op too."""
    return torch.compiler.is_compiling() and not torch.compiler.is_exporting()


class _AttnOpFunction(AttnFunction):
    """The autograd node of ``attn_lab::attn`` (its ``derivatives.yaml`` entry).

    Inherits ``setup_context`` / ``backward`` (VJP, eqs. 9-13) / ``jvp`` (JVP, eqs. 14-16) from
    ``AttnFunction``; only ``forward`` differs: it redispatches to the operator below autograd, so the
    kernels registered above (explicit, fake, vmap) run and graphs record ``attn_lab.attn`` -- except while
    ``torch.compile`` traces (``_inline_for_compiler``), where it emits the formulas' aten ops."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor):
        if _inline_for_compiler():
            return _attn_forward_kernel(q, k, v)                    # (1)-(3), traced into the graph
        if torch._C._are_functorch_transforms_active():
            # ``Function.apply`` turned grad and forward-grad mode off, and those thread-local modes would also
            # switch off the *lower* functorch levels the redispatch reaches next (jacfwd(jacrev(op)) would
            # drop its tangents).  Like functorch's own generated Function (``custom_function_call_grad``),
            # turn them back on for the levels below.
            with torch.enable_grad(), _set_fwd_grad_enabled(True), torch._C._AutoDispatchBelowAutograd():
                return torch.ops.attn_lab.attn.default(q, k, v)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.attn_lab.attn.default(q, k, v)


# `Function.apply` routes through functorch's `custom_function_call` whenever a functorch transform is active,
# which only works when called from the top of the dispatcher.  An Autograd *kernel* runs after functorch's
# grad/jvp interpreter has already unwrapped the tensors of its level (it is the place where the C++
# `VariableType` kernels run), so it must use the plain, single-level apply of `_SingleLevelFunction`.
_apply_single_level = super(torch.autograd.Function, _AttnOpFunction).apply
_apply_batched_single_level = super(torch.autograd.Function, BatchedAttnFunction).apply


def _attn_autograd_kernel(q: Tensor, k: Tensor, v: Tensor):
    """``Autograd`` kernel: the analogue of the generated ``VariableType`` kernel.

    Applies ``_AttnOpFunction`` (records the backward node and computes the forward-AD tangent) when there
    can be something to differentiate: grad mode on, or forward grad mode on with a dual level open (dual
    tensors exist only inside ``forward_ad.dual_level``; so a dual input under ``no_grad`` still gets its
    tangent), or a functorch grad/jvp level.  Otherwise -- plain inference, or inside
    ``_AttnOpFunction.forward`` itself, where both modes are off -- it goes straight to the kernel below
    autograd, as a ``VariableType`` kernel does when nothing requires grad."""
    grad = torch.is_grad_enabled()
    if torch._C._are_functorch_transforms_active():
        if grad or torch._C._is_fwd_grad_enabled():
            with enable_single_level_autograd_function():
                return _apply_single_level(q, k, v)
    elif grad or (torch._C._is_fwd_grad_enabled() and formulas._dual_level_open()):
        return _apply_single_level(q, k, v)
    if _inline_for_compiler():
        return _attn_forward_kernel(q, k, v)                        # (1)-(3), traced into the graph
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.attn_lab.attn.default(q, k, v)


def _attn_op_vmap(info, in_dims, q: Tensor, k: Tensor, v: Tensor):
    """Batching rule of ``attn_lab::attn``: validate one example (``function.vmap_inputs``), then run the
    3-D stack through ``BatchedAttnFunction`` -- formulas (1)-(16) with the eager buffer discipline, and one
    autograd node for whatever differentiates outside the vmap.

    ``register_vmap`` calls its rule from the C++ batching key with the vmap level still on functorch's
    stack, where ``Function.apply`` cannot run (``custom_function_call`` has no ``FuncTorchVmapMode``
    kernel) and the level cannot be popped from Python.  When the unwrapped tensors are plain (the vmap is
    the outermost transform: ``vmap(op)``, with or without ``torch.autograd``), the Function is applied at
    the plain autograd level, as the ``Autograd`` kernel does (``enable_single_level_autograd_function``).
    Under a functorch transform outside the vmap (``grad(vmap(op))``, ``vmap(vmap(op))``) the tensors are
    that transform's wrappers: the rule then runs eqs. (1)-(3) as batched aten ops, which that transform
    differentiates / batches itself, as with an in-tree batching rule."""
    q, k, v = vmap_inputs(info, in_dims, q, k, v)
    if _inline_for_compiler():
        # torch.compile of vmap(op): FakeTensor cannot run a Function from inside this rule (it asserts on
        # detach, "fake_mode.in_kernel_invocation must be False"); emit the batched aten ops, which AOTAutograd
        # differentiates and inductor compiles to the same kernels as for the formulas (see _inline_for_compiler).
        return formulas.attn_forward(q, k, v), (0, 0)              # (1)-(3), batched
    if formulas._CAN_CHECK_WRAPPERS and not any(formulas._is_functorch_wrapped(t) for t in (q, k, v)):
        with enable_single_level_autograd_function():
            return tuple(_apply_batched_single_level(q, k, v)), (0, 0)
    return formulas.attn_forward(q, k, v), (0, 0)              # (1)-(3), batched


def _autocast_kernel(device_type: str):
    """``Autocast<device>`` kernel: what ``autocast_mode.cpp`` does for ``matmul`` (a ``lower_precision_fp``
    op -- eqs. (1) and (3) are matmuls, ``tanh`` runs in its input dtype): inputs keep the eager contract
    (validated first, one dtype), then floating inputs other than float64 are cast to the autocast dtype and
    the op runs with this autocast key excluded, so the kernels below (and the fake kernel) see one dtype.
    The casts are recorded by autograd, so gradients reach the caller's tensors in their own dtype."""
    key = torch._C.DispatchKey.AutocastCPU if device_type == "cpu" else torch._C.DispatchKey.AutocastCUDA

    def kernel(q: Tensor, k: Tensor, v: Tensor):
        check_inputs(q, k, v)
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = (_autocast_cast(t, dtype) for t in (q, k, v))
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return torch.ops.attn_lab.attn.default(q, k, v)

    return kernel


def _autocast_cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    # autocast's `is_eligible`: floating point, not float64 (complex is not floating point).
    return t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t


# ----------------------------------------------------------------------------------------- registration
def _register() -> torch.library.Library:
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    lib.define("attn_composite" + SCHEMA)
    lib.define("attn" + SCHEMA)
    lib.impl("attn_composite", _attn_forward_kernel, "CompositeImplicitAutograd")
    # functorch's OP_DECOMPOSE (BatchRulesDecompositions.cpp): under vmap, decompose instead of the
    # per-example for-loop fallback.
    lib.impl("attn_composite", _attn_forward_kernel, "FuncTorchBatchedDecomposition")
    lib.impl("attn", _attn_forward_kernel, "CompositeExplicitAutograd")
    lib.impl("attn", _attn_autograd_kernel, "Autograd")
    for device_type in _AUTOCAST_DEVICE_TYPES:
        lib.impl("attn", _autocast_kernel(device_type), "Autocast" + device_type.upper())
    torch.library.register_fake(f"{NAMESPACE}::attn", _attn_fake, lib=lib)
    torch.library.register_vmap(f"{NAMESPACE}::attn", _attn_op_vmap, lib=lib)
    return lib


# Re-import safety: `importlib.reload` re-runs this module with its old globals still in place.  Dropping
# the previous Library first unregisters its definitions and kernels, so the fresh ones do not collide.
if "_LIB" in globals():
    _LIB._destroy()
_LIB = _register()

