"""Loading a user's implementation from ``MODULE:ATTR`` (``--torch-impl`` / ``--jax-impl``)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable, Tuple

from .errors import UsageError

__all__ = ["load_impl"]


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
    except UsageError:
        raise
    except BaseException as e:                       # noqa: BLE001 - any import-time failure of user code
        if isinstance(e, KeyboardInterrupt):
            raise
        raise UsageError(f"{option}: cannot import {module!r}: {type(e).__name__}: {e}") from None


def load_impl(text: str, option: str, framework: str) -> Tuple[Callable, str]:
    """``"pkg.mod:attn"`` / ``"path/to/file.py:MyAttn"`` → (callable, name).  An ``autograd.Function`` subclass
    is called through its ``apply``.  Raises :class:`UsageError` with a clear message."""
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"{option} expects MODULE:ATTR (e.g. my_attn:attn or path/to/my_attn.py:MyAttn), "
                         f"got {text!r}")
    obj = _import(module, option)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{option} {text!r}: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if framework == "torch":
        import torch
        if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
            obj = obj.apply
    if not callable(obj):
        raise UsageError(f"{option} {text!r}: {attr!r} is a {type(obj).__name__}, not a callable "
                         f"attn(q, k, v) -> (o, a)")
    return obj, text
