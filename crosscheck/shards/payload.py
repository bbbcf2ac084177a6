"""What a ``--shards`` child needs and what it sends back: the :class:`Payload` (the run's seed, the world size, the
cases, the timeout, the layouts asked for), the candidates' names and the cases' shapes, and the results' form.

A child's results are ``{layout: [one parts.Outcome per case]}``: the executor's results of the case, or the error
that left nothing of it to compare; torch adds the in-place probe's outcome and how the ranks ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..cases import Case, Job
from ..frameworks import BY_NAME, get
from ..impls import resolve
from ..specs import SPECS

__all__ = ["TIMEOUT_S", "STUCK_S", "UNITS", "CaseSpec", "Payload", "sharded_shapes", "candidate", "raised", "rank_outcome", "disagreement"]

TIMEOUT_S = 600                                         # one spawn / subprocess, all layouts and cases
STUCK_S = 30                                            # one collective of a request (tiny tensors)
UNITS = {name: fw.units for name, fw in BY_NAME.items()}    # what the entries run on (``Framework.units``)

# (dtype, shape, trial, all_paths, do_jacrev): what a worker needs to rebuild a case (with the run's seed)
CaseSpec = Tuple[str, Tuple[int, int, int], int, bool, bool]


@dataclass(frozen=True)
class Payload:
    """What a child gets (pickled by ``run_child``): every case of the run, to run on every layout."""

    seed: int                                           # the run's: the cases' numbers are the run's
    world: int                                          # gloo ranks / JAX host devices
    cases: Tuple[CaseSpec, ...]
    timeout: float                                      # the whole child, every layout and case
    layouts: str = ""                                   # MODULE:ATTR of the layouts to check; "" = the project's

    def job(self, side, cs: CaseSpec) -> Job:
        """The job of ``side`` on the case ``cs`` of the run."""
        dtype, shape, trial, all_paths, do_jacrev = cs
        spec = SPECS["attn"]
        return Job(side, spec, Case(spec, dtype, tuple(shape), trial, self.seed, all_paths), dtype, do_jacrev)

    def named_layouts(self, option: str) -> Optional[Dict[str, object]]:
        """The dict of layouts named by ``layouts`` (``MODULE:ATTR``: a module or a .py file), or None for ``""``
        (``option``: the command-line option that named them, for its error message)."""
        return dict(resolve(self.layouts, option)) if self.layouts else None


def sharded_shapes(world: int) -> Tuple[List, List]:
    """``(shapes, path shapes)`` on ``world`` ranks / devices: n = world + 1 (uneven shards; every path), n = 2 world
    (even shards), n = 1 (fewer rows than ranks: empty shards) and n = 0."""
    shapes = [(world + 1, 3, 2), (2 * world, 2, 3), (1, 2, 2), (0, 2, 3)]
    return shapes, shapes[:1]


def candidate(fw: str, layout: str, world: int) -> str:
    """The candidate's name in oracle labels: ``"torch sharded rows on 2 ranks"``."""
    return f"{fw} sharded {layout} on {world} {get(fw).units}"


def raised(outcome) -> bool:
    """Whether an in-place probe's outcome for one output is ``("raised", message)``."""
    return isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[0], str) and outcome[0] == "raised"


def rank_outcome(broken: Optional[str], inplace) -> Tuple[Optional[str], Optional[tuple]]:
    """What every rank must agree on of a case: how its candidate broke (``None``: it did not) and, of its in-place
    probe, which writes raised and with what (``None``: no probe ran; ``("error", text)``: the probe raised)."""
    if inplace is None or "error" in inplace:
        return broken, None if inplace is None else ("error", inplace["error"])
    return broken, tuple((k, v[1] if raised(v) else "gradients") for k, v in sorted(inplace.items()))


def disagreement(every: list) -> str:
    """How the first rank whose ``rank_outcome`` differs from rank 0's ended, against rank 0, or ``""``."""
    odd = [(r, o) for r, o in enumerate(every) if o != every[0]]
    if not odd:
        return ""
    r, (broken, inplace) = odd[0]
    if broken != every[0][0]:
        return f"rank {r} raised {broken} while rank 0 {'raised ' + every[0][0] if every[0][0] else 'did not'}"
    return f"the in-place probe ended differently on rank {r} ({inplace}) and rank 0 ({every[0][1]})"
