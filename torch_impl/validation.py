"""Input contract of tanh attention, checked once for every torch entry point, before any compute.

The message templates below are shared word for word with ``jax_impl.validation`` (``tests/test_messages.py``
compares them), so a user gets the same error from either framework.

Contract (the lab's): ``q: (n, d)``, ``k: (n, d)``, ``v: (n, e)``: all 2-D, one dtype of ``DTYPES`` (float16,
bfloat16, float32, float64, complex64, complex128), one device, and **all three first dimensions equal** (the lab
fixes n for q, k and v, although the math would allow k and v to have their own length).  Any of n, d, e may be 0.
"""

from __future__ import annotations

import torch

__all__ = ["check_inputs", "MESSAGES"]

NAMES = ("q", "k", "v")

# One template per failure; `{...}` fields are filled with framework-neutral text (shape tuples, dtype names
# such as "float32", device strings).
MESSAGES = {
    "type": "attn(): argument '{name}' must be a {accepted}, got {type}",
    "ndim": "attn(): argument '{name}' must be 2-D ({dims}), got {ndim}-D with shape {shape}",
    "dtype": ("attn(): argument '{name}' must have a floating-point or complex dtype (float16, bfloat16, float32, "
              "float64, complex64 or complex128), got {dtype}"),            # the names of DTYPES (tested)
    "d": "attn(): q and k must have the same second dimension d, got q {q} and k {k}",
    "n": ("attn(): q, k and v must have the same first dimension n (the lab's contract: q is (n, d), k is (n, d), "
          "v is (n, e)), got q {q}, k {k} and v {v}"),
    "same_dtype": "attn(): q, k and v must have the same dtype, got q {q}, k {k} and v {v}",
    "same_device": "attn(): q, k and v must be on the same device, got q {q}, k {k} and v {v}",
}
DIMS = {"q": "n, d", "k": "n, d", "v": "n, e"}

# The dtype allowlist (same names in both frameworks).  Every op of the formulas has kernels for these on CPU and
# CUDA.  Others that count as floating point or complex -- complex32 (torch.chalf), the float8 / float4 families
# -- have no matmul or tanh kernels and would fail deep inside the framework (torch: NotImplementedError from
# aten) instead of with the contract's TypeError naming the argument.
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
_ALLOWED = frozenset(getattr(torch, name) for name in DTYPES)   # a set lookup: validation is on the hot path


# What the "type" message says this framework accepts (the one field of a template that differs by framework).
ACCEPTED = "torch.Tensor"


def _type_name(obj) -> str:
    """The argument's type as a user would write it: ``list``, ``numpy.ndarray``, ``torch.Tensor``, and
    ``jax.Array`` for JAX's concrete arrays and tracers (whose classes live in private modules)."""
    cls = type(obj)
    top = cls.__module__.split(".")[0]
    if top == "builtins":
        return cls.__qualname__
    if top in ("jax", "jaxlib"):
        return "jax.Array"
    return f"{top}.{cls.__qualname__}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_inputs(q, k, v) -> None:
    """Raise ``TypeError`` (wrong kind of argument / dtype, mixed dtypes) or ``ValueError`` (wrong shape, mixed
    devices) naming the argument; return ``None`` when ``q, k, v`` are valid inputs."""
    args = (q, k, v)
    for name, t in zip(NAMES, args):
        if not isinstance(t, torch.Tensor):
            raise TypeError(MESSAGES["type"].format(name=name, accepted=ACCEPTED, type=_type_name(t)))
        if t.dim() != 2:
            raise ValueError(MESSAGES["ndim"].format(name=name, dims=DIMS[name], ndim=t.dim(), shape=tuple(t.shape)))
        if t.dtype not in _ALLOWED:
            raise TypeError(MESSAGES["dtype"].format(name=name, dtype=_dtype_name(t.dtype)))
    if q.shape[1] != k.shape[1]:
        raise ValueError(MESSAGES["d"].format(q=tuple(q.shape), k=tuple(k.shape)))
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(MESSAGES["n"].format(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape)))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(MESSAGES["same_dtype"].format(**{n: _dtype_name(t.dtype) for n, t in zip(NAMES, args)}))
    if not (q.device == k.device == v.device):
        raise ValueError(MESSAGES["same_device"].format(**{n: str(t.device) for n, t in zip(NAMES, args)}))
