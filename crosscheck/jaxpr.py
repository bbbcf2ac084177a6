"""One walker over a jaxpr and the jaxprs nested in its equations (``pjit``, custom rules, ``remat`` ...), for
the two readers of JAX programs: ``jax_oracles.autodiff_path`` (is the gradient hand-written?) and the JAX review
(what the pullback computes).  Public JAX only: ``eqn.primitive.name``, ``eqn.params``, ``eqn.invars`` /
``outvars`` and their ``aval.shape``."""

from __future__ import annotations

from typing import Iterator

__all__ = ["sub_jaxprs", "equations", "call_body", "CALLS"]


def sub_jaxprs(value) -> Iterator:
    """The jaxprs inside one equation parameter: a ``Jaxpr``, the ``jaxpr`` of a ``ClosedJaxpr``, or those in a
    tuple / list of them."""
    if hasattr(value, "eqns") and hasattr(value, "invars"):               # a Jaxpr
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value, "consts"):            # a ClosedJaxpr
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from sub_jaxprs(v)


# Primitives that run their one nested jaxpr once, its inputs and outputs the equation's own one for one (``jit`` was
# ``pjit`` before JAX 0.7): liveness crosses them.  It does not cross a loop (``scan``, ``while``: a carry the
# loop's caller drops is read by the next iteration) or a ``cond`` (one branch of several runs).
CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
                   "custom_vjp_call", "custom_vjp_call_jaxpr"})


def equations(jaxpr, outer=None) -> Iterator[tuple]:
    """``(jaxpr, eqn, use)`` for every equation of ``jaxpr`` and, after each, of the jaxprs nested in it; ``use`` is
    how the equation's results are used: ``"computed"`` (one is read by a live equation), ``"returned"`` (one is
    an output of the jaxpr, none is read) or ``"dead"`` (nothing reads any: XLA removes it).

    Liveness crosses a call (``CALLS``): an output of its body the caller does not need is dead inside too, one
    the caller reads counts as computed (``outer``: those uses, per output; a top-level jaxpr returns all of its
    outputs), and an input none of the body's live results reads is not read.  Inside an equation nothing
    needs, everything is dead; inside other live ones (loops, branches), every output counts as returned."""
    returned, read = _liveness(jaxpr, outer)
    for eqn in jaxpr.eqns:
        results = _uses(eqn, returned, read)
        yield jaxpr, eqn, next((use for use in ("computed", "returned") if use in results), "dead")
        body = call_body(eqn)
        for sub in _nested(eqn):
            yield from equations(sub, results if sub is body else
                                 ["dead"] * len(sub.outvars) if "dead" in results and len(set(results)) == 1
                                 else None)


def _nested(eqn) -> list:
    return [sub for p in eqn.params.values() for sub in sub_jaxprs(p)]


def call_body(eqn):
    """The jaxpr a call (``CALLS``) runs, its inputs and outputs the equation's one for one; None for any other."""
    subs = _nested(eqn)
    if eqn.primitive.name not in CALLS or len(subs) != 1:
        return None
    body = subs[0]
    return body if (len(body.invars), len(body.outvars)) == (len(eqn.invars), len(eqn.outvars)) else None


def _uses(eqn, returned: set, read: set) -> list:
    return ["computed" if id(v) in read else "returned" if id(v) in returned else "dead" for v in eqn.outvars]


def _liveness(jaxpr, outer=None) -> tuple:
    """(ids of the values ``jaxpr`` returns, ids of those a live equation reads), given ``outer`` (see
    ``equations``).  Backwards: an equation is live if a live value needs it; it reads all of its inputs, a call
    the inputs its body's live results need."""
    uses = outer or ["returned"] * len(jaxpr.outvars)
    returned = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "returned"}
    read = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "computed"}
    for eqn in reversed(jaxpr.eqns):
        results = _uses(eqn, returned, read)
        if not any(use != "dead" for use in results):
            continue
        body = call_body(eqn)
        if body is None:
            read |= {id(v) for v in eqn.invars}
            continue
        inner_returned, inner_read = _liveness(body, results)
        needed = inner_returned | inner_read       # a body's input passed straight out is needed if that output is
        read |= {id(v) for v, inner in zip(eqn.invars, body.invars) if id(inner) in needed}
    return returned, read
