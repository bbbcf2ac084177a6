"""The review of a PyTorch implementation (public tools only): ``torch.profiler`` logs the aten ops a backward
runs, with their input shapes; ``torch.autograd.graph.saved_tensors_hooks`` sees what is saved for backward; a
hook (``Node.register_hook``) on the solution's own node, the hand-written one found walking back from o and a,
sees the gradients its backward returns."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from ..errors import first_line
from ..torch_oracles import is_custom_node
from .common import (NAMES, SHAPE, SUBSETS, Finding, inputs, label, per_request, product_class,
                     unrequested_products, validation)

__all__ = ["ITEMS"]

_COMPUTE_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
                "aten::tanh", "aten::einsum", "aten::mv", "aten::dot")
_PRODUCTS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm")
_TANH_OPS = ("aten::tanh", "aten::tanh_", "aten::cosh", "aten::cosh_", "aten::sinh", "aten::exp")
_ZERO_OPS = ("aten::zero_", "aten::fill_", "aten::zeros_like", "aten::new_zeros", "aten::full_like")


def _profile(fn: Callable):
    """(exception or None, aten events [(name, input shapes)]) of ``fn()`` under ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile
    exc = None
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    with _quiet_stderr():                          # Kineto logs "profiler_start" / "_stop" lines on fd 2
        prof.start()
    try:
        fn()
    except Exception as e:                         # noqa: BLE001 - the caller judges the exception
        exc = e
    finally:
        with _quiet_stderr():
            prof.stop()
    return exc, [(e.name, [list(s) for s in e.input_shapes]) for e in prof.events()]


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for the duration (only around the profiler's own start and stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _torch_inputs(dtype: str, requires=(True, True, True)):
    import torch
    return tuple(torch.from_numpy(x).requires_grad_(r) for x, r in zip(inputs(dtype), requires))


def _torch_validation(fn: Callable, dtype: str) -> List[Finding]:
    import torch

    def compute_before(call):                      # the compute ops that ran before it returned or raised
        exc, events = _profile(call)
        return exc, list(dict.fromkeys(name for name, _ in events if name in _COMPUTE_OPS))

    return validation(fn, torch.from_numpy, compute_before, dtype)


_X = "x = q kᵀ"


class _Seen(NamedTuple):
    """A tensor saved for backward (or kept on ctx): ``name`` if it equals one of q, k, v, a, x = q kᵀ, else "";
    its ``shape``; ``text`` in the evidence."""

    name: str
    shape: Tuple[int, ...]

    @property
    def text(self) -> str:
        return self.name or f"a {'x'.join(map(str, self.shape))} tensor"


def _which(t, named: Dict[str, object]) -> _Seen:
    """Which of the tensors ``named`` (q, k, v, a, x = q kᵀ) ``t`` equals, with its shape."""
    import torch
    tol = 1e-5 if t.dtype in (torch.float32, torch.complex64) else 1e-12
    for name, ref in named.items():
        if t.shape == ref.shape and torch.allclose(t.detach(), ref.detach(), rtol=tol, atol=tol):
            return _Seen(name, tuple(t.shape))
    return _Seen("", tuple(t.shape))


def _saved(fn: Callable, requires, dtype: str) -> Tuple[List[_Seen], List[_Seen], object]:
    """(the tensors saved for backward, the tensors kept as ctx attributes, outputs)."""
    import torch
    q, k, v = _torch_inputs(dtype, requires)
    packed: List[object] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        o, a = tuple(fn(q, k, v))
    named = {"q": q, "k": k, "v": v, "a": a, _X: q.detach() @ k.detach().mT}
    node = _function_node(o, a, [x for x in (q, k, v) if x.requires_grad])   # a Python Function's node is
    # its ctx (a C++ node has none)
    attrs = [t for t in vars(node).values() if isinstance(t, torch.Tensor)] if hasattr(node, "__dict__") else []
    return [_which(t, named) for t in packed], [_which(t, named) for t in attrs], (o, a)


def _function_node(o, a, wrt) -> Optional[object]:
    """The node of the hand-written backward: the first hand-written node (an ``autograd.Function`` or a C++ node,
    ``torch_oracles.is_custom_node``) met walking back from o and a that takes q, k, v (at least three inputs,
    the first three read as q, k, v) and whose graph reaches every input in ``wrt`` (those requiring grad): ops
    applied after it (``o * 1``, ``.clone()``) are walked through, extra inputs of its own (a scale, a mask) do
    not hide it, and a Function of part of the op (tanh alone) is not taken for it.  None for a solution with no
    such node (a plain composite's nodes are autograd's own, not the solution's)."""
    todo, seen = [t.grad_fn for t in (o, a)], set()
    while todo:
        node = todo.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        if is_custom_node(node) and len(node.next_functions) >= 3 and _reaches(node, wrt):
            return node
        todo.extend(next_node for next_node, _ in node.next_functions)
    return None


def _reaches(node, tensors) -> bool:
    """Whether every tensor of ``tensors`` (leaves) is accumulated somewhere below ``node``."""
    want, todo, seen = {id(t) for t in tensors}, [node], set()
    while todo and want:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        want.discard(id(getattr(node, "variable", None)))         # an AccumulateGrad node holds its leaf
        todo.extend(next_node for next_node, _ in node.next_functions)
    return not want


def _needed(requires) -> set:
    """What (9)-(13) read for the requested gradients: a always, k for G_Q, q for G_K, v for G_O Vᴴ."""
    need_q, need_k, _ = requires
    return {"a"} | {name for name, need in (("k", need_q), ("q", need_k), ("v", need_q or need_k)) if need}


def _torch_saved(fn: Callable, dtype: str) -> List[Finding]:
    findings = []
    n = SHAPE[0]
    saved, attrs, _ = _saved(fn, (True, True, True), dtype)
    big = [s for s in saved + attrs if s.name == _X or (not s.name and s.shape == (n, n))]
    if big:
        findings.append(Finding("saves_nxn", "saves an n x n tensor other than a for backward",
                                f"saved: {', '.join(s.text for s in saved + attrs)} (n = {n}); backward needs only a "
                                f"of the n x n tensors: 1 − a² and Ĝ_A are computed from it"))
    if attrs:
        findings.append(Finding("ctx_attributes", "keeps tensors as ctx attributes instead of save_for_backward",
                                f"ctx attributes holding {', '.join(s.text for s in attrs)}: not checked for in-place "
                                f"changes, and kept alive as long as the graph"))
    extra = []
    for requires in SUBSETS:
        saved, attrs, _ = _saved(fn, requires, dtype)
        unneeded = sorted({s.name for s in saved + attrs if s.name in NAMES} - _needed(requires))
        if unneeded:
            extra.append(f"with only {label(requires)}: {', '.join(unneeded)}")
    if extra:
        findings.append(Finding("saves_unneeded", "saves inputs the requested gradients do not read",
                                "; ".join(extra) + " (G_Q reads k, G_K reads q, both read v; G_V reads only a)"))
    return findings


def _backward_log(fn: Callable, requires, mode: Tuple[bool, bool], dtype: str):
    """(aten events of the backward, gradients it returned) for one request: the inputs ``requires`` requiring
    grad, cotangents on the outputs ``mode`` (o, a)."""
    import torch
    q, k, v = _torch_inputs(dtype, requires)
    o, a = tuple(fn(q, k, v))
    outs = [(t, torch.ones_like(t)) for t, used in zip((o, a), mode) if used and t.requires_grad]
    if not outs:
        return [], None
    returned: List[object] = []
    wrt = [x for x, r in zip((q, k, v), requires) if r]
    node = _function_node(o, a, wrt)
    handle = None if node is None else node.register_hook(
        lambda grad_inputs, grad_outputs: returned.append(grad_inputs))
    exc, events = _profile(lambda: torch.autograd.grad([t for t, _ in outs], wrt, [g for _, g in outs],
                                                       allow_unused=True))
    if handle is not None:
        handle.remove()
    if exc is not None:
        raise exc
    return events, (returned[0] if returned else None)


def _torch_backward(fn: Callable, dtype: str) -> List[Finding]:
    import torch

    def analyse(record, requires, mode, where, note):
        events, returned = record
        zero = [isinstance(g, torch.Tensor) and not bool(g.any()) for g in returned or ()]   # per gradient returned
        _recomputation(events, where, note)
        _zeros(events, mode, [list(g.shape) for g, z in zip(returned or (), zero) if z], where, note)
        _unrequested(events, returned, zero, requires, where, note)

    return per_request(lambda requires, mode: _backward_log(fn, requires, mode, dtype), analyse, "requiring grad")


def _recomputation(events, where: str, note: Callable) -> None:
    n, d, _ = SHAPE
    for name, shapes in events:
        if name in _TANH_OPS:
            note("recomputes", "recomputes tanh in backward (save a: 1 − a² needs no tanh or cosh)",
                 f"{name} ({where})")
        elif name in _PRODUCTS and product_class(shapes) == "x":
            note("recomputes", "recomputes x = q kᵀ in backward", f"{name} of {shapes} ({where})")


def _zeros(events, mode, returned_zeros: List[list], where: str, note: Callable) -> None:
    """A zero fill of an unused output's shape that no returned zero gradient (``returned_zeros``: their shapes)
    accounts for.  G_V has o's shape (n, e): a zero G_V that backward returned accounts for one fill, unless a
    matrix product made it (Aᴴ G_O of a materialised G_O is zero too, and the fill is then the materialisation)."""
    n, _, e = SHAPE
    made = [_product_shape(shapes) for name, shapes in events if name in _PRODUCTS]
    for out, shape, used in (("o", [n, e], mode[0]), ("a", [n, n], mode[1])):
        ops = [name for name, shapes in events if name in _ZERO_OPS and shapes and shapes[0] == shape]
        fills = sum(name in ("aten::zero_", "aten::fill_") for name in ops)    # every zero fill ends in one
        if not used and fills > max(0, returned_zeros.count(shape) - made.count(shape)):
            note("zeros", "materialises a zero gradient for an unused output (call "
                 "ctx.set_materialize_grads(False) and skip the terms of a None gradient)",
                 f"{ops[0]} of {out}'s shape {tuple(shape)} ({where})")


def _product_shape(shapes) -> Optional[list]:
    """The result shape (m, r) of a matrix product (m, p) x (p, r)."""
    mats = [s for s in shapes if len(s) >= 2][-2:]
    return [mats[0][-2], mats[1][-1]] if len(mats) == 2 else None


def _unrequested(events, returned, zero, requires, where: str, note: Callable) -> None:
    if returned is not None:
        extra = [name for name, r, g in zip(NAMES, requires, returned) if not r and g is not None]
        zeros = any(z for r, z in zip(requires, zero) if not r)
        if extra:
            note("returns_unrequested", "returns gradients for inputs that do not require grad (return None)",
                 f"grad of {', '.join(extra)}{' (zeros)' if zeros else ''} ({where})")
        zero_asked = [name for name, r, z in zip(NAMES, requires, zero) if r and z]
        if zero_asked:
            note("returns_zeros", "returns a zero tensor for a gradient that is zero (return None)",
                 f"grad of {', '.join(zero_asked)} ({where})")
    extra = unrequested_products([product_class(shapes) for name, shapes in events if name in _PRODUCTS],
                                  requires)
    if extra:
        note("computes_unrequested", "computes gradients ctx.needs_input_grad did not ask for",
             f"{'; '.join(extra)} ({where})")


def _torch_differentiable(fn: Callable, dtype: str) -> List[Finding]:
    import torch
    q, k, v = _torch_inputs(dtype)
    o, a = tuple(fn(q, k, v))
    findings = []
    if not a.requires_grad:
        findings.append(Finding("a_not_differentiable", "returns a non-differentiable a",
                                "a.requires_grad is False although q, k, v require grad (mark_non_differentiable?): "
                                "a loss of a gets no gradient; the lab asks for both outputs differentiable"))
    if not o.requires_grad:
        return findings
    outs = [t for t in (o, a) if t.requires_grad]
    try:
        grads = torch.autograd.grad(outs, (q, k, v), [torch.ones_like(t) for t in outs], create_graph=True,
                                    allow_unused=True)
        live = [g for g in grads if g is not None and g.requires_grad]
        if not live:
            raise RuntimeError("the gradients it returns do not require grad (computed outside the graph)")
        torch.autograd.grad([g.sum() for g in live], (q, k, v), allow_unused=True)
    except Exception as e:                         # noqa: BLE001 - how it fails is the evidence
        findings.append(Finding("not_twice_differentiable", "backward is not differentiable (no second order)",
                                f"create_graph=True, then grad of the gradients: {first_line(e)}"))
    return findings


ITEMS = (("input validation", _torch_validation), ("saved for backward", _torch_saved),
                ("backward op log", _torch_backward), ("differentiability", _torch_differentiable))
