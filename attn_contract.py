"""The input contract of tanh attention, once, for both frameworks (imports neither torch nor JAX).

``torch_impl.validation`` and ``jax_impl.validation`` each describe their array type in a :class:`Framework`
and call :func:`check`; so the order of the checks, the exception types and the message texts are the same in
both by construction.

Two contracts:

* **The lab's** (``attn``, ``attn_reference``, the ``attn_lab::attn`` operators): ``q: (n, d)``, ``k: (n, d)``,
  ``v: (n, e)``, **all three first dimensions equal** -- the lab fixes one n, although the math would let k
  and v have their own length.  For a DTensor it is checked on the global shapes.
* **The block** (``attn_block``, the sharded building block: local shards, eq. (32) of derivation.md):
  ``q: (m, d)``, ``k: (n, d)``, ``v: (n, e)``; q's rows are independent of the key/value rows, only k and v
  must agree.

Both: every argument an array of the framework, 2-D, one dtype of :data:`DTYPES`, all three the same dtype
(and device, where the framework has one).  Any of m, n, d, e may be 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["DTYPES", "NAMES", "DIMS", "BLOCK_DIMS", "MESSAGES", "STACK_DIMS", "STACK_MESSAGES", "Framework", "check",
           "message", "type_name"]

NAMES = ("q", "k", "v")
DIMS = {"q": "n, d", "k": "n, d", "v": "n, e"}              # the lab's contract
BLOCK_DIMS = {"q": "m, d", "k": "n, d", "v": "n, e"}        # the block's

# The dtype allowlist.  Every op of the formulas has kernels for these in both frameworks, on CPU and CUDA.
# Others that count as floating point or complex -- complex32 (torch.chalf), the float8 / float4 families --
# have no matmul or tanh kernels and would fail deep inside the framework instead of with the "dtype" message.
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")

# One template per failure.  ``{fn}`` is the entry point ("attn" or "attn_block"); the other fields are
# framework-neutral text: shape tuples, dtype names such as "float32", device strings.
MESSAGES = {
    "type": "{fn}(): argument '{name}' must be a {accepted}, got {type}",
    "ndim": "{fn}(): argument '{name}' must be 2-D ({dims}), got {ndim}-D with shape {shape}",
    "dtype": ("{fn}(): argument '{name}' must have a floating-point or complex dtype (" + ", ".join(DTYPES[:-1])
              + " or " + DTYPES[-1] + "), got {dtype}"),
    "d": "{fn}(): q and k must have the same second dimension d, got q {q} and k {k}",
    "n": ("{fn}(): q, k and v must have the same first dimension n (the lab's contract: q is (n, d), k is (n, d), "
          "v is (n, e)), got q {q}, k {k} and v {v}"),
    "kv_rows": ("{fn}(): k and v must have the same first dimension n (the key/value rows: q is (m, d), k is "
                "(n, d), v is (n, e)), got k {k} and v {v}"),
    "same_dtype": "{fn}(): q, k and v must have the same dtype, got q {q}, k {k} and v {v}",
    "same_device": "{fn}(): q, k and v must be on the same device, got q {q}, k {k} and v {v}",
    # torch only: JAX has no nested (ragged) arrays, so jax_impl never raises it.  A nested tensor has no
    # sizes to check (its ``shape`` raises), so torch_impl.validation refuses it before the checks above.
    "nested": ("{fn}(): argument '{name}' must be a dense tensor, got a nested tensor ({layout} layout): pass "
               "each sequence as its own tensor, or pad them to one length"),
}


# The stacked contract of the o-only entries (``attn_o``, ``attn_o_jvp``; torch_impl.kernels.o_only and
# jax_impl.kernels): q (..., n, d), k (..., n, d), v (..., n, e), the same leading dimensions.  The type, dtype,
# same-dtype and same-device failures use MESSAGES above.  ``{fn}`` is the entry point.
STACK_DIMS = {"q": "..., n, d", "k": "..., n, d", "v": "..., n, e"}
STACK_MESSAGES = {
    "ndim": "{fn}(): argument '{name}' must have at least 2 dimensions ({dims}), got {ndim}-D with shape {shape}",
    "d": "{fn}(): q and k must have the same last dimension d, got q {q} and k {k}",
    "n": ("{fn}(): q, k and v must have the same leading dimensions and n (q is (..., n, d), k is (..., n, d), "
          "v is (..., n, e)), got q {q}, k {k} and v {v}"),
    "causal": "{fn}(): argument 'causal' must be a bool, got {type}",
}


def message(key: str, fn: str = "attn", **fields) -> str:
    """The text of the error ``key`` raised by entry point ``fn`` (what a test compares an error with)."""
    return MESSAGES[key].format(fn=fn, **fields)


@dataclass(frozen=True)
class Framework:
    """What :func:`check` needs to know of a framework's arrays."""

    accepted: str                                  # the "type" message's wording: "torch.Tensor", ...
    array_types: tuple                             # isinstance(arg, array_types): an array of this framework
    dtype_ok: Callable[[Any], bool]                # the dtype object is one of DTYPES
    dtype_name: Callable[[Any], str]               # dtype object -> "float32"
    device: Optional[Callable[[Any], Any]] = None  # array -> its device (printed with str); None: no device check


def type_name(obj) -> str:
    """The argument's type as a user would write it: ``list``, ``numpy.ndarray``, ``torch.Tensor``, and
    ``jax.Array`` for JAX's concrete arrays and tracers (whose classes live in private modules)."""
    cls = type(obj)
    top = cls.__module__.split(".")[0]
    if top == "builtins":
        return cls.__qualname__
    if top in ("jax", "jaxlib"):
        return "jax.Array"
    return f"{top}.{cls.__qualname__}"


def check(fw: Framework, q, k, v, *, fn: str = "attn", block: bool = False) -> None:
    """Raise ``TypeError`` (wrong kind of argument or dtype, mixed dtypes) or ``ValueError`` (wrong shape, mixed
    devices) naming the argument, before any compute; return ``None`` for valid inputs.  ``block=False``: the
    lab's contract; ``block=True``: the block's (q may have its own number of rows)."""
    args = (q, k, v)
    dims = BLOCK_DIMS if block else DIMS
    for name, t in zip(NAMES, args):
        if not isinstance(t, fw.array_types):
            raise TypeError(message("type", fn, name=name, accepted=fw.accepted, type=type_name(t)))
        if t.ndim != 2:
            raise ValueError(message("ndim", fn, name=name, dims=dims[name], ndim=t.ndim,
                                                     shape=tuple(t.shape)))
        if not fw.dtype_ok(t.dtype):
            raise TypeError(message("dtype", fn, name=name, dtype=fw.dtype_name(t.dtype)))
    if q.shape[1] != k.shape[1]:
        raise ValueError(message("d", fn, q=tuple(q.shape), k=tuple(k.shape)))
    if block:
        if k.shape[0] != v.shape[0]:
            raise ValueError(message("kv_rows", fn, k=tuple(k.shape), v=tuple(v.shape)))
    elif not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(message("n", fn, q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape)))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(message("same_dtype", fn, **{n: fw.dtype_name(t.dtype) for n, t in zip(NAMES, args)}))
    if fw.device is not None:
        devices = [fw.device(t) for t in args]
        if not (devices[0] == devices[1] == devices[2]):
            raise ValueError(message("same_device", fn, **{n: str(d) for n, d in zip(NAMES, devices)}))
