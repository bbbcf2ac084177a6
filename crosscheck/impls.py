"""Loading a user's implementation from ``MODULE:ATTR`` (``--torch-impl`` / ``--jax-impl``)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from .errors import UsageError
from .frameworks import get

__all__ = ["load_impl", "resolve", "wrong_framework"]


def _import(module: str, option: str):
    try:
        if module.endswith(".py") or os.sep in module or "/" in module:
            path = os.path.abspath(module)
            if not os.path.isfile(path):
                raise UsageError(f"{option} {module!r}: no such file")
            name = "_crosscheck_user_" + os.path.splitext(os.path.basename(path))[0]
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            return mod
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())          # like `python -m`: modules in the current directory
        return importlib.import_module(module)
    except (UsageError, KeyboardInterrupt):
        raise
    except BaseException as e:                       # noqa: BLE001 - any import-time failure of user code
        raise UsageError(f"{option}: cannot import {module!r}: {type(e).__name__}: {e}") from None


def resolve(text: str, option: str):
    """The object named by ``"pkg.mod:attr"`` / ``"path/to/file.py:Attr"`` (also ``--torch-layouts`` /
    ``--jax-layouts``); raises :class:`UsageError` with a clear message."""
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"{option} expects MODULE:ATTR (e.g. my_attn:attn or path/to/my_attn.py:MyAttn), "
                         f"got {text!r}")
    obj = _import(module, option)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{option} {text!r}: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_impl(text: str, option: str, framework: str) -> Tuple[Callable, str]:
    """``"pkg.mod:attn"`` / ``"path/to/file.py:MyAttn"`` → (callable, name).  An ``autograd.Function`` subclass
    is called through its ``apply``.  Raises :class:`UsageError` with a clear message."""
    obj = resolve(text, option)
    attr = text.partition(":")[2]
    kind = _framework_of(obj)
    if kind is not None and kind[0] != framework:
        raise UsageError(f"{option} {text!r}: this looks like a {get(kind[0]).title} implementation ({kind[1]}): "
                         f"use {get(kind[0]).flag} {text}")
    fw = get(framework)
    obj = fw.ops.as_impl(obj)
    if isinstance(obj, type):                        # calling a class builds an instance, not (o, a)
        bases = ", ".join(b.__module__.split(".")[0] + "." + b.__qualname__ if b.__module__ != "builtins"
                          else b.__qualname__ for b in obj.__bases__)
        raise UsageError(f"{option} {text!r}: {attr!r} is a class deriving from {bases}, not {fw.impl_kind} "
                         f"attn(q, k, v) -> (o, a): {fw.impl_fix}")
    if not callable(obj):
        kind = type(obj).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise UsageError(f"{option} {text!r}: {attr!r} is {article} {kind}, not a callable attn(q, k, v) -> (o, a)")
    return obj, text


def _framework_of(obj) -> Optional[Tuple[str, str]]:
    """("torch" | "jax", what it is) for objects that are recognisably one framework's, else None."""
    module = type(obj).__module__ or ""
    if module.startswith("jax"):                      # jax.custom_vjp / custom_jvp objects, jitted functions
        return "jax", f"a jax.{type(obj).__name__}"
    torch = sys.modules.get("torch")                 # (not imported: the object cannot be torch's)
    if torch is not None:
        if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
            return "torch", "a torch.autograd.Function subclass"
        if isinstance(obj, torch.nn.Module) or (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
            return "torch", "a torch.nn.Module"
    return None


def wrong_framework(framework: str, fn: Callable, source: str, inputs: Sequence[np.ndarray]) -> Optional[str]:
    """When ``fn`` (given for ``framework``) failed: a message if it works with the *other* framework's arrays
    (returns two of them), i.e. it was passed to the wrong flag; None otherwise."""
    mine = get(framework)
    other = get(mine.other)
    try:
        ops = other.ops
        with ops.context("cpu"):
            outs = tuple(fn(*(ops.to_native(np.ascontiguousarray(x), "cpu") for x in inputs)))
        if len(outs) != 2 or not all(isinstance(o, ops.Array) for o in outs):
            return None
    except Exception:                                 # noqa: BLE001 - not the other framework's either
        return None
    return (f"{source} looks like a {other.title} implementation (given {other.arrays} it returns {other.arrays}, "
            f"while {mine.flag} calls it with {mine.arrays}): use {other.flag} {source}")
