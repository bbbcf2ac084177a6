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


def equations(jaxpr, outer=None) -> Iterator[tuple]:
    """``(jaxpr, eqn, use)`` for every equation of ``jaxpr`` and, after each, of the jaxprs nested in it; ``use`` is
    how the equation's first result is used: ``"computed"`` (read by a live equation), ``"returned"`` (an output
    of the jaxpr) or ``"dead"`` (nothing reads it: XLA removes it).

    Liveness crosses into a nested jaxpr whose outputs are its equation's results one for one (a ``pjit``, a
    custom rule's call): an output the outside does not need is dead inside too, one read outside counts as
    computed (``outer``: those uses, per output; a top-level jaxpr returns all of its outputs), and an input of
    a ``pjit`` that none of its live results needs is not read."""
    returned, read = _liveness(jaxpr, outer)
    for eqn in jaxpr.eqns:
        results = _uses(eqn, returned, read)
        yield jaxpr, eqn, results[0] if results else "dead"
        for sub in _nested(eqn):
            one_for_one = len(sub.outvars) == len(results)
            yield from equations(sub, results if one_for_one else
                                 ["dead"] * len(sub.outvars) if set(results) <= {"dead"} else None)


def _nested(eqn) -> list:
    return [sub for p in eqn.params.values() for sub in sub_jaxprs(p)]


def _uses(eqn, returned: set, read: set) -> list:
    return ["computed" if id(v) in read else "returned" if id(v) in returned else "dead" for v in eqn.outvars]


def _liveness(jaxpr, outer=None) -> tuple:
    """(ids of the values ``jaxpr`` returns, ids of those a live equation reads), given ``outer`` (see
    ``equations``).  Backwards: an equation is live if a live value needs it, and needs its inputs, or for a
    ``pjit`` (its jaxpr's inputs and outputs its own, one for one) the inputs its live results read inside."""
    uses = outer or ["returned"] * len(jaxpr.outvars)
    returned = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "returned"}
    read = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "computed"}
    for eqn in reversed(jaxpr.eqns):
        results = _uses(eqn, returned, read)
        if set(results) <= {"dead"}:
            continue
        needed = eqn.invars
        subs = _nested(eqn)
        if len(subs) == 1 and len(subs[0].invars) == len(eqn.invars) and len(subs[0].outvars) == len(results):
            inner_read = _liveness(subs[0], results)[1] | {id(v) for v, use in zip(subs[0].outvars, results)
                                                             if use != "dead"}
            needed = [v for v, inner in zip(eqn.invars, subs[0].invars) if id(inner) in inner_read]
        read |= {id(v) for v in needed}
    return returned, read
