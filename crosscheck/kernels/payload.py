"""What a ``--kernels`` child gets (``crosscheck.kernels``): the :class:`Payload` (its framework, the run's seed and
device, each of the framework's candidates' cases) and how a case is rebuilt from it (:func:`job`).  Its results are ``{"results": {kind:
[one parts.Outcome per case]}, "interpret": bool}``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..cases import Case, Job
from ..specs import SPECS

__all__ = ["CaseSpec", "Payload", "job"]

# (op, dtype, shape, trial, all_paths, do_jacrev): what the subprocess needs to rebuild a case (with the run's seed)
CaseSpec = Tuple[str, str, Tuple[int, int, int], int, bool, bool]



@dataclass(frozen=True)
class Payload:
    """What a child gets (pickled by ``run_child``): its framework, the run's seed and device, each candidate's cases."""

    fw: str
    seed: int                                           # the run's: the cases' numbers are the run's
    device: str
    cases: Dict[str, List[CaseSpec]]                    # {candidate kind: its cases}



def job(side, seed: int, cs: CaseSpec) -> Job:
    """The job of ``side`` on the case ``cs`` of the run (``seed``: the run's)."""
    op, dtype, shape, trial, paths, jacrev = cs
    spec = SPECS[op]
    return Job(side, spec, Case(spec, dtype, tuple(shape), trial, seed, paths), dtype, jacrev)

