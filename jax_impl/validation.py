"""Input contract of tanh attention, checked once for every JAX entry point, before any compute.

The message templates are restated word for word from ``torch_impl.validation`` (``jax_impl`` must not import
torch); ``tests/test_messages.py`` renders both for the same bad inputs and asserts the texts are identical.

Contract (the lab's): ``q: (n, d)``, ``k: (n, d)``, ``v: (n, e)``: all 2-D arrays (``jax.Array`` or
``numpy.ndarray``), one dtype of ``DTYPES`` (float16, bfloat16, float32, float64, complex64, complex128; not
the float8 / float4 / int4 types JAX also has), and **all three first dimensions equal**.  Any of n, d,
e may be 0.  Shapes and dtypes are static in JAX, so the checks run eagerly at trace time, also under
``jax.jit`` (on tracers) and ``jax.vmap`` (where the function sees the per-example 2-D shapes).

Not checked, unlike torch: devices.  A tracer (inside ``jit`` / ``vmap`` / ``grad``) has no device, numpy arrays
have none, and placement of concrete arrays is JAX's own business (uncommitted arrays move freely; JAX itself
raises for arrays committed to different devices), so there is no JAX counterpart of torch's ``same_device``
check to make at this level.
"""

from __future__ import annotations

import numpy as np
import jax

__all__ = ["check_inputs", "MESSAGES"]

NAMES = ("q", "k", "v")

# Identical to torch_impl.validation.MESSAGES (tests/test_messages.py asserts it); "same_device" is kept so the
# two dicts are equal, although the JAX side never raises it (see the module docstring).
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


# What the "type" message says this framework accepts (the one field of a template that differs by framework).
ACCEPTED = "jax.Array or numpy.ndarray"


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

# What counts as an array: jax.Array (concrete arrays and every tracer) and numpy arrays.  Python lists and
# scalars, and numpy scalars, are rejected with the "type" message, like non-tensors on the torch side.
ARRAY_TYPES = (jax.Array, np.ndarray)


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name                                    # "float32", "bfloat16", "int64", "bool", ...


def check_inputs(q, k, v) -> None:
    """Raise ``TypeError`` (wrong kind of argument / dtype) or ``ValueError`` (wrong shape) naming the argument;
    return ``None`` when ``q, k, v`` are valid inputs.  Same order of checks, same exception types and same
    messages as ``torch_impl.validation.check_inputs``.  Reads only static ``shape`` / ``dtype``."""
    args = (q, k, v)
    for name, t in zip(NAMES, args):
        if not isinstance(t, ARRAY_TYPES):
            raise TypeError(MESSAGES["type"].format(name=name, accepted=ACCEPTED, type=_type_name(t)))
        if t.ndim != 2:
            raise ValueError(MESSAGES["ndim"].format(name=name, dims=DIMS[name], ndim=t.ndim, shape=tuple(t.shape)))
        if _dtype_name(t.dtype) not in DTYPES:
            raise TypeError(MESSAGES["dtype"].format(name=name, dtype=_dtype_name(t.dtype)))
    if q.shape[1] != k.shape[1]:
        raise ValueError(MESSAGES["d"].format(q=tuple(q.shape), k=tuple(k.shape)))
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(MESSAGES["n"].format(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape)))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(MESSAGES["same_dtype"].format(**{n: _dtype_name(t.dtype) for n, t in zip(NAMES, args)}))
