"""Exceptions that end a crosscheck run with exit code 2 (usage or environment error, nothing was judged)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UsageError", "EnvironmentProblem", "ImplError", "first_line", "Raised"]


@dataclass(frozen=True)
class Raised:
    """An exception as crosscheck reports it: its type's name and the first line of its message (``text``:
    ``"TypeError: <first line>"``, the type alone for an empty message; no type: an outcome that is not one
    exception, e.g. ranks that ended differently, is its message alone).  Picklable: a child process
    (``--shards``' ranks, ``--kernels``' subprocess) sends it back as it is."""

    type: str
    message: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> "Raised":
        lines = str(exc).strip().splitlines()
        return cls(type(exc).__name__, lines[0] if lines else "")

    @property
    def text(self) -> str:
        return f"{self.type}: {self.message}".rstrip(": ") if self.type else self.message


def first_line(exc: BaseException) -> str:
    """``"TypeError: <first line of the message>"`` (the type alone for an empty message): ``Raised.of(exc).text``."""
    return Raised.of(exc).text


class UsageError(Exception):
    """Bad command-line input: unknown op or dtype, malformed shape, unloadable ``MODULE:ATTR`` ..."""


class EnvironmentProblem(UsageError):
    """The requested device or framework is not available (e.g. ``--device cuda`` without a GPU)."""


class ImplError(UsageError):
    """An implementation under test cannot be checked at all: its forward raises, or it does not return two
    arrays ``(o, a)`` of shapes ``(n, e)`` and ``(n, n)``.  (A *gradient* that raises or has the wrong shape is
    not this: that is a disagreement, reported per gradient with exit code 1.)"""
