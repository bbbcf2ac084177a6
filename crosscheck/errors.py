"""Exceptions that end a crosscheck run with exit code 2 (usage or environment error, nothing was judged)."""

from __future__ import annotations

__all__ = ["UsageError", "EnvironmentProblem", "ImplError", "first_line"]


def first_line(exc: BaseException) -> str:
    """``"TypeError: <first line of the message>"`` (the type alone for an empty message)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class UsageError(Exception):
    """Bad command-line input: unknown op or dtype, malformed shape, unloadable ``MODULE:ATTR`` ..."""


class EnvironmentProblem(UsageError):
    """The requested device or framework is not available (e.g. ``--device cuda`` without a GPU)."""


class ImplError(UsageError):
    """An implementation under test cannot be checked at all: its forward raises, or it does not return two
    arrays ``(o, a)`` of shapes ``(n, e)`` and ``(n, n)``.  (A *gradient* that raises or has the wrong shape is
    not this: that is a disagreement, reported per gradient with exit code 1.)"""
