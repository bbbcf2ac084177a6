"""Op specs: what to check, piece by piece.

An :class:`OpSpec` names an op's inputs and outputs, how to draw valid inputs for a size ``(n, d, e)``, and for
each framework a :class:`Side`: the forward, the **hand-written** VJP and JVP under test, and the plain
**reference** composite whose autodiff is the oracle.  :data:`SPECS`: the building blocks ``scores``, ``tanh``
and ``mix``, whose hand-written sides call the block functions of ``torch_impl.formulas`` / ``jax_impl.formulas``
that ``attn_backward`` / ``attn_jvp`` chain (so crosscheck holds no copy of the gradient math), ``attn``, the
whole op: the project's ``torch_impl.attn`` / ``jax_impl.attn`` and ``attn_jvp``, or a user's, and the *kernel
ops* ``attn_o`` / ``attn_o_causal`` (``OpSpec.kernel``: checked with ``--kernels``, see ``crosscheck.kernels``):
the output alone, ``torch_impl.attn_o`` / ``jax_impl.attn_o`` and ``attn_o_jvp``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from .errors import first_line
from .frameworks import get
from .sampling import qk_std, scores, x_std

__all__ = ["Side", "OpSpec", "SPECS", "KERNEL_OPS", "o_only_side", "second_order_refusal",
           "without_second_order"]


@dataclass(frozen=True)
class Side:
    """One framework's functions for an op.  ``vjp`` takes ``(inputs, list of (wrt mask, cotangent tuple))``
    — ``wrt``: which inputs require grad / are differentiated; a ``None`` cotangent: that output is unused — and
    returns one gradient tuple per request, ``None`` for inputs outside ``wrt``; ``jvp`` takes ``(inputs, list of
    tangent tuples)`` (``None``: no tangent) and returns one tuple per entry (see ``torch_oracles``); ``jvp`` is
    ``None`` when there is no hand-written JVP (``jvp_missing`` says why).  ``vjp_vjp(inputs, g, w)`` (the VJP of
    the VJP through the hand-written backward: gradients w.r.t. the inputs, then w.r.t. the cotangents) and
    ``hvp(inputs, g, t)`` (forward-over-reverse) are the second-order checks, for the whole op only."""

    forward: Callable                              # outputs compared across frameworks
    vjp: Callable                                  # hand-written VJP under test
    jvp: Optional[Callable]                        # hand-written JVP under test
    reference: Callable                            # plain composite; its autodiff is the oracle
    source: str                                    # shown in reports, e.g. "torch_impl.attn"
    forward_is_hand: bool = False                  # forward is itself under test (compare with reference)
    jvp_missing: str = ""
    key: tuple = ()                                # a compiled JAX program is reused only for the same key; () never
    # (inputs) -> None if the gradient of ``forward`` is hand-written, else how autodiff reaches the inputs
    autodiff_probe: Optional[Callable] = None      # (``Framework.ops.autodiff_path``); None: not probed (blocks)
    user: bool = False                             # a --torch-impl / --jax-impl implementation
    vjp_vjp: Optional[Callable] = None             # second order through the hand-written backward
    hvp: Optional[Callable] = None
    reference_only: bool = False                   # no rows of its own: the other side's compare with its reference
    candidate: str = ""                            # its name in oracle labels, "" = the framework's (see sharded)
    # no second order, and why (the refusal its backward raises): the second-order rows are skipped with it
    second_order_missing: str = ""

    @classmethod
    def results_only(cls, candidate: str, source: str) -> "Side":
        """The side of a candidate whose results were computed in another process (``--shards``' ranks and JAX
        subprocess, ``--kernels``' torch subprocess): ``compare_case`` reads only its name (``candidate``) and that
        its forward is under test; it has no function to call here."""
        return cls(forward=None, vjp=None, jvp=None, reference=None, source=source, forward_is_hand=True,
                   candidate=candidate)


@dataclass(frozen=True)
class OpSpec:
    name: str
    equations: str
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    input_shapes: Callable[[int, int, int], Tuple[Tuple[int, ...], ...]]
    output_shapes: Callable[[int, int, int], Tuple[Tuple[int, ...], ...]]
    # standard deviation of each input's entries, so that tanh's argument is O(1) (see sampling.sample_inputs)
    input_std: Callable[[int, int, int, bool], Tuple[float, ...]]
    torch_side: Callable[[], Side]                 # factories: JAX is imported only when its side is built
    jax_side: Callable[[], Side]
    replaceable: bool = False                      # --torch-impl / --jax-impl may replace it
    kernel: bool = False                           # its sides run fused kernels: checked with --kernels only
    dtypes: Tuple[str, ...] = ()                   # the dtypes it is checked in; () = every dtype of the run
    # tanh's argument from the op's inputs (numpy; None: no tanh), and the inputs it is the product of, which
    # sampling.sample_inputs scales down together where a draw passes metrics.x_limit
    tanh_argument: Optional[Callable[..., np.ndarray]] = None
    tanh_factors: Tuple[int, ...] = ()

    def side(self, fw: str) -> Side:
        """The side of framework ``fw`` (built on demand: JAX is imported only for its side)."""
        return get(fw).spec_side(self)()

    def with_impls(self, torch_fn: Optional[Callable] = None, torch_source: str = "",
                   jax_fn: Optional[Callable] = None, jax_source: str = "") -> "OpSpec":
        """This spec with a user implementation of the whole op (same signature as ``attn``)."""
        if not self.replaceable:
            raise ValueError(f"op {self.name!r} has no replaceable implementation")
        spec = self
        if torch_fn is not None:
            spec = dataclasses.replace(spec, torch_side=lambda: _user_side("torch", torch_fn, torch_source))
        if jax_fn is not None:
            spec = dataclasses.replace(spec, jax_side=lambda: _user_side("jax", jax_fn, jax_source))
        elif torch_fn is not None:                 # yours against JAX autodiff, not the project's JAX rules
            spec = dataclasses.replace(spec, jax_side=_jax_reference_side)
        return spec


# --- sides ---------------------------------------------------------------------------------------------------------

def _hand_side(fw: str, fn: Callable, source: str, jvp_fn: Optional[Callable] = None, user: bool = False,
               key: tuple = ()) -> Side:
    """The whole op ``fn`` of framework ``fw`` (``jvp_fn``: another function whose forward-mode rule is checked, as
    JAX's ``custom_jvp`` twin), against the project's reference."""
    ops = get(fw).ops
    return Side(forward=fn, vjp=ops.hand_vjp(fn), jvp=ops.hand_jvp(jvp_fn or fn),
                reference=get(fw).impl().attn_reference, source=source, forward_is_hand=True,
                autodiff_probe=lambda inputs: ops.autodiff_path(fn, inputs, ("o", "a"), ("q", "k", "v")), user=user,
                key=key, vjp_vjp=ops.hand_vjp_vjp(fn), hvp=ops.hand_hvp(fn))


def _torch_attn_side() -> Side:
    import torch_impl
    return _hand_side("torch", torch_impl.attn, "torch_impl.attn")


def _jax_attn_side() -> Side:
    import jax_impl
    return _hand_side("jax", jax_impl.attn, "jax_impl.attn / jax_impl.attn_jvp", jvp_fn=jax_impl.attn_jvp,
                      key=("attn", jax_impl.attn, jax_impl.attn_jvp, jax_impl.attn_reference) + _formulas_key("jax"))


def _user_side(fw: str, fn: Callable, source: str) -> Side:
    return _hand_side(fw, fn, source, user=True, key=("user", fn, get(fw).impl().attn_reference))


def _jax_reference_side() -> Side:
    import jax_impl
    return Side(forward=jax_impl.attn_reference, vjp=None, jvp=None, reference=jax_impl.attn_reference,
                source="jax_impl.attn_reference", reference_only=True, key=("reference", jax_impl.attn_reference))


def _formulas_key(fw: str) -> tuple:
    formulas = get(fw).formulas()
    return tuple(getattr(formulas, name) for name in formulas.__all__)


# The building blocks: (reference, hand-written VJP of one request, JVP of one tangent tuple) from the framework's
# formulas module ``f`` and array namespace ``xp`` (torch / jax.numpy).  A gradient's other operand is passed only
# when that gradient is requested (k is read only for G_Q, q only for G_K ...), as a backward that saved only
# what it needs would.  Equation numbers: torch convention / JAX convention.
_BLOCKS = {
    "scores": (lambda xp: lambda q, k: (q @ k.T,),                                                     # (1)
               lambda f, q, k, need, g: f.scores_vjp(g[0], q if need[1] else None, k if need[0] else None, need),
               lambda f, q, k, t: (f.scores_jvp(q, k, *t),)),                           # (4)-(5) / (20)-(21); (14)
    "tanh": (lambda xp: lambda x: (xp.tanh(x),),                                                       # (2)
             lambda f, x, need, g: (f.tanh_vjp(g[0], x),),                              # (6) / (19), x: here a
             lambda f, x, t: (f.tanh_jvp(t[0], x),)),                                   # (15)
    "mix": (lambda xp: lambda a, v: (a @ v,),                                                          # (3)
            lambda f, a, v, need, g: f.mix_vjp(g[0], a if need[1] else None, v if need[0] else None, need),
            lambda f, a, v, t: (f.mix_jvp(a, v, *t),)),                                 # (7)-(8) / (18), (22); (16)
}


def _block_side(fw: str, name: str) -> Side:
    """A building block's side: the block functions of the framework's formulas module, the ones ``attn_backward`` /
    ``attn_jvp`` chain, so a wrong block formula fails its block's rows as well as attn's.  tanh's VJP and JVP
    read a = tanh(x), computed here; a VJP runs as in a real backward (torch: grad mode off)."""
    ops, f = get(fw).ops, get(fw).formulas()
    make_reference, one_vjp, one_jvp = _BLOCKS[name]
    reference = make_reference(ops.xp)
    saved = (lambda xs: (ops.xp.tanh(xs[0]),)) if name == "tanh" else (lambda xs: xs)

    def vjp(inputs, requests):
        xs = saved(inputs)
        with ops.backward_mode():
            return [one_vjp(f, *xs, need, g) for need, g in requests]

    def jvp(inputs, tangents_list):
        xs = saved(inputs)
        return [one_jvp(f, *xs, t) for t in tangents_list]

    return Side(forward=reference, vjp=vjp, jvp=jvp, reference=reference,
                source=f"{f.__name__}.{name}_vjp/{name}_jvp", key=(name,) + _formulas_key(fw))


# --- the kernel ops: o alone (torch_impl.attn_o, jax_impl.attn_o / attn_o_jvp) ----------------------------------

def o_only_side(fw: str, fn: Callable, jvp_fn: Callable, reference: Callable, source: str, key: tuple = (),
                second_order: bool = True, candidate: str = "") -> Side:
    """An ``attn_o`` entry ``fn(q, k, v) -> o`` of framework ``fw`` (``jvp_fn``: the function whose forward-mode
    rule is checked) against ``reference``; ``second_order=False``: ask first whether its backward is
    differentiable (:func:`second_order_refusal`): if not, no second-order rows, skipped with the refusal
    (``second_order_missing``)."""
    ops = get(fw).ops
    one = lambda f: lambda *xs: (f(*xs),)          # noqa: E731 - the oracles take a tuple of outputs
    fn, jvp_fn, reference = one(fn), one(jvp_fn), one(reference)
    side = Side(forward=fn, vjp=ops.hand_vjp(fn), jvp=ops.hand_jvp(jvp_fn), reference=reference, source=source,
                forward_is_hand=True, key=key, candidate=candidate,
                vjp_vjp=ops.hand_vjp_vjp(fn), hvp=ops.hand_hvp(fn))
    if not second_order:
        side = without_second_order(side, fw, fn)
    return side


def second_order_refusal(fw: str, fn: Callable, source: str) -> str:
    """Why ``fn`` (a JAX entry whose backward runs kernels: ``fw`` is JAX) has no second order: the error JAX raises
    when asked for the VJP of its VJP on tiny inputs, or ``""`` if it has one after all (then its rows are
    checked)."""
    import jax
    import jax.numpy as jnp

    from .jax_oracles import hand_vjp_vjp
    x = jnp.zeros((2, 2), jnp.float32)
    outs = jax.eval_shape(lambda *xs: tuple(fn(*xs)), x, x, x)
    g = tuple(jnp.zeros(o.shape, o.dtype) for o in outs)
    try:
        jax.jit(lambda xs: hand_vjp_vjp(fn)(xs, g, xs)).lower((x, x, x))
    except Exception as exc:                            # noqa: BLE001 - whatever JAX raises is the refusal
        return f"{source}: no second order (JAX could not differentiate its backward): {first_line(exc)}"
    return ""


def without_second_order(side: Side, fw: str, fn: Callable) -> Side:
    """``side`` without its second-order checks if ``fn`` refuses second order (:func:`second_order_refusal`),
    the refusal in ``second_order_missing``; else ``side`` as it is."""
    refusal = second_order_refusal(fw, fn, side.source)
    return dataclasses.replace(side, vjp_vjp=None, hvp=None, second_order_missing=refusal) if refusal else side


def _torch_o_side(causal: bool) -> Side:
    import torch_impl
    from torch_impl.kernels.o_only import attn_o_reference
    fn = partial(torch_impl.attn_o, causal=causal)
    return o_only_side("torch", fn, fn, partial(attn_o_reference, causal=causal),
                       "torch_impl.attn_o" + (" (causal)" if causal else ""))


def _jax_o_side(causal: bool) -> Side:
    import jax_impl
    fn, jvp_fn = partial(jax_impl.attn_o, causal=causal), partial(jax_impl.attn_o_jvp, causal=causal)
    from jax_impl.kernels import attn_o_reference
    return o_only_side("jax", fn, jvp_fn, partial(attn_o_reference, causal=causal),
                       "jax_impl.attn_o / jax_impl.attn_o_jvp" + (" (causal)" if causal else ""),
                       key=("attn_o", causal, jax_impl.attn_o, jax_impl.attn_o_jvp), second_order=False)


def _o_spec(name: str, causal: bool) -> OpSpec:
    mask = " masked (37)" if causal else ""
    return OpSpec(
        name=name, equations=f"o = tanh(q kᵀ{mask}) v (32); VJP (33)-(35){', (38)' if causal else ''}, "
                             f"JVP (36){', (39)' if causal else ''}",
        inputs=("q", "k", "v"), outputs=("o",),
        input_shapes=lambda n, d, e: ((n, d), (n, d), (n, e)), output_shapes=lambda n, d, e: ((n, e),),
        input_std=lambda n, d, e, c: (qk_std(d, c), qk_std(d, c), 1.0),
        torch_side=partial(_torch_o_side, causal), jax_side=partial(_jax_o_side, causal), kernel=True,
        # jax_impl.attn_o: real dtypes only (float16 / bfloat16 not checked)
        dtypes=("float32", "float64"), tanh_argument=partial(scores, causal=causal), tanh_factors=(0, 1))


# --- the registry ----------------------------------------------------------------------------------------------

def _block(name: str, equations: str, **fields) -> OpSpec:
    return OpSpec(name, equations, **fields, torch_side=partial(_block_side, "torch", name),
                  jax_side=partial(_block_side, "jax", name))


SPECS: Dict[str, OpSpec] = {
    "scores": _block(
        "scores", "x = q kᵀ (1); VJP (4)-(5), JVP (14)", inputs=("q", "k"), outputs=("x",),
        input_shapes=lambda n, d, e: ((n, d), (n, d)), output_shapes=lambda n, d, e: ((n, n),),
        input_std=lambda n, d, e, c: (qk_std(d, c), qk_std(d, c))),
    "tanh": _block(
        "tanh", "a = tanh x (2); VJP (6), JVP (15)", inputs=("x",), outputs=("a",),
        input_shapes=lambda n, d, e: ((n, n),), output_shapes=lambda n, d, e: ((n, n),),
        input_std=lambda n, d, e, c: (x_std(c),), tanh_argument=lambda x: x, tanh_factors=(0,)),
    "mix": _block(
        "mix", "o = a v (3); VJP (7)-(8), JVP (16)", inputs=("a", "v"), outputs=("o",),
        input_shapes=lambda n, d, e: ((n, n), (n, e)), output_shapes=lambda n, d, e: ((n, e),),
        input_std=lambda n, d, e, c: (0.6, 1.0)),
    "attn": OpSpec(
        name="attn", equations="(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ)) (1)-(3); VJP (9)-(13), JVP (14)-(16)",
        inputs=("q", "k", "v"), outputs=("o", "a"),
        input_shapes=lambda n, d, e: ((n, d), (n, d), (n, e)), output_shapes=lambda n, d, e: ((n, e), (n, n)),
        input_std=lambda n, d, e, c: (qk_std(d, c), qk_std(d, c), 1.0),
        torch_side=_torch_attn_side, jax_side=_jax_attn_side, replaceable=True, tanh_argument=scores,
        tanh_factors=(0, 1)),
    "attn_o": _o_spec("attn_o", causal=False),
    "attn_o_causal": _o_spec("attn_o_causal", causal=True),
}

KERNEL_OPS: Tuple[str, ...] = tuple(name for name, spec in SPECS.items() if spec.kernel)
"""The ops checked only with ``--kernels`` (``run(..., kernels=True)``)."""
