"""Back in the run: a case's outcome from a child (``crosscheck.remote``) compared as every side's results are."""

from __future__ import annotations

from ..cases import Case
from ..compare import case_info, compare_case, own_oracle
from ..oracles import Kind, Party
from ..parts import Failed, Outcome
from ..specs import OpSpec, Side

__all__ = ["compare_outcome"]


def compare_outcome(col, spec: OpSpec, fw: str, side: Side, case: Case, dtype: str, shape: tuple, trial: int,
                    size: int, outcome: Outcome) -> bool:
    """Back in the run: the rows of one case of the candidate ``side`` (of framework ``fw``) from its ``outcome`` —
    compared by ``compare_case`` as every side is (``size``: the case's jacrev size), or, where the child sent an
    error, one failing row saying nothing of the case could be compared.  True when there were results."""
    if outcome.error is not None:                      # nothing of this case could be compared
        col.compare(spec, case_info(spec, dtype, shape, trial),
                    own_oracle(fw, Kind.FORWARD, "impl", Party(fw, "reference"), side.candidate),
                    Failed.from_error(outcome.error), None, (), spec.outputs)
        return False
    compare_case(col, spec, {fw: side}, case, dtype, shape, trial, {fw: outcome.results}, size)
    return True
