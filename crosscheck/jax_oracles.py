"""JAX side: running a hand-written VJP/JVP, and the autodiff oracles of a reference function.

The calling pattern of ``torch_oracles`` (``None``: a symbolic zero for the custom rules); results are in
**JAX's** convention (eqs. (18)-(22)), converted with eq. (17) by ``parts``.  Importing this module imports JAX;
nothing here changes JAX's global configuration — :func:`context` scopes x64, matmul precision and the device.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import jax
import jax.numpy as jnp

from .jaxpr import call_body, sub_jaxprs

__all__ = ["Array", "as_impl", "xp", "backward_mode", "context", "jax_device", "to_native", "to_numpy", "hand_vjp",
           "hand_jvp", "hand_vjp_vjp", "hand_hvp", "ref_vjp", "ref_jvp", "ref_vjp_vjp", "ref_hvp", "jacrev_vjp",
           "autodiff_path", "JvpUnsupported", "restrict"]

Array = jax.Array
xp = jnp                                                     # the array namespace
backward_mode = contextlib.nullcontext                       # how a bwd rule runs: as traced
Arrays = Tuple[Optional[jax.Array], ...]


MATMUL_PRECISION = "float32"                       # = "highest"; see context


class JvpUnsupported(Exception):
    """The function has no forward-mode rule (a ``jax.custom_vjp`` function)."""


def _enable_x64():
    """``jax.enable_x64(True)`` (a config context manager in recent JAX); older JAX (0.4.x) has
    ``jax.experimental.enable_x64()``."""
    try:
        return jax.enable_x64(True)
    except (AttributeError, TypeError):                # jax < 0.5
        from jax.experimental import enable_x64
        return enable_x64()


def jax_device(device: str):
    """The JAX device for ``cpu`` / ``cuda``; raises RuntimeError (with JAX's reason) when absent."""
    return jax.devices("gpu" if device == "cuda" else "cpu")[0]


@contextlib.contextmanager
def context(device: str) -> Iterator[None]:
    """x64 on (so float64/complex128 are real), matmul precision pinned to full float32 (no TF32 / bf16 passes
    on GPUs), computations placed on ``device`` — all scoped, restored on exit.

    The precision is spelled ``"float32"``: every JAX version the project claims accepts it (0.4.30 rejects
    ``"highest"``), and it lowers to the same ``precision = [HIGHEST, HIGHEST]`` dot (checked on 0.10.2;
    tests/test_crosscheck_review.py checks it on the installed version)."""
    with _enable_x64(), jax.default_matmul_precision(MATMUL_PRECISION), jax.default_device(jax_device(device)):
        yield


def to_native(x: np.ndarray, device: str) -> jax.Array:
    return jax.device_put(x, jax_device(device))


def to_numpy(x) -> Optional[np.ndarray]:
    """A copy in host memory, from any device (``np.asarray`` transfers a GPU array)."""
    return None if x is None else np.asarray(x)


def as_impl(obj):
    """What ``--jax-impl`` calls: the object itself."""
    return obj


def _tuple_fn(fn: Callable) -> Callable:
    return lambda *xs: tuple(fn(*xs))


def restrict(fn: Callable, inputs: Arrays, idx: Sequence[int], outs: Optional[Sequence[int]] = None) -> Callable:
    """``fn`` as a function of ``inputs[idx]`` only (the others closed over: constants, so a custom rule sees
    them as not perturbed / with a symbolic-zero tangent), returning only the outputs ``outs``."""
    def restricted(*xs):
        given = dict(zip(idx, xs))
        result = tuple(fn(*(given.get(i, x) for i, x in enumerate(inputs))))
        return result if outs is None else tuple(result[j] for j in outs)
    return restricted


def _typed_like(cot, out):
    """``cot`` with the type ``jax.vjp`` expects for the output ``out``: on an Explicit mesh the sharding is part
    of an array's type, and a replicated cotangent of a row-sharded output is refused ("unexpected JAX type ...
    for argument to VJP function"), so it is resharded to the output's sharding.  JAX without explicit sharding
    (``jax.typeof`` / ``jax.sharding.reshard`` absent) has nothing to match."""
    typeof, reshard = getattr(jax, "typeof", None), getattr(jax.sharding, "reshard", None)
    if typeof is None or reshard is None:
        return cot
    want = getattr(typeof(out), "sharding", None)
    spec = getattr(want, "spec", None)
    if spec is None or all(p is None for p in spec) or getattr(typeof(cot), "sharding", None) == want:
        return cot
    return reshard(cot, want)


def hand_vjp(fn: Callable) -> Callable:
    """The VJP ``jax.vjp`` computes for ``fn`` (a ``jax.custom_vjp`` function: its hand-written ``bwd``), per
    request ``(wrt, cotangents)``: ``fn`` is differentiated w.r.t. the inputs in ``wrt`` only (the others are
    constants: ``CustomVJPPrimal.perturbed`` is False for them), and an output without a cotangent is not an
    output of the function differentiated, so the rule receives a symbolic zero for it (a loss of the other
    output alone, as under ``jax.grad``).  Inputs outside ``wrt`` get ``None``."""

    def vjp(inputs: Arrays, requests) -> List[Arrays]:
        results = []
        for wrt, cots in requests:
            idx = [i for i, w in enumerate(wrt) if w]
            used = [j for j, c in enumerate(cots) if c is not None]
            outs, vjp_fn = jax.vjp(restrict(fn, inputs, idx, used), *(inputs[i] for i in idx))
            grads = dict(zip(idx, vjp_fn(tuple(_typed_like(cots[j], o) for j, o in zip(used, outs)))))
            results.append(tuple(grads.get(i) for i in range(len(inputs))))
        return results

    return vjp


def hand_jvp(fn: Callable) -> Callable:
    """The JVP ``jax.jvp`` computes for ``fn`` (a ``jax.custom_jvp`` function: its hand-written rule), per
    tangent tuple: inputs with a ``None`` tangent are constants, so the rule receives a symbolic zero for them."""

    def jvp(inputs: Arrays, tangents_list: Sequence[Arrays]) -> List[Arrays]:
        try:
            results = []
            for ts in tangents_list:
                idx = [i for i, t in enumerate(ts) if t is not None]
                results.append(tuple(jax.jvp(restrict(fn, inputs, idx), tuple(inputs[i] for i in idx),
                                             tuple(ts[i] for i in idx))[1]))
            return results
        except TypeError as e:
            if "custom_vjp" in str(e):
                raise JvpUnsupported(str(e)) from e
            raise

    return jvp


def ref_vjp(reference: Callable, inputs: Arrays, cots_list: Sequence[Arrays]) -> List[Arrays]:
    """``jax.vjp`` of the reference composite w.r.t. every input, one pullback per cotangent mode (absent
    cotangents are dense zeros: the oracle's gradient w.r.t. a subset of the inputs is the restriction)."""
    outs, vjp_fn = jax.vjp(_tuple_fn(reference), *inputs)
    return [tuple(vjp_fn(tuple(jnp.zeros_like(o) if c is None else c for c, o in zip(cots, outs))))
            for cots in cots_list]


def ref_jvp(reference: Callable, inputs: Arrays, tangents_list: Sequence[Arrays]) -> List[Arrays]:
    """``jax.jvp`` of the reference composite (absent tangents are dense zeros)."""
    f = _tuple_fn(reference)
    return [tuple(jax.jvp(f, tuple(inputs), tuple(jnp.zeros_like(x) if t is None else t
                                                  for t, x in zip(ts, inputs)))[1])
            for ts in tangents_list]


def hand_vjp_vjp(fn: Callable) -> Callable:
    """Grad of grad: ``jax.vjp`` of ``(x, g) ↦ jax.vjp(fn, x)(g)`` with the cotangent ``w``; JAX differentiates
    the ``custom_vjp`` rule's own ops (or transposes a ``custom_jvp`` rule).  Returns ``(d/dq, ..., d/dg_o,
    ...)``.  The same function of the reference is the oracle."""
    f = _tuple_fn(fn)

    def second(inputs: Arrays, g: Arrays, w: Arrays) -> Arrays:
        first = lambda xs, cs: jax.vjp(f, *xs)[1](cs)
        dx, dg = jax.vjp(first, tuple(inputs), tuple(g))[1](tuple(w))
        return tuple(dx) + tuple(dg)

    return second


def hand_hvp(fn: Callable) -> Callable:
    """Hessian-vector product forward-over-reverse: ``jax.jvp`` of ``x ↦ jax.vjp(fn, x)(g)`` in the direction
    ``t`` (forward mode through the hand-written backward).  The same function of the reference is the oracle."""
    f = _tuple_fn(fn)

    def product(inputs: Arrays, g: Arrays, t: Arrays) -> Arrays:
        return tuple(jax.jvp(lambda *xs: jax.vjp(f, *xs)[1](tuple(g)), tuple(inputs), tuple(t))[1])

    return product


def ref_vjp_vjp(reference: Callable, inputs: Arrays, g: Arrays, w: Arrays) -> Arrays:
    return hand_vjp_vjp(reference)(inputs, g, w)                 # the same function of the reference


def ref_hvp(reference: Callable, inputs: Arrays, g: Arrays, t: Arrays) -> Arrays:
    return hand_hvp(reference)(inputs, g, t)


def jacrev_vjp(reference: Callable, inputs: Arrays, cots_list: Sequence[Arrays]) -> List[Arrays]:
    """The VJP from the materialised Jacobian ``jax.jacrev(reference)`` (``holomorphic=True`` for complex
    inputs: the complex Jacobian ∂w/∂z), contracted with each cotangent: ``G_in = Σ_out tensordot(G_out, J)``,
    JAX's convention (no conjugate)."""
    is_complex = jnp.iscomplexobj(inputs[0])
    jac = jax.jacrev(_tuple_fn(reference), argnums=tuple(range(len(inputs))), holomorphic=is_complex)(*inputs)
    outs = jax.eval_shape(_tuple_fn(reference), *inputs)
    stacked = [jnp.stack([jnp.zeros(o.shape, o.dtype) if c is None else c for c in column])   # per output, the
               for column, o in zip(zip(*cots_list), outs)]                                 # modes on a new axis 0
    grads = [sum(jnp.tensordot(c, jac[j][i], axes=(list(range(1, c.ndim)), list(range(c.ndim - 1))))
                 for j, c in enumerate(stacked)) for i in range(len(inputs))]   # c's output axes (after the modes)
    return [tuple(g[m] for g in grads) for m in range(len(cots_list))]


# --- is the gradient hand-written? ------------------------------------------------------------------------------------

# Primitives that only move, copy or convert data (no calculus): allowed between the inputs and a custom rule.
_LAYOUT_PRIMITIVES = {"transpose", "reshape", "copy", "copy_p", "convert_element_type", "squeeze", "expand_dims",
                      "broadcast_in_dim"}
_CLEAN, _RAW, _AUTODIFF = 0, 1, 2       # no dependence on the inputs / the inputs as such / through autodiff math


def _autodiff_flow(jaxpr, in_states: Sequence[int]) -> Tuple[List[int], List[str]]:
    """Per output of ``jaxpr``: ``_AUTODIFF`` if JAX would differentiate some of the math between it and the
    inputs itself (a primitive other than a data-movement one, outside every ``custom_vjp`` / ``custom_jvp``
    call, on a path from an input — also *below* a custom call, e.g. a ``custom_jvp`` tanh fed by a plain
    matmul), else ``_RAW`` / ``_CLEAN``; and the primitives JAX differentiates.  A call (``jaxpr.call_body``: ``jit``, ``remat``
    ...) is followed inside, and so is each branch of a ``cond`` (an output as bad as in its worst branch); a
    loop is not (its carry feeds the next iteration, which one pass over the body would miss): JAX
    differentiates it, so its outputs are ``_AUTODIFF``."""
    states = {id(v): st for v, st in zip(jaxpr.invars, in_states)}
    prims: List[str] = []
    for eqn in jaxpr.eqns:
        ins = [states.get(id(v), _CLEAN) for v in eqn.invars]
        name = eqn.primitive.name
        worst = max(ins, default=_CLEAN)
        if "custom_vjp" in name or "custom_jvp" in name:    # custom_vjp_call(_jaxpr), custom_jvp_call(_jaxpr)
            outs = [_AUTODIFF if worst == _AUTODIFF else _CLEAN] * len(eqn.outvars)
        elif name in _LAYOUT_PRIMITIVES or worst == _CLEAN:
            outs = [worst] * len(eqn.outvars)
        elif call_body(eqn) is not None:                  # a call (jit, remat ...): followed inside
            outs, sub_prims = _autodiff_flow(call_body(eqn), ins)
            prims += sub_prims
        elif name == "cond":                              # one branch runs (operand 0 picks it): the worst
            flows = [_autodiff_flow(b, ins[1:]) for b in sub_jaxprs(eqn.params["branches"])]
            outs = [max(states) for states in zip(*(flow for flow, _ in flows))]
            prims += [p for _, sub_prims in flows for p in sub_prims]
        else:                                             # a loop too: JAX differentiates its body
            outs = [_AUTODIFF] * len(eqn.outvars)
            prims.append(name)
        states.update(zip(map(id, eqn.outvars), outs))
    return [states.get(id(v), _CLEAN) for v in jaxpr.outvars], prims


def autodiff_path(fn: Callable, inputs: Arrays, output_names: Sequence[str],
                  input_names: Sequence[str]) -> Optional[str]:
    """``None`` when JAX differentiates none of ``fn``'s math itself: between the inputs and the outputs there
    are only ``custom_vjp`` / ``custom_jvp`` calls (hand-written rules) and data movement (and anything applied
    to the rules' outputs only); otherwise a description of the outputs concerned and the primitives JAX
    differentiates (a plain function of ``jnp`` ops, or a custom rule for only a piece of the op)."""
    closed = jax.make_jaxpr(_tuple_fn(fn))(*inputs)
    outs, prims = _autodiff_flow(closed.jaxpr, [_RAW] * len(closed.jaxpr.invars))
    bad = [name for name, st in zip(output_names, outs) if st == _AUTODIFF]
    if not bad:
        return None
    seen = list(dict.fromkeys(prims))
    return (f"{', '.join(bad)} computed from {', '.join(input_names)} by primitives JAX differentiates itself "
            f"({', '.join(seen[:6])}{', ...' if len(seen) > 6 else ''}), not only through jax.custom_vjp / "
            f"jax.custom_jvp rules")
