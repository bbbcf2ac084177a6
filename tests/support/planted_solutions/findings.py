"""Planted solutions for crosscheck's review (tests/crosscheck/test_review.py): each has the right numbers and
ONE of the flaws the lab's reviewers flagged in real solutions; ``Lean`` has none (its review must be clean).

``FINDINGS`` maps each name to the review finding (``crosscheck.review.Finding.key``) it must produce.  Torch
solutions are ``autograd.Function`` subclasses (``tests/support/planted_solutions/findings.py:NAME``); JAX ones are
built on demand (``jax_NAME``), so importing this module does not import JAX.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from torch_impl import check_inputs
from torch_impl import formulas as TF


class Lean(torch.autograd.Function):
    """What the lab asks: validate first, save a and only the inputs the requested gradients read, None for an
    absent output gradient, only the gradients needs_input_grad asks for."""

    @staticmethod
    def forward(q, k, v):
        check_inputs(q, k, v)
        return TF.attn_forward(q, k, v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        need_q, need_k, _ = ctx.needs_input_grad
        ctx.save_for_backward(q if need_k else None, k if need_q else None, v if need_q or need_k else None,
                              output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, go, ga):
        q, k, v, a = ctx.saved_tensors
        return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)


def _variant(name: str, **methods):
    return type(name, (Lean,), {key: staticmethod(fn) for key, fn in methods.items()})


def _no_check_forward(q, k, v):
    return TF.attn_forward(q, k, v)


def _no_n_check_forward(q, k, v):
    """Checks everything but n: q, k, v 2-D, one dtype, d of q and k equal."""
    for name, t in zip("qkv", (q, k, v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise TypeError(f"attn(): argument '{name}' must be a 2-D tensor")
    if q.shape[1] != k.shape[1]:
        raise ValueError("attn(): q and k must have the same second dimension d")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError("attn(): q, k and v must have the same dtype")
    return TF.attn_forward(q, k, v)


def _save_x(ctx, inputs, output):
    q, k, v = inputs
    ctx.save_for_backward(q, k, v, output[1], q @ k.mT)               # x = q kᵀ kept: n x n memory for nothing
    ctx.set_materialize_grads(False)


def _x_on_ctx(ctx, inputs, output):
    _save_all(ctx, inputs, output)
    ctx.x = inputs[0] @ inputs[1].mT                                  # outside save_for_backward, and n x n


def _save_all(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])
    ctx.set_materialize_grads(False)


def _backward_saved_all(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors[:4]
    return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)


def _recompute_tanh(ctx, go, ga):
    q, k, v, _ = ctx.saved_tensors
    a = torch.tanh(q @ k.mT)                                          # recomputed: a was saved
    return TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)


def _materialize(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])                         # set_materialize_grads left True


def _backward_all_grads(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    return TF.attn_backward(go, ga, q, k, v, a, (True, True, True))


def _zeros_for_unrequested(ctx, go, ga):
    q, k, v, a = ctx.saved_tensors
    grads = TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, (q, k, v)))


def _zeros_not_none(ctx, go, ga):
    """A requested gradient that is zero (v's when o is unused) returned as zeros, not None."""
    q, k, v, a = ctx.saved_tensors
    grads = TF.attn_backward(go, ga, q, k, v, a, ctx.needs_input_grad)
    return tuple(torch.zeros_like(x) if g is None and need else g
                 for g, x, need in zip(grads, (q, k, v), ctx.needs_input_grad))


def _computes_all(ctx, go, ga):
    """Computes every gradient, returns only the requested ones."""
    q, k, v, a = ctx.saved_tensors
    grads = TF.attn_backward(go, ga, q, k, v, a, (True, True, True))
    return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def _non_differentiable_a(ctx, inputs, output):
    _save_all(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1])


@once_differentiable
def _once(ctx, go, ga):
    return _backward_saved_all(ctx, go, ga)


NoValidation = _variant("NoValidation", forward=_no_check_forward)
MissesNCheck = _variant("MissesNCheck", forward=_no_n_check_forward)
SavesX = _variant("SavesX", setup_context=_save_x, backward=_backward_saved_all)
SavesUnneeded = _variant("SavesUnneeded", setup_context=_save_all, backward=_backward_saved_all)
KeepsXOnCtx = _variant("KeepsXOnCtx", setup_context=_x_on_ctx, backward=_backward_saved_all)
RecomputesTanh = _variant("RecomputesTanh", setup_context=_save_all, backward=_recompute_tanh)
MaterializesZeros = _variant("MaterializesZeros", setup_context=_materialize, backward=_backward_saved_all)
ZerosForUnrequested = _variant("ZerosForUnrequested", setup_context=_save_all, backward=_zeros_for_unrequested)
ReturnsZeros = _variant("ReturnsZeros", setup_context=_save_all, backward=_zeros_not_none)
ComputesAll = _variant("ComputesAll", setup_context=_save_all, backward=_computes_all)
NonDifferentiableA = _variant("NonDifferentiableA", setup_context=_non_differentiable_a,
                              backward=_backward_saved_all)
OnceDifferentiable = _variant("OnceDifferentiable", setup_context=_save_all, backward=_once)

FINDINGS = {
    "NoValidation": "validation",
    "MissesNCheck": "validation",
    "SavesX": "saves_nxn",
    "SavesUnneeded": "saves_unneeded",
    "KeepsXOnCtx": "ctx_attributes",
    "RecomputesTanh": "recomputes",
    "MaterializesZeros": "zeros",
    "ZerosForUnrequested": "returns_unrequested",
    "ReturnsZeros": "returns_zeros",
    "ComputesAll": "computes_unrequested",
    "NonDifferentiableA": "a_not_differentiable",
    "OnceDifferentiable": "not_twice_differentiable",
}


# --- JAX --------------------------------------------------------------------------------------------------------------

def _jax_solutions():
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero

    import jax_impl
    from jax_impl import formulas as JF
    from tests.support.planted_bugs import _jax_function, jax_symbolic_function   # repository root on sys.path

    def lean_bwd(res, g):
        q, k, v, a = res
        go, ga = (None if isinstance(c, SymbolicZero) else c for c in g)
        return JF.attn_backward(go, ga, q, k, v, a)

    def recompute_bwd(res, g):
        q, k, v, _ = res
        return lean_bwd((q, k, v, jnp.tanh(q @ k.T)), g)             # a recomputed from q, k

    def checked(fn):
        def attn(q, k, v):
            jax_impl.check_inputs(q, k, v)
            return fn(q, k, v)
        return attn

    return {"lean": checked(jax_symbolic_function(lean_bwd)), "no_validation": jax_symbolic_function(lean_bwd),
            "recomputes_tanh": checked(jax_symbolic_function(recompute_bwd)),
            # symbolic_zeros=False: an unused output's cotangent arrives as dense zeros, multiplied through
            "dense_zeros": checked(_jax_function(JF.attn_backward))}


JAX_FINDINGS = {"no_validation": "validation", "recomputes_tanh": "recomputes", "dense_zeros": "zeros"}


def __getattr__(name):                                # jax_lean, jax_no_validation, ... built on first use
    if name.startswith("jax_") and (name[4:] in JAX_FINDINGS or name == "jax_lean"):
        globals()[name] = _jax_solutions()[name[4:]]
        return globals()[name]
    raise AttributeError(name)
