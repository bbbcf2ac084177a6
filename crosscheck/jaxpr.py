"""One walker over a jaxpr and the jaxprs nested in its equations (``pjit``, custom rules, ``remat`` ...), for
the two readers of JAX programs: ``jax_oracles.autodiff_path`` (is the gradient hand-written?) and the JAX review
(what the pullback computes).  Public JAX only: ``eqn.primitive.name``, ``eqn.params``, ``eqn.invars`` /
``outvars`` and their ``aval.shape``."""

from __future__ import annotations

from typing import Iterator

__all__ = ["sub_jaxprs", "equations"]


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


def equations(jaxpr) -> Iterator[tuple]:
    """``(jaxpr, eqn, use)`` for every equation of ``jaxpr`` and, after each, of the jaxprs nested in it; ``use`` is
    how the equation's first result is used in its own jaxpr: ``"computed"`` (read by a live equation),
    ``"returned"`` (an output of the jaxpr) or ``"dead"`` (nothing reads it: XLA removes it)."""
    returned = {id(v) for v in jaxpr.outvars}
    live, read = set(returned), set()              # backwards: an equation is live if a live value needs it
    for eqn in reversed(jaxpr.eqns):
        if any(id(v) in live for v in eqn.outvars):
            live |= {id(v) for v in eqn.invars}
            read |= {id(v) for v in eqn.invars}
    for eqn in jaxpr.eqns:
        out = id(eqn.outvars[0]) if eqn.outvars else None
        yield jaxpr, eqn, "computed" if out in read else "returned" if out in returned else "dead"
        for p in eqn.params.values():
            for sub in sub_jaxprs(p):
                yield from equations(sub)
