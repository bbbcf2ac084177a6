"""PyTorch side: running a hand-written VJP/JVP, and the autodiff oracles of a reference function.

Every function takes ``inputs`` (a tuple of tensors) and a *list* of cotangent (or tangent) tuples, one per
"mode" (e.g. cotangent on both outputs, on ``o`` only, on ``a`` only), with ``None`` for an output (input) that
gets none, and returns one result tuple per mode.  Results are in PyTorch's complex convention.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.autograd import forward_ad

__all__ = ["to_torch", "to_numpy", "autograd_vjp", "forward_ad_jvp", "func_vjp", "jacrev_vjp", "func_jvp",
           "JvpUnsupported"]

Tensors = Tuple[Optional[torch.Tensor], ...]


class JvpUnsupported(Exception):
    """The implementation has no forward-mode rule (an ``autograd.Function`` without ``jvp``)."""


def to_torch(x: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def to_numpy(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    if t is None:
        return None
    return t.detach().resolve_conj().resolve_neg().cpu().numpy()


def _tuple_fn(fn: Callable) -> Callable:
    return lambda *xs: tuple(fn(*xs))          # NamedTuple / list outputs -> plain tuple (a pytree torch.func likes)


def _zeros_for_none(cots: Sequence, outs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    return tuple(torch.zeros_like(o) if c is None else c for c, o in zip(cots, outs))


def autograd_vjp(fn: Callable) -> Callable:
    """The VJP that ``fn``'s own backward computes, through ``torch.autograd.grad``: outputs without a
    cotangent are left out, so a custom ``Function`` sees ``None`` for them (as in real use)."""

    def vjp(inputs: Tensors, cots_list: Sequence[Tensors]) -> List[Tensors]:
        results = []
        for cots in cots_list:
            leaves = tuple(x.detach().requires_grad_() for x in inputs)
            outs = tuple(fn(*leaves))
            pairs = [(o, c) for o, c in zip(outs, cots) if c is not None]
            grads = torch.autograd.grad([o for o, _ in pairs], leaves, [c for _, c in pairs], allow_unused=True)
            results.append(tuple(grads))
        return results

    return vjp


def forward_ad_jvp(fn: Callable) -> Callable:
    """The JVP that ``fn``'s own forward-mode rule computes (``autograd.Function.jvp``), through dual tensors.
    Inputs without a tangent are passed as plain tensors."""

    def jvp(inputs: Tensors, tangents_list: Sequence[Tensors]) -> List[Tensors]:
        results = []
        for tangents in tangents_list:
            with forward_ad.dual_level():
                duals = tuple(x if t is None else forward_ad.make_dual(x, t) for x, t in zip(inputs, tangents))
                try:
                    outs = tuple(fn(*duals))
                except NotImplementedError as e:
                    if "jvp" in str(e):
                        raise JvpUnsupported(str(e)) from e
                    raise
                results.append(tuple(forward_ad.unpack_dual(o).tangent for o in outs))
        return results

    return jvp


def func_vjp(reference: Callable, inputs: Tensors, cots_list: Sequence[Tensors]) -> List[Tensors]:
    """``torch.func.vjp`` of the reference composite (absent cotangents are zeros)."""
    outs, vjp_fn = torch.func.vjp(_tuple_fn(reference), *inputs)
    return [tuple(vjp_fn(_zeros_for_none(cots, outs))) for cots in cots_list]


def func_jvp(reference: Callable, inputs: Tensors, tangents_list: Sequence[Tensors]) -> List[Tensors]:
    """``torch.func.jvp`` of the reference composite (absent tangents are zeros)."""
    f = _tuple_fn(reference)
    results = []
    for tangents in tangents_list:
        _, out_tangents = torch.func.jvp(f, tuple(inputs), _zeros_for_none(tangents, inputs))
        results.append(tuple(out_tangents))
    return results


def jacrev_vjp(reference: Callable, inputs: Tensors, cots_list: Sequence[Tensors]) -> List[Tensors]:
    """The VJP from the materialised Jacobian ``torch.func.jacrev(reference)``, contracted with each cotangent.

    ``torch.func.jacrev`` rejects complex tensors, so complex functions are differentiated in their real view
    ``(Re z, Im z) ↦ (Re w, Im w)``: by real calculus, the gradient of ``L = Σ Re(conj(g) w)`` is
    ``∂L/∂Re z + i ∂L/∂Im z``, which is PyTorch's convention — so this oracle derives the conjugations of
    (4)-(13) from scratch instead of trusting torch's complex autograd."""
    f = _tuple_fn(reference)
    n_in = len(inputs)
    if not inputs[0].is_complex():
        jac = torch.func.jacrev(f, argnums=tuple(range(n_in)))(*inputs)        # jac[out][in]
        results = []
        for cots in cots_list:
            grads = []
            for i, x in enumerate(inputs):
                g = torch.zeros_like(x)
                for j, c in enumerate(cots):
                    if c is not None:
                        g = g + torch.tensordot(c, jac[j][i], dims=c.dim())
                grads.append(g)
            results.append(tuple(grads))
        return results

    def real_view(*parts):
        zs = [torch.complex(parts[2 * i], parts[2 * i + 1]) for i in range(n_in)]
        return tuple(p for w in f(*zs) for p in (w.real, w.imag))

    parts = tuple(p for z in inputs for p in (z.real.clone(), z.imag.clone()))
    jac = torch.func.jacrev(real_view, argnums=tuple(range(2 * n_in)))(*parts)   # jac[2*out + re/im][2*in + re/im]
    results = []
    for cots in cots_list:
        grads = []
        for i, x in enumerate(inputs):
            re_im = []
            for part in (2 * i, 2 * i + 1):
                g = torch.zeros_like(x.real)
                for j, c in enumerate(cots):
                    if c is None:
                        continue
                    for w_part, c_part in ((2 * j, c.real), (2 * j + 1, c.imag)):
                        g = g + torch.tensordot(c_part, jac[w_part][part], dims=c.dim())
                re_im.append(g)
            grads.append(torch.complex(*re_im))
        results.append(tuple(grads))
    return results


