"""``--shards N``: the package ``crosscheck.shards``, under the name the runner imports it by."""

from .shards import STUCK_S, TIMEOUT_S, CaseSpec, Payload, candidate, check, run_layouts, sharded_shapes

__all__ = ["TIMEOUT_S", "STUCK_S", "sharded_shapes", "candidate", "CaseSpec", "Payload", "run_layouts", "check"]
