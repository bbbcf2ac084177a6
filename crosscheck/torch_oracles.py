"""PyTorch side: running a hand-written VJP/JVP, and the autodiff oracles of a reference function.

Every first-order function takes ``inputs`` (a tuple of tensors) and a *list* of cotangent (or tangent) tuples,
one per "mode" (e.g. cotangent on both outputs, on ``o`` only, on ``a`` only), with ``None`` for an output
(input) that gets none, and returns one result tuple per mode; the hand-written VJP takes ``(wrt, cotangents)``
requests (which inputs require grad).  The second-order functions take one cotangent tuple ``g`` and a second
vector (``w`` on the gradients, or a tangent ``t``).  Results are in PyTorch's complex convention.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.autograd import forward_ad

from .environment import torch_precision as context      # the numeric context (see frameworks.py)

__all__ = ["Array", "as_impl", "xp", "backward_mode", "context", "to_native", "to_numpy", "hand_vjp", "hand_vjp_vjp",
           "hand_hvp", "hand_jvp", "ref_vjp", "ref_vjp_vjp", "ref_hvp", "jacrev_vjp", "ref_jvp", "autodiff_path",
           "is_custom_node", "JvpUnsupported"]

Array = torch.Tensor
xp = torch                                                   # the array namespace
backward_mode = torch.no_grad                                # how a backward runs: grad mode off
Tensors = Tuple[Optional[torch.Tensor], ...]


class JvpUnsupported(Exception):
    """The implementation has no forward-mode rule (an ``autograd.Function`` without ``jvp``)."""


def to_native(x: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def to_numpy(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    """A copy in host memory, from any device (``.numpy()`` alone only works on the CPU)."""
    return None if t is None else t.detach().resolve_conj().resolve_neg().cpu().numpy()


def as_impl(obj):
    """What ``--torch-impl`` calls: an ``autograd.Function`` subclass through its ``apply``."""
    return obj.apply if isinstance(obj, type) and issubclass(obj, torch.autograd.Function) else obj


def _tuple_fn(fn: Callable) -> Callable:
    return lambda *xs: tuple(fn(*xs))          # NamedTuple / list outputs -> plain tuple (a pytree torch.func likes)


def _zeros_for_none(cots: Sequence, outs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    return tuple(torch.zeros_like(o) if c is None else c for c, o in zip(cots, outs))


def _grad(outputs, inputs, cotangents, **kwargs) -> Tuple[Optional[torch.Tensor], ...]:
    """``torch.autograd.grad`` over the pairs whose cotangent is given and whose output is in the graph; an
    output that does not require grad (it does not depend on ``inputs``) contributes zero, and with no such pair
    every gradient is ``None`` (zero)."""
    pairs = [(o, c) for o, c in zip(outputs, cotangents)
             if c is not None and isinstance(o, torch.Tensor) and o.requires_grad]
    if not pairs or not inputs:
        return (None,) * len(inputs)
    return tuple(torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs], allow_unused=True,
                                     **kwargs))


def hand_vjp(fn: Callable) -> Callable:
    """The VJP that ``fn``'s own backward computes, through ``torch.autograd.grad``, per request ``(wrt,
    cotangents)``: only the inputs in ``wrt`` require grad (so a custom ``Function`` sees that
    ``ctx.needs_input_grad``), and outputs without a cotangent are left out (so it sees ``None`` for them), as in
    real use.  Inputs outside ``wrt`` get ``None``: autograd computes nothing for them."""

    def vjp(inputs: Tensors, requests) -> List[Tensors]:
        results = []
        graph = None                                   # one forward per requires-grad pattern, reused by its modes
        for wrt, cots in requests:
            if graph is None or graph[0] != wrt:
                leaves = tuple(x.detach().requires_grad_(bool(w)) for x, w in zip(inputs, wrt))
                graph = (wrt, leaves, tuple(fn(*leaves)))
            _, leaves, outs = graph
            grads = iter(_grad(outs, [x for x, w in zip(leaves, wrt) if w], cots, retain_graph=True))
            results.append(tuple(next(grads) if w else None for w in wrt))
        return results

    return vjp


def _call_with_duals(fn: Callable, duals) -> Tuple[torch.Tensor, ...]:
    """``fn(*duals)`` inside a dual level; a Function without ``jvp`` raises :class:`JvpUnsupported`."""
    try:
        return tuple(fn(*duals))
    except NotImplementedError as e:
        if "jvp" in str(e):
            raise JvpUnsupported(str(e)) from e
        raise


def hand_vjp_vjp(fn: Callable) -> Callable:
    """Second order through ``fn``'s own backward: ``create_graph=True`` builds the graph of the hand-written
    backward, whose VJP with the cotangent ``w`` (on the gradients) is taken w.r.t. the inputs and the
    cotangents ``g``.  Returns ``(d/dq, d/dk, ..., d/dg_o, d/dg_a, ...)``.  A gradient the backward computed
    outside the graph (``.detach()``, ``no_grad``) contributes nothing, so a backward right only to first order
    disagrees here."""

    def vjp_vjp(inputs: Tensors, g: Tensors, w: Tensors) -> Tensors:
        leaves = tuple(x.detach().requires_grad_() for x in inputs)
        cots = tuple(c.detach().requires_grad_() for c in g)
        outs = tuple(fn(*leaves))
        grads = _grad(outs, leaves, cots, create_graph=True)
        return _grad(grads, leaves + cots, w)

    return vjp_vjp


def hand_hvp(fn: Callable) -> Callable:
    """Hessian-vector product forward-over-reverse: the hand-written backward runs (grad mode off, as in a
    plain ``.backward()``) on dual tensors, so forward-mode AD differentiates the backward's own ops in the
    direction ``t``; the tangent of each gradient is ``H t``.  Needs a forward-mode rule for the forward
    (``Function.jvp``); without one: :class:`JvpUnsupported`."""

    def hvp(inputs: Tensors, g: Tensors, t: Tensors) -> Tensors:
        with forward_ad.dual_level():
            leaves = tuple(x.detach().requires_grad_() for x in inputs)
            duals = tuple(forward_ad.make_dual(x, ti) for x, ti in zip(leaves, t))
            grads = _grad(_call_with_duals(fn, duals), duals, g)
            return tuple(None if gr is None else forward_ad.unpack_dual(gr).tangent for gr in grads)

    return hvp


def hand_jvp(fn: Callable) -> Callable:
    """The JVP that ``fn``'s own forward-mode rule computes (``autograd.Function.jvp``), through dual tensors.
    Inputs without a tangent are passed as plain tensors."""

    def jvp(inputs: Tensors, tangents_list: Sequence[Tensors]) -> List[Tensors]:
        results = []
        for tangents in tangents_list:
            with forward_ad.dual_level():
                duals = tuple(x if t is None else forward_ad.make_dual(x, t) for x, t in zip(inputs, tangents))
                outs = _call_with_duals(fn, duals)
                results.append(tuple(forward_ad.unpack_dual(o).tangent for o in outs))
        return results

    return jvp


def ref_vjp(reference: Callable, inputs: Tensors, cots_list: Sequence[Tensors]) -> List[Tensors]:
    """``torch.func.vjp`` of the reference composite (absent cotangents are zeros)."""
    outs, vjp_fn = torch.func.vjp(_tuple_fn(reference), *inputs)
    return [tuple(vjp_fn(_zeros_for_none(cots, outs))) for cots in cots_list]


def ref_vjp_vjp(reference: Callable, inputs: Tensors, g: Tensors, w: Tensors) -> Tensors:
    """``torch.func.vjp`` of ``(x, g) ↦ torch.func.vjp(reference, x)(g)``: the oracle of ``hand_vjp_vjp``."""
    f = _tuple_fn(reference)
    first = lambda xs, cs: torch.func.vjp(f, *xs)[1](cs)
    _, vjp_fn = torch.func.vjp(first, tuple(inputs), tuple(g))
    dx, dg = vjp_fn(tuple(w))
    return tuple(dx) + tuple(dg)


def ref_hvp(reference: Callable, inputs: Tensors, g: Tensors, t: Tensors) -> Tensors:
    """``torch.func.jvp`` of ``x ↦ torch.func.vjp(reference, x)(g)``: the oracle of ``hand_hvp``."""
    f = _tuple_fn(reference)
    return tuple(torch.func.jvp(lambda *xs: torch.func.vjp(f, *xs)[1](tuple(g)), tuple(inputs), tuple(t))[1])


def ref_jvp(reference: Callable, inputs: Tensors, tangents_list: Sequence[Tensors]) -> List[Tensors]:
    """``torch.func.jvp`` of the reference composite (absent tangents are zeros), one call per tangent tuple (a
    ``vmap``-batched call was measured 6x slower at these sizes)."""
    f = _tuple_fn(reference)
    return [tuple(torch.func.jvp(f, tuple(inputs), _zeros_for_none(ts, inputs))[1]) for ts in tangents_list]


def jacrev_vjp(reference: Callable, inputs: Tensors, cots_list: Sequence[Tensors]) -> List[Tensors]:
    """The VJP from the materialised Jacobian ``torch.func.jacrev(reference)``, contracted with each cotangent.

    ``torch.func.jacrev`` rejects complex tensors, so complex functions are differentiated in their real view
    ``(Re z, Im z) ↦ (Re w, Im w)``: by real calculus, the gradient of ``L = Σ Re(conj(g) w)`` is
    ``∂L/∂Re z + i ∂L/∂Im z``, which is PyTorch's convention — so this oracle derives the conjugations of
    (4)-(13) from scratch instead of trusting torch's complex autograd.  A real function takes the same path, its
    real view being itself."""
    f = _tuple_fn(reference)
    is_complex = inputs[0].is_complex()
    split = (lambda z: (z.real, z.imag)) if is_complex else (lambda z: (z,))    # a tensor's real parts
    k = 2 if is_complex else 1

    def real_view(*parts):
        zs = [torch.complex(*parts[k * i:k * i + 2]) for i in range(len(inputs))] if is_complex else parts
        return tuple(p for w in f(*zs) for p in split(w))

    parts = tuple(p.clone() for z in inputs for p in split(z))
    jac = torch.func.jacrev(real_view, argnums=tuple(range(len(parts))))(*parts)  # jac[k*out + re/im][k*in + re/im]
    def grad(cots, part):                              # of Σ_j <cots[j], w_j> w.r.t. parts[part]
        return sum((torch.tensordot(c_part, jac[w_part][part], dims=c.dim()) for j, c in enumerate(cots)
                    for w_part, c_part in enumerate(() if c is None else split(c), start=k * j)),
                   torch.zeros_like(parts[part]))

    results = []
    for cots in cots_list:
        re_im = [[grad(cots, part) for part in range(k * i, k * i + k)] for i in range(len(inputs))]
        results.append(tuple(torch.complex(*g) if is_complex else g[0] for g in re_im))
    return results


# --- is the gradient hand-written? ------------------------------------------------------------------------------------

def is_custom_node(node) -> bool:
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
    the outputs and the inputs ``q, k, v`` without a hand-written node (see ``is_custom_node``) in between is a
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
        if node is None or is_custom_node(node):
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
        if not is_custom_node(node) and not name.startswith(_LAYOUT_NODES):
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
