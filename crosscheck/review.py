"""The review of a user's implementation against what the lab asks of it, beyond right numbers: findings with
their evidence, reported apart from the correctness verdict (advice; ``--strict`` makes them fail the run).

PyTorch (public tools only): ``torch.profiler`` logs the aten ops a backward runs, with their input shapes;
``torch.autograd.graph.saved_tensors_hooks`` sees what is saved for backward; a hook on the output's
``grad_fn`` node (``Node.register_hook``) sees the gradients backward returns.  The review runs at one shape
with n, d, e all different (``SHAPE``), so the shapes of a matrix product tell its operands apart:

* (n, d) x (d, n) -> (n, n) is x = q kᵀ recomputed; (n, n) x (n, d) a gradient of q or k (10)-(12);
  (n, n) x (n, e) the gradient of v (13); (n, e) x (e, n) the term G_O Vᴴ of (9), needed only for q and k.

Items: input validation (the contract's bad inputs: is a clear error, naming the argument, raised before any
compute?), what is saved (n x n tensors other than ``a``; inputs no requested gradient needs; tensors kept as
ctx attributes), recomputation in the first-order backward (tanh, cosh, q kᵀ), zeros materialised for an unused
output, gradients returned or computed for inputs that do not require grad, ``a`` non-differentiable, and a
backward that cannot be differentiated again.  JAX: input validation, ``symbolic_zeros`` (without it the bwd
rule gets dense zeros for an unused output and cannot see ``perturbed``), and recomputation in the bwd rule
(from the pullback's jaxpr).  An item that cannot run on this version is listed as unavailable, never guessed.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Finding", "Review", "review", "SHAPE", "BAD_INPUTS", "KEYS"]

SHAPE = (5, 2, 3)                                  # n, d, e: all different

# Every finding key, per framework (docs/crosscheck.md has the table; tests plant a solution for each).
KEYS = {"torch": ("validation", "saves_nxn", "ctx_attributes", "saves_unneeded", "recomputes", "zeros",
                  "returns_unrequested", "returns_zeros", "computes_unrequested", "a_not_differentiable",
                  "not_twice_differentiable"),
        "jax": ("validation", "recomputes", "zeros", "computes_unrequested")}
NAMES = ("q", "k", "v")


@dataclass(frozen=True)
class Finding:
    key: str                                       # which lab ask, e.g. "recomputes", "validation"
    title: str                                     # one line, what is wrong
    evidence: str = ""                             # what crosscheck saw


@dataclass
class Review:
    framework: str
    impl: str
    findings: List[Finding] = field(default_factory=list)
    unavailable: List[str] = field(default_factory=list)      # items that could not run here, and why

    def has(self, key: str) -> bool:
        return any(f.key == key for f in self.findings)


def _names_argument(message: str) -> bool:
    """A clear error names the argument: q, k or v as a word (or query / key / value)."""
    return re.search(r"(?<![\w.])(q|k|v|query|key|value)(?![\w(])", message) is not None


def _draw(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 0.7).astype(dtype) for s in shape]


def _input_shapes(n, d, e):
    return ((n, d), (n, d), (n, e))


# The contract's bad inputs: (what is wrong, how to make them from good numpy inputs q, k, v; `conv` converts an
# array to the framework's type).
BAD_INPUTS: Tuple[Tuple[str, Callable], ...] = (
    ("q is not a tensor (a nested list)", lambda q, k, v, conv: (q.tolist(), conv(k), conv(v))),
    ("q is 3-D (2, n, d)", lambda q, k, v, conv: (conv(np.stack([q, q])), conv(k), conv(v))),
    ("v is 1-D", lambda q, k, v, conv: (conv(q), conv(k), conv(v[:, 0]))),
    ("k has d + 1 columns (q is (n, d))", lambda q, k, v, conv: (conv(q), conv(np.hstack([k, k[:, :1]])),
                                                                 conv(v))),
    ("v has n + 1 rows", lambda q, k, v, conv: (conv(q), conv(k), conv(np.vstack([v, v[:1]])))),
    ("k and v have n + 1 rows, q has n", lambda q, k, v, conv: (conv(q), conv(np.vstack([k, k[:1]])),
                                                                 conv(np.vstack([v, v[:1]])))),
    ("k has another float dtype than q and v", lambda q, k, v, conv: (conv(q), conv(k.astype(
        np.float32 if q.dtype == np.float64 else np.float64)), conv(v))),
)


def _validation(call: Callable, conv: Callable, compute_before: Callable, dtype: str) -> List[Finding]:
    """Each bad input must raise an error that names the argument, before any compute (``compute_before(fn)``
    runs ``fn`` and returns (exception or None, the compute ops that ran before it returned or raised))."""
    q, k, v = _draw(_input_shapes(*SHAPE), dtype)
    findings = []
    for what, make in BAD_INPUTS:
        with warnings.catch_warnings():            # e.g. torch's ".T on a 3-D tensor" deprecation: not ours to show
            warnings.simplefilter("ignore")
            exc, ops = compute_before(lambda: call(*make(q, k, v, conv)))
        if exc is None:
            findings.append(Finding("validation", f"no error for bad input: {what}",
                                    "returned normally" + (f" after computing ({', '.join(ops)})" if ops else "")))
            continue
        message = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        if ops:
            findings.append(Finding("validation", f"no clear error before compute for bad input: {what}",
                                    f"raised from inside the computation (after {', '.join(ops)}): {message}"))
        elif not _names_argument(str(exc)):
            findings.append(Finding("validation", f"the error for bad input ({what}) does not name the argument",
                                    message))
    if len(findings) < len(BAD_INPUTS):
        return findings
    return [Finding("validation", f"no input validation: none of the contract's {len(BAD_INPUTS)} bad inputs gets "
                                  f"a clear error naming the argument before compute",
                    "; ".join(f"{what}: {f.evidence}" for (what, _), f in zip(BAD_INPUTS, findings)))]


def review(framework: str, fn: Callable, impl: str, dtype: str = "float64") -> Review:
    """Review ``fn`` (attn(q, k, v) -> (o, a)) of ``framework`` on CPU inputs of ``dtype`` (a real dtype it
    accepts); never raises for a problem of ``fn``."""
    result = Review(framework, impl)
    items = _TORCH_ITEMS if framework == "torch" else _JAX_ITEMS
    for name, item in items:
        try:
            result.findings += item(fn, dtype)
        except Unavailable as e:
            result.unavailable.append(f"{name}: {e}")
        except Exception as e:                     # noqa: BLE001 - the correctness rows report a crash
            result.unavailable.append(f"{name}: could not run ({type(e).__name__}: "
                                      f"{(str(e).strip().splitlines() or [''])[0]})")
    return result


class Unavailable(Exception):
    """A review item this torch / JAX version (or this kind of implementation) does not allow."""


# --- PyTorch ---------------------------------------------------------------------------------------------------------

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


def _torch_compute_before(fn: Callable):
    exc, events = _profile(fn)
    return exc, list(dict.fromkeys(name for name, _ in events if name in _COMPUTE_OPS))


def _torch_inputs(dtype: str, requires=(True, True, True)):
    import torch
    return tuple(torch.from_numpy(x).requires_grad_(r) for x, r in zip(_draw(_input_shapes(*SHAPE), dtype), requires))


def _torch_validation(fn: Callable, dtype: str) -> List[Finding]:
    import torch
    return _validation(fn, torch.from_numpy, _torch_compute_before, dtype)


def _which(t, named: Dict[str, object]) -> str:
    """The name of the tensor ``t`` equals (q, k, v, a, x = q kᵀ), or its shape."""
    import torch
    tol = 1e-5 if t.dtype in (torch.float32, torch.complex64) else 1e-12
    for name, ref in named.items():
        if t.shape == ref.shape and torch.allclose(t.detach(), ref.detach(), rtol=tol, atol=tol):
            return name
    return f"a {'x'.join(map(str, t.shape))} tensor"


def _named(q, k, v, a) -> Dict[str, object]:
    return {"q": q, "k": k, "v": v, "a": a, "x = q kᵀ": q.detach() @ k.detach().mT}


def _saved(fn: Callable, requires, dtype: str) -> Tuple[List[str], List[str], object]:
    """(names of the tensors saved for backward, of the tensors kept as ctx attributes, outputs)."""
    import torch
    q, k, v = _torch_inputs(dtype, requires)
    packed: List[object] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        o, a = tuple(fn(q, k, v))
    named = _named(q, k, v, a)
    attrs = [t for t in vars(o.grad_fn).values() if isinstance(t, torch.Tensor)] \
        if o.grad_fn is not None and hasattr(o.grad_fn, "__dict__") else []
    return [_which(t, named) for t in packed], [_which(t, named) for t in attrs], (o, a)


def _needed(requires) -> set:
    """What (9)-(13) read for the requested gradients: a always, k for G_Q, q for G_K, v for G_O Vᴴ."""
    need_q, need_k, _ = requires
    return {"a"} | ({"k"} if need_q else set()) | ({"q"} if need_k else set()) | (
        {"v"} if need_q or need_k else set())


def _torch_saved(fn: Callable, dtype: str) -> List[Finding]:
    findings = []
    n = SHAPE[0]
    saved, attrs, _ = _saved(fn, (True, True, True), dtype)
    big = [s for s in saved + attrs if s not in ("q", "k", "v", "a")
           and (s.startswith("x") or s.startswith(f"a {n}x{n}"))]
    if big:
        findings.append(Finding("saves_nxn", "saves an n x n tensor other than a for backward",
                                f"saved: {', '.join(saved + attrs)} (n = {n}); backward needs only a of the "
                                f"n x n tensors: 1 − a² and Ĝ_A are computed from it"))
    if attrs:
        findings.append(Finding("ctx_attributes", "keeps tensors as ctx attributes instead of save_for_backward",
                                f"ctx attributes holding {', '.join(attrs)}: not checked for in-place changes, "
                                f"and kept alive as long as the graph"))
    extra = []
    for requires in _subsets():
        saved, attrs, _ = _saved(fn, requires, dtype)
        unneeded = sorted({s for s in saved + attrs if s in ("q", "k", "v")} - _needed(requires))
        if unneeded:
            extra.append(f"with only {_label(requires)}: {', '.join(unneeded)}")
    if extra:
        findings.append(Finding("saves_unneeded", "saves inputs the requested gradients do not read",
                                "; ".join(extra) + " (G_Q reads k, G_K reads q, both read v; G_V reads only a)"))
    return findings


def _subsets():
    return [(True, False, False), (False, True, False), (False, False, True), (True, True, False),
            (True, False, True), (False, True, True)]


def _label(requires, verb: str = "requiring grad") -> str:
    return ", ".join(n for n, r in zip(NAMES, requires) if r) + " " + verb


def _product_class(shapes) -> Optional[str]:
    """Which product of (9)-(13) a matrix product of these input shapes is (see the module docstring)."""
    mats = [s for s in shapes if len(s) >= 2][-2:]
    if len(mats) != 2:
        return None
    (m, p), (p2, r) = mats[0][-2:], mats[1][-2:]
    n, d, e = SHAPE
    dims = (m, p, r)
    if dims == (n, d, n):
        return "x"
    if p == n and sorted((m, r)) == sorted((n, d)):
        return "qk"
    if p == n and sorted((m, r)) == sorted((n, e)):
        return "v"
    if dims == (n, e, n):
        return "ghat"
    return None


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
    node = outs[0][0].grad_fn
    handle = node.register_hook(lambda grad_inputs, grad_outputs: returned.append(grad_inputs)) \
        if hasattr(node, "register_hook") else None
    wrt = [x for x, r in zip((q, k, v), requires) if r]
    exc, events = _profile(lambda: torch.autograd.grad([t for t, _ in outs], wrt, [g for _, g in outs],
                                                       allow_unused=True))
    if handle is not None:
        handle.remove()
    if exc is not None:
        raise exc
    return events, (returned[0] if returned else None)


_MODES = {(True, True): "o and a used", (True, False): "a unused", (False, True): "o unused"}   # (o, a) used


def _per_request(log: Callable, analyse: Callable, verb: str) -> List[Finding]:
    """Run ``log(requires, mode)`` for every request (inputs requiring grad / differentiated x outputs used) and
    ``analyse(record, requires, mode, where, note)`` on each; a request that raises is skipped (the correctness
    rows report it).  The findings gather the evidence of every request."""
    found: Dict[Tuple[str, str], List[str]] = {}

    def note(key: str, title: str, evidence: str):
        found.setdefault((key, title), []).append(evidence)

    requests = [(requires, mode) for requires in [(True, True, True)] + _subsets() for mode in _MODES]
    raised = 0
    for requires, mode in requests:
        try:
            record = log(requires, mode)
        except Exception:                          # noqa: BLE001 - reported by the correctness rows
            raised += 1
            continue
        analyse(record, requires, mode, f"{_MODES[mode]}, {_label(requires, verb)}", note)
    if raised == len(requests):
        raise Unavailable("the backward raised on every path (see the correctness rows)")
    return [Finding(key, title, _evidence(ev)) for (key, title), ev in found.items()]


def _torch_backward(fn: Callable, dtype: str) -> List[Finding]:
    def analyse(record, requires, mode, where, note):
        events, returned = record
        _recomputation(events, where, note)
        _zeros(events, mode, _zero_returns(returned), where, note)
        _unrequested(events, returned, requires, where, note)

    return _per_request(lambda requires, mode: _backward_log(fn, requires, mode, dtype), analyse, "requiring grad")


def _evidence(items: Sequence[str], shown: int = 3) -> str:
    items = list(dict.fromkeys(items))
    more = f"; ... ({len(items)} paths in all)" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


def _recomputation(events, where: str, note: Callable) -> None:
    n, d, _ = SHAPE
    for name, shapes in events:
        if name in _TANH_OPS:
            note("recomputes", "recomputes tanh in backward (save a: 1 − a² needs no tanh or cosh)",
                 f"{name} ({where})")
        elif name in _PRODUCTS and _product_class(shapes) == "x":
            note("recomputes", "recomputes x = q kᵀ in backward", f"{name} of {shapes} ({where})")


def _zero_returns(returned) -> List[list]:
    """The shapes of the all-zero tensors backward returned (see _unrequested)."""
    import torch
    return [list(g.shape) for g in returned or () if isinstance(g, torch.Tensor) and not bool(g.any())]


def _zeros(events, mode, returned_zeros: List[list], where: str, note: Callable) -> None:
    """A zero fill of an unused output's shape that no returned zero gradient accounts for.  G_V has o's shape
    (n, e): a zero G_V that backward returned accounts for one fill, unless a matrix product made it (Aᴴ G_O of a
    materialised G_O is zero too, and the fill is then the materialisation); see _unrequested."""
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


def _unrequested(events, returned, requires, where: str, note: Callable) -> None:
    import torch
    if returned is not None:
        extra = [name for name, r, g in zip(NAMES, requires, returned) if not r and g is not None]
        zeros = [name for name, r, g in zip(NAMES, requires, returned)
                 if not r and isinstance(g, torch.Tensor) and not bool(g.any())]
        if extra:
            note("returns_unrequested", "returns gradients for inputs that do not require grad (return None)",
                 f"grad of {', '.join(extra)}{' (zeros)' if zeros else ''} ({where})")
        zero_asked = [name for name, r, g in zip(NAMES, requires, returned)
                      if r and isinstance(g, torch.Tensor) and not bool(g.any())]
        if zero_asked:
            note("returns_zeros", "returns a zero tensor for a gradient that is zero (return None)",
                 f"grad of {', '.join(zero_asked)} ({where})")
    extra = _unrequested_products([_product_class(shapes) for name, shapes in events if name in _PRODUCTS],
                                  requires)
    if extra:
        note("computes_unrequested", "computes gradients ctx.needs_input_grad did not ask for",
             f"{'; '.join(extra)} ({where})")


def _unrequested_products(products: Sequence[Optional[str]], requires) -> List[str]:
    """The matrix products (classes of ``_product_class``) of gradients not requested."""
    need_q, need_k, need_v = requires
    extra = []
    qk = products.count("qk")
    if qk > need_q + need_k:
        extra.append(f"{qk} products of the q/k-gradient shape for {need_q + need_k} requested")
    if "v" in products and not need_v:
        extra.append("G_V = Aᴴ G_O")
    if "ghat" in products and not (need_q or need_k):
        extra.append("G_O Vᴴ (read only by the q and k gradients)")
    return extra


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
                                f"create_graph=True, then grad of the gradients: {type(e).__name__}: "
                                f"{(str(e).strip().splitlines() or [''])[0]}"))
    return findings


_TORCH_ITEMS = (("input validation", _torch_validation), ("saved for backward", _torch_saved),
                ("backward op log", _torch_backward), ("differentiability", _torch_differentiable))


# --- JAX -------------------------------------------------------------------------------------------------------------

def _jax_validation(fn: Callable, dtype: str) -> List[Finding]:
    import jax.numpy as jnp
    from .jax_oracles import jax_context

    def no_compute_log(call):                      # JAX has no op log of an eager call: the message must tell
        try:
            call()
        except Exception as e:                     # noqa: BLE001
            return e, []
        return None, []

    with jax_context("cpu"):                       # x64: float64 inputs stay float64 (mixed dtypes stay mixed)
        return _validation(fn, jnp.asarray, no_compute_log, dtype)


def _jax_events(jaxpr) -> List[Tuple[str, list, bool]]:
    """The pullback's equations, nested jaxprs (pjit, custom rules) flattened: (primitive, pseudo input shapes,
    how its result is used: "computed" (read by another equation), "returned" or "dead" (dropped: XLA removes
    it)).  A ``dot_general`` is given the shapes (m, p) x (p, r) of the matrix product it is, so
    ``_product_class`` applies; a zero fill is ("zeros", [shape], use)."""
    from .jax_oracles import _sub_jaxprs
    events = []

    def walk(j):
        returned = {id(v) for v in j.outvars}
        live, read = set(returned), set()          # backwards: an equation is live if a live value needs it
        for eqn in reversed(j.eqns):
            if any(id(v) in live for v in eqn.outvars):
                live |= {id(v) for v in eqn.invars}
                read |= {id(v) for v in eqn.invars}
        for eqn in j.eqns:
            name = eqn.primitive.name
            out = id(eqn.outvars[0])
            use = "computed" if out in read else "returned" if out in returned else "dead"
            if name == "dot_general":
                events.append(("dot_general", _dot_shapes(eqn), use))
            elif name == "broadcast_in_dim" and _is_zero_literal(eqn.invars[0]):
                events.append(("zeros", [list(eqn.outvars[0].aval.shape)], use))
            else:
                events.append((name, [], use))
            for p in eqn.params.values():
                for sub in _sub_jaxprs(p):
                    walk(sub)

    walk(jaxpr)
    return events


def _is_zero_literal(var) -> bool:
    value = getattr(var, "val", None)
    try:
        return value is not None and np.ndim(value) == 0 and value == 0
    except Exception:                              # noqa: BLE001 - not a plain number
        return False


def _dot_shapes(eqn) -> list:
    (lhs_c, rhs_c), (lhs_b, _) = eqn.params["dimension_numbers"]
    lhs, rhs = (tuple(v.aval.shape) for v in eqn.invars)
    if len(lhs_c) != 1 or lhs_b or len(lhs) != 2 or len(rhs) != 2:
        return []
    m = lhs[1 - lhs_c[0]]
    r = rhs[1 - rhs_c[0]]
    p = lhs[lhs_c[0]]
    return [[m, p], [p, r]]


def _jax_pullback(fn: Callable, requires, mode, dtype: str):
    """The events of ``fn``'s pullback, differentiated w.r.t. the inputs ``requires``, outputs ``mode`` used."""
    import jax
    import jax.numpy as jnp
    from .jax_oracles import _restrict, jax_context
    with jax_context("cpu"):
        inputs = tuple(jnp.asarray(x) for x in _draw(_input_shapes(*SHAPE), dtype))
        idx = [i for i, r in enumerate(requires) if r]
        outs = [j for j, used in enumerate(mode) if used]
        values, pullback = jax.vjp(_restrict(fn, inputs, idx, outs), *(inputs[i] for i in idx))
        return _jax_events(jax.make_jaxpr(pullback)(tuple(jnp.ones_like(o) for o in values)).jaxpr)


