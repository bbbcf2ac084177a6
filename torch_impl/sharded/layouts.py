"""The torch layouts by name: q, k, v placements on a 1-D mesh and the entry that runs them.

replicate, rows and keys (and q, k, v all ``Shard(0)``, which DTensor redistributes into keys) are one entry,
``rules.attn``: the block operator, whose DTensor sharding rules (``torch_impl.sharded.rules``) read the layout
from the placements.  The ring is its own entry, ``ring.ring_attn`` (``torch_impl.sharded.ring``: P2P, never
gathers).  JAX's layouts are explicit functions instead (``jax_impl.sharded.layouts``: ``attn_rows``,
``ring_attn``), since ``shard_map`` is told its specs; docs/distributed.md compares the two.

    >>> LAYOUTS["rows"].fn(q, k, v)        # q Shard(0), k, v Replicate (DTensors): o, a Shard(0)
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Tuple

from torch.distributed.tensor import Replicate, Shard

from .ring import ring_attn
from .rules import attn

__all__ = ["Layout", "LAYOUTS"]

R, S0 = Replicate(), Shard(0)


class Layout(NamedTuple):
    """Placements of q, k, v on a 1-D mesh and the entry that runs them (``fn(q, k, v) -> (o, a)``, DTensors)."""

    name: str
    placements: Tuple
    fn: Callable


LAYOUTS: Dict[str, Layout] = {
    "replicate": Layout("replicate", (R, R, R), attn),
    "rows": Layout("rows", (S0, R, R), attn),
    "keys": Layout("keys", (R, S0, S0), attn),
    "all_shard0": Layout("all_shard0", (S0, S0, S0), attn),        # DTensor redistributes (all-gathers)
    "ring": Layout("ring", (S0, S0, S0), ring_attn),               # the sequence-parallel ring, P2P only
}
