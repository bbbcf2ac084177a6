"""The review of a JAX implementation: input validation (JAX has no op log of an eager call, so only "raises" and
"names the argument"), and the bwd rule's ops from the pullback's jaxpr (``jax.make_jaxpr`` of a ``jax.vjp``
pullback, read with ``crosscheck.jaxpr``): recomputation and zero cotangents."""

from __future__ import annotations

from typing import Callable, List, Tuple

import numpy as np

from ..jaxpr import equations
from .common import SHAPE, Finding, inputs, per_request, product_class, validation

__all__ = ["ITEMS"]

def _jax_validation(fn: Callable, dtype: str) -> List[Finding]:
    import jax.numpy as jnp
    from ..jax_oracles import context

    def no_compute_log(call):                      # JAX has no op log of an eager call: the message must tell
        try:
            call()
        except Exception as e:                     # noqa: BLE001
            return e, []
        return None, []

    with context("cpu"):                       # x64: float64 inputs stay float64 (mixed dtypes stay mixed)
        return validation(fn, jnp.asarray, no_compute_log, dtype)


def _jax_events(jaxpr) -> List[Tuple[str, list, str]]:
    """The pullback's equations, nested jaxprs (pjit, custom rules) flattened: (primitive, pseudo input shapes,
    how its result is used: see ``jaxpr.equations``).  A ``dot_general`` is given the shapes (m, p) x (p, r) of
    the matrix product it is, so ``product_class`` applies; a zero fill is ("zeros", [shape], use)."""
    events = []
    for _, eqn, use in equations(jaxpr):
        name = eqn.primitive.name
        if name == "dot_general":
            events.append(("dot_general", _dot_shapes(eqn), use))
        elif name == "broadcast_in_dim" and _is_zero_literal(eqn.invars[0]):
            events.append(("zeros", [list(eqn.outvars[0].aval.shape)], use))
        else:
            events.append((name, [], use))
    return events


def _is_zero_literal(var) -> bool:
    """Whether a jaxpr operand is a scalar literal zero (a variable has no ``val``).  A literal that is no number
    (a typed PRNG key: ``==`` refuses it) or no scalar (a legacy uint32[2] key) is not a zero fill's value."""
    value = getattr(var, "val", None)
    try:
        return value is not None and np.ndim(value) == 0 and bool(value == 0)
    except TypeError:
        return False


def _dot_shapes(eqn) -> list:
    """A ``dot_general`` as the matrix product (m, p) x (p, r) it is: two 2-D operands, one contracted axis each,
    no batch axes; ``[]`` for any other (a batched, vector or multi-axis contraction is none of (9)-(13)'s)."""
    (lhs_c, rhs_c), (lhs_b, _) = eqn.params["dimension_numbers"]
    lhs, rhs = (tuple(v.aval.shape) for v in eqn.invars)
    if lhs_b or len(lhs_c) != 1 or (len(lhs), len(rhs)) != (2, 2):
        return []
    (i,), (j,) = lhs_c, rhs_c
    return [[lhs[1 - i], lhs[i]], [rhs[j], rhs[1 - j]]]


def _jax_pullback(fn: Callable, requires, mode, dtype: str):
    """The events of ``fn``'s pullback, differentiated w.r.t. the inputs ``requires``, outputs ``mode`` used."""
    import jax
    import jax.numpy as jnp
    from ..jax_oracles import context, restrict
    with context("cpu"):
        xs = tuple(jnp.asarray(x) for x in inputs(dtype))
        idx = [i for i, r in enumerate(requires) if r]
        outs = [j for j, used in enumerate(mode) if used]
        values, pullback = jax.vjp(restrict(fn, xs, idx, outs), *(xs[i] for i in idx))
        return _jax_events(jax.make_jaxpr(pullback)(tuple(jnp.ones_like(o) for o in values)).jaxpr)


def _jax_analyse(events, requires, mode, where, note) -> None:
    """The findings of one request's pullback events: recomputation of tanh or x = q kᵀ, and a zero fill of an
    unused output's shape that the bwd rule's arithmetic reads.  Dead events (nothing reads them) are left out:
    under ``jax.jit``, where JAX programs run, XLA removes them.  For the same reason there is no "computes
    gradients not requested" item in JAX: a bwd rule's gradient of an input that is not differentiated is dead
    in the pullback (``jax_oracles.restrict`` closes over that input), so under ``jit`` what the torch review
    counts is code XLA never runs.  Eagerly a bwd rule runs whole, the project's own included (it saves every
    residual and leaves the unrequested gradients to XLA)."""
    n, d, e = SHAPE
    events = [(name, shapes, use) for name, shapes, use in events if use != "dead"]
    for name, shapes, _ in events:
        if name in ("tanh", "cosh", "sinh", "exp", "logistic"):
            note("recomputes", "recomputes tanh in the bwd rule (save a as a residual)", f"{name} ({where})")
        elif name == "dot_general" and product_class(shapes) == "x":
            note("recomputes", "recomputes x = q kᵀ in the bwd rule", f"dot_general {shapes} ({where})")
    for out, shape, used in (("o", [n, e], mode[0]), ("a", [n, n], mode[1])):
        if not used and any(name == "zeros" and shapes == [shape] and use == "computed"
                            for name, shapes, use in events):
            note("zeros", "multiplies a materialised zero cotangent for an unused output (register the rule "
                 "with symbolic_zeros=True and skip the terms of a SymbolicZero)",
                 f"zeros of {out}'s shape {tuple(shape)} used in the bwd rule ({where})")


def _jax_bwd(fn: Callable, dtype: str) -> List[Finding]:
    """Recomputation and zeros materialised for an unused output, per request (``_jax_analyse``)."""
    return per_request(lambda requires, mode: _jax_pullback(fn, requires, mode, dtype), _jax_analyse,
                       "differentiated")


ITEMS = (("input validation", _jax_validation), ("bwd op log", _jax_bwd))