def _jax_bwd(fn: Callable, dtype: str) -> List[Finding]:
    """Recomputation, zeros materialised for an unused output, gradients of inputs not differentiated."""
    n, d, e = SHAPE

    def analyse(events, requires, mode, where, note):
        events = [(name, shapes, use) for name, shapes, use in events if use != "dead"]
        for name, shapes, _ in events:
            if name in ("tanh", "cosh", "sinh", "exp", "logistic"):
                note("recomputes", "recomputes tanh in the bwd rule (save a as a residual)", f"{name} ({where})")
            elif name == "dot_general" and _product_class(shapes) == "x":
                note("recomputes", "recomputes x = q kᵀ in the bwd rule", f"dot_general {shapes} ({where})")
        unused = [(o, shape) for o, shape, used in (("o", [n, e], mode[0]), ("a", [n, n], mode[1])) if not used]
        for out, shape in unused:
            if any(name == "zeros" and shapes == [shape] and use == "computed" for name, shapes, use in events):
                note("zeros", "multiplies a materialised zero cotangent for an unused output (register the rule "
                     "with symbolic_zeros=True and skip the terms of a SymbolicZero)",
                     f"zeros of {out}'s shape {tuple(shape)} used in the bwd rule ({where})")
        extra = _unrequested_products([_product_class(shapes) for name, shapes, _ in events
                                       if name == "dot_general"], requires)
        if extra:
            note("computes_unrequested", "computes gradients of inputs that are not differentiated (read "
                 "CustomVJPPrimal.perturbed with symbolic_zeros=True)", f"{'; '.join(extra)} ({where})")

    return _per_request(lambda requires, mode: _jax_pullback(fn, requires, mode, dtype), analyse, "differentiated")


_JAX_ITEMS = (("input validation", _jax_validation), ("bwd op log", _jax_bwd))