# --- is the gradient hand-written? ------------------------------------------------------------------------------------

def _is_custom_node(node) -> bool:
    """A node whose backward someone wrote: an ``autograd.Function`` (also what ``torch.library``'s
    ``register_autograd`` / an ``Autograd``-key kernel applying a Function, like ``torch.ops.attn_lab.attn``,
    records), a C++ ``torch::autograd::Function`` (``CppNode<...>``), or a C++ node with no Python class
    (``CppFunction``): every node of PyTorch's own ops has a generated class (``MmBackward0``), so an unbound one
    is an out-of-tree derivatives.yaml-style node, like upstream/'s compiled ``TanhAttentionBackward0``."""
    name = type(node).__name__
    return isinstance(node, torch.autograd.function.BackwardCFunction) or name.startswith("CppNode") \
        or name == "CppFunction"


# Nodes that only move or copy data (their backward is a transpose / reshape / copy, no calculus): allowed between
# the inputs and a hand-written node, e.g. ``MyAttn.apply(q, k.mT.contiguous(), v)``.
_LAYOUT_NODES = ("CloneBackward", "ToCopyBackward", "ViewBackward", "UnsafeViewBackward", "TBackward",
                 "TransposeBackward", "PermuteBackward", "AliasBackward", "ExpandBackward", "SqueezeBackward",
                 "UnsqueezeBackward", "ReshapeAliasBackward")


def autodiff_path(fn: Callable, inputs: Tensors, output_names: Sequence[str],
                  input_names: Sequence[str]) -> Optional[str]:
    """``None`` when autograd differentiates none of ``fn``'s math: every node of its graph that lies between
    the outputs and the inputs ``q, k, v`` without a hand-written node (see ``_is_custom_node``) in between is a
    pure data-movement node (``_LAYOUT_NODES``).  Otherwise one path through such a node, e.g. ``"o ← MmBackward0
    ← TanhBackward0 ← MmBackward0 ← q"``: autograd derives that part of the gradient from the forward's own ops
    (a plain function of torch ops, a ``CompositeImplicitAutograd`` op, ``Function.forward`` called directly
    instead of ``.apply``, or a Function for only a piece, e.g. tanh, with the matmuls left to autograd).
    Post-processing of a hand-written node's outputs (``o * 1``) is allowed."""
    leaves = tuple(x.detach().requires_grad_() for x in inputs)
    with torch.enable_grad():
        outs = tuple(fn(*leaves))
    leaf_name = {id(x): name for x, name in zip(leaves, input_names)}
    raw_memo: dict = {}

    def raw_path(node) -> Optional[List[str]]:
        """Node names from ``node`` down to an input, through no hand-written node; None if there is none."""
        if node is None or _is_custom_node(node):
            return None
        if id(node) in raw_memo:
            return raw_memo[id(node)]
        raw_memo[id(node)] = None                          # (graphs are acyclic; guards against revisits)
        variable = getattr(node, "variable", None)         # AccumulateGrad of a leaf
        if variable is not None:
            result = [leaf_name[id(variable)]] if id(variable) in leaf_name else None
        else:
            result = None
            for nxt, _ in node.next_functions:
                sub = raw_path(nxt)
                if sub is not None:
                    result = [type(node).__name__] + sub
                    break
        raw_memo[id(node)] = result
        return result

    seen: set = set()

    def search(node, above: List[str]) -> Optional[List[str]]:
        """Depth-first over the whole graph (through hand-written nodes too) for a math node with a raw path."""
        if node is None or id(node) in seen or getattr(node, "variable", None) is not None:
            return None
        seen.add(id(node))
        name = type(node).__name__
        if not _is_custom_node(node) and not name.startswith(_LAYOUT_NODES):
            path = raw_path(node)
            if path is not None:
                return above + path
        for nxt, _ in node.next_functions:
            found = search(nxt, above + [name])
            if found is not None:
                return found
        return None

    for out, name in zip(outs, output_names):
        path = search(getattr(out, "grad_fn", None), [name])
        if path is not None:
            return " ← ".join(path)
    return None
