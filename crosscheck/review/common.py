"""What the review of both frameworks shares: the findings, the shape whose sizes tell products apart, the
contract's bad inputs and their check, the classes of matrix products, and running every request."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import first_line
from ..frameworks import BY_NAME

__all__ = ["SHAPE", "KEYS", "NAMES", "Finding", "Review", "Unavailable", "inputs", "BAD_INPUTS", "validation",
           "SUBSETS", "label", "product_class", "unrequested_products", "MODES", "per_request", "evidence"]

SHAPE = (5, 2, 3)                                  # n, d, e: all different

# Every finding key, per framework (``Framework.review_keys``; docs/crosscheck.md has the table; tests plant a
# solution for each).
KEYS = {name: fw.review_keys for name, fw in BY_NAME.items()}
NAMES = ("q", "k", "v")


@dataclass(frozen=True)
class Finding:
    key: str                                       # which lab ask, e.g. "recomputes", "validation"
    title: str                                     # one line, what is wrong
    evidence: str = ""                             # what crosscheck saw


@dataclass
class Review:
    framework: str
    impl: str
    findings: List[Finding] = field(default_factory=list)
    unavailable: List[str] = field(default_factory=list)      # items that could not run here, and why

    def has(self, key: str) -> bool:
        return any(f.key == key for f in self.findings)


class Unavailable(Exception):
    """A review item this torch / JAX version (or this kind of implementation) does not allow."""


def inputs(dtype: str) -> List[np.ndarray]:
    """q, k, v at ``SHAPE``, drawn as the correctness checks draw them (``sampling.sample_inputs``), seed 0."""
    from ..sampling import sample_inputs
    from ..specs import SPECS
    return list(sample_inputs(SPECS["attn"], np.random.default_rng(0), SHAPE, dtype))


# The contract's bad inputs: (what is wrong, how to make them from good numpy inputs q, k, v; `conv` converts an
# array to the framework's type).
BAD_INPUTS: Tuple[Tuple[str, Callable], ...] = (
    ("q is not a tensor (a nested list)", lambda q, k, v, conv: (q.tolist(), conv(k), conv(v))),
    ("q is 3-D (2, n, d)", lambda q, k, v, conv: (conv(np.stack([q, q])), conv(k), conv(v))),
    ("v is 1-D", lambda q, k, v, conv: (conv(q), conv(k), conv(v[:, 0]))),
    ("k has d + 1 columns (q is (n, d))", lambda q, k, v, conv: (conv(q), conv(np.hstack([k, k[:, :1]])),
                                                                 conv(v))),
    ("v has n + 1 rows", lambda q, k, v, conv: (conv(q), conv(k), conv(np.vstack([v, v[:1]])))),
    ("k and v have n + 1 rows, q has n", lambda q, k, v, conv: (conv(q), conv(np.vstack([k, k[:1]])),
                                                                 conv(np.vstack([v, v[:1]])))),
    ("k has another float dtype than q and v", lambda q, k, v, conv: (conv(q), conv(k.astype(
        np.float32 if q.dtype == np.float64 else np.float64)), conv(v))),
)


def validation(call: Callable, conv: Callable, compute_before: Callable, dtype: str) -> List[Finding]:
    """Each bad input must raise an error that names the argument, before any compute (``compute_before(fn)``
    runs ``fn`` and returns (exception or None, the compute ops that ran before it returned or raised))."""
    q, k, v = inputs(dtype)
    findings = []
    for what, make in BAD_INPUTS:
        with warnings.catch_warnings():            # e.g. torch's ".T on a 3-D tensor" deprecation: not ours to show
            warnings.simplefilter("ignore")
            exc, ops = compute_before(lambda: call(*make(q, k, v, conv)))
        if exc is None:
            findings.append(Finding("validation", f"no error for bad input: {what}",
                                    "returned normally" + (f" after computing ({', '.join(ops)})" if ops else "")))
            continue
        message = first_line(exc)
        if ops:
            findings.append(Finding("validation", f"no clear error before compute for bad input: {what}",
                                    f"raised from inside the computation (after {', '.join(ops)}): {message}"))
        elif not re.search(r"(?<![\w.])(q|k|v|query|key|value)(?![\w(])", str(exc)):    # q, k or v as a word
            findings.append(Finding("validation", f"the error for bad input ({what}) does not name the argument",
                                    message))
    if len(findings) < len(BAD_INPUTS):
        return findings
    return [Finding("validation", f"no input validation: none of the contract's {len(BAD_INPUTS)} bad inputs gets "
                                  f"a clear error naming the argument before compute",
                    "; ".join(f"{what}: {f.evidence}" for (what, _), f in zip(BAD_INPUTS, findings)))]


SUBSETS = [(True, False, False), (False, True, False), (False, False, True), (True, True, False),   # q, k, v
           (True, False, True), (False, True, True)]                      # requiring grad, short of all three


def label(requires, verb: str = "requiring grad") -> str:
    return ", ".join(n for n, r in zip(NAMES, requires) if r) + " " + verb


def product_class(shapes) -> Optional[str]:
    """Which product of (9)-(13) a matrix product of these input shapes is: at ``SHAPE`` (n, d, e all different),
    (n, d) x (d, n) is x = q kᵀ, (n, n) x (n, d) a gradient of q or k, (n, n) x (n, e) that of v, and (n, e) x
    (e, n) the G_O Vᴴ term of (9) ("ghat")."""
    mats = [s for s in shapes if len(s) >= 2][-2:]
    if len(mats) != 2:
        return None
    (m, p), r = mats[0][-2:], mats[1][-1]
    n, d, e = SHAPE
    dims = (m, p, r)
    if dims == (n, d, n):
        return "x"
    if p == n and sorted((m, r)) == sorted((n, d)):
        return "qk"
    if p == n and sorted((m, r)) == sorted((n, e)):
        return "v"
    if dims == (n, e, n):
        return "ghat"
    return None


MODES = {(True, True): "o and a used", (True, False): "a unused", (False, True): "o unused"}   # (o, a) used


def per_request(log: Callable, analyse: Callable, verb: str) -> List[Finding]:
    """Run ``log(requires, mode)`` for every request (inputs requiring grad / differentiated x outputs used) and
    ``analyse(record, requires, mode, where, note)`` on each; a request that raises is skipped (the correctness
    rows report it).  The findings gather the evidence of every request."""
    found: Dict[Tuple[str, str], List[str]] = {}

    def note(key: str, title: str, evidence: str):
        found.setdefault((key, title), []).append(evidence)

    requests = [(requires, mode) for requires in [(True, True, True)] + SUBSETS for mode in MODES]
    raised = 0
    for requires, mode in requests:
        try:
            record = log(requires, mode)
        except Exception:                          # noqa: BLE001 - reported by the correctness rows
            raised += 1
            continue
        analyse(record, requires, mode, f"{MODES[mode]}, {label(requires, verb)}", note)
    if raised == len(requests):
        raise Unavailable("the backward raised on every path (see the correctness rows)")
    return [Finding(key, title, evidence(ev)) for (key, title), ev in found.items()]


def evidence(items: Sequence[str], shown: int = 3) -> str:
    items = list(dict.fromkeys(items))
    more = f"; ... ({len(items)} paths in all)" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


def unrequested_products(products: Sequence[Optional[str]], requires) -> List[str]:
    """The matrix products (classes of ``product_class``) of gradients not requested."""
    need_q, need_k, need_v = requires
    extra = []
    qk = products.count("qk")
    if qk > need_q + need_k:
        extra.append(f"{qk} products of the q/k-gradient shape for {need_q + need_k} requested")
    if "v" in products and not need_v:
        extra.append("G_V = Aᴴ G_O")
    if "ghat" in products and not (need_q or need_k):
        extra.append("G_O Vᴴ (read only by the q and k gradients)")
    return extra
