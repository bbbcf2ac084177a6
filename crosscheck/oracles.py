"""Who is compared with whom: the comparison kinds (:class:`Kind`) and the oracle pairs (:class:`Oracle`), with
their labels rendered here and nowhere else.

An oracle pair is data — the side under test (:class:`Party`: its name, what of it is tested, whether it is the
user's), the side it is compared with, the framework whose error is measured, whether it is a torch-vs-JAX pair —
carried as it is to the rows, the failures and the report, which read its fields and never its label.
:meth:`Oracle.label` renders it for the table, the messages and the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

__all__ = ["Kind", "KINDS", "Party", "Oracle"]


class Kind(str, Enum):
    """What a comparison compares (the JSON's ``kind``): forward outputs; first-order VJP / JVP; second order: the
    VJP of the VJP, the Hessian-vector product (forward-over-reverse).  A ``str`` whose value is the JSON word."""

    FORWARD = "forward"
    VJP = "vjp"
    JVP = "jvp"
    VJP_VJP = "vjp_vjp"
    HVP = "hvp"

    def __str__(self) -> str:
        return self.value

    @property
    def second_order(self) -> bool:
        return self in (Kind.VJP_VJP, Kind.HVP)

    @property
    def call(self) -> str:
        """What runs the user's code, in the words of a failure that raised: "backward", "jvp", ..."""
        return _CALLS[self]

    @property
    def title(self) -> str:
        """The derivative's name in a note: "VJP", "VJP of VJP", ..."""
        return _TITLES[self]

    @property
    def of_outputs(self) -> bool:
        """Whether a comparison of this kind is of outputs (forward, JVP: its ``outputs`` name what is compared)
        rather than of gradients (its ``inputs`` do)."""
        return self in (Kind.FORWARD, Kind.JVP)


KINDS = tuple(Kind)
_CALLS = {Kind.FORWARD: "forward", Kind.VJP: "backward", Kind.JVP: "jvp",
          Kind.VJP_VJP: "second order (VJP of the VJP)", Kind.HVP: "second order (HVP, forward-over-reverse)"}
_TITLES = {Kind.FORWARD: "forward", Kind.VJP: "VJP", Kind.JVP: "JVP", Kind.VJP_VJP: "VJP of VJP", Kind.HVP: "HVP"}


@dataclass(frozen=True)
class Party:
    """One side of an oracle pair: ``name`` (a framework, a candidate, an autodiff call, "float64 truth"), ``what``
    of it is compared ("hand VJP", "impl", "reference"; "" for the whole), ``yours``: the user's implementation."""

    name: str
    what: str = ""
    yours: bool = False

    def text(self, mark_yours: bool = True) -> str:
        words = self.name + (f" {self.what}" if self.what else "")
        return words + (" (yours)" if self.yours and mark_yours else "")


@dataclass(frozen=True)
class Oracle:
    """An oracle pair: ``tested`` compared with ``against`` (``None``: a check of ``tested`` alone, e.g. "every rank
    ends alike"), in comparisons of ``kind``.  ``framework``: the side whose error is measured; ``cross``: a
    torch-vs-JAX pair; ``symmetric``: neither side is trusted (two user implementations: rel err divides by the
    larger norm, see ``metrics.diff``); ``candidate``: a candidate other than the framework's own entry ("torch
    sharded ring on 2 ranks"), or ""."""

    kind: Kind
    framework: str
    tested: Party
    against: Optional[Party] = None
    cross: bool = False
    symmetric: bool = False
    candidate: str = ""

    def side(self, console: bool = False) -> str:
        """The tested side alone (a request that raised is named by it).  "(yours)" is marked on the console, and
        in every rendering of a cross-framework pair (the JSON's labels of a framework's own rows never had it)."""
        return self.tested.text(console or self.cross)

    def label(self, console: bool = False) -> str:
        """``"torch hand VJP vs torch.func.vjp(ref)"``; on the console, ``"torch hand VJP (yours) vs ..."``."""
        text = self.side(console)
        if self.against is not None:
            text += f" vs {self.against.text()}"
        return text + (" (eq. 17)" if self.cross and self.kind is Kind.VJP else "")
