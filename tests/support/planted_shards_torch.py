"""A deliberately wrong torch sharded layout, for tests/test_crosscheck_shards.py (``--torch-layouts
tests/support/planted_shards_torch.py:LAYOUTS``): the keys layout (q replicated, k and v ``Shard(0)``) whose
output o, a ``Partial`` sum over the key blocks (32), is relabelled ``Replicate`` without being reduced, so every
rank keeps only its own key blocks' terms.  ``a`` (``Shard(1)``) and the backward rule stay right, so the forward's o
and every gradient through o disagree, and nothing raises."""

from __future__ import annotations

from torch.distributed.tensor import DTensor, Replicate

from torch_impl import distributed as D


def _keys_unreduced(q, k, v):
    o, a = D.attn(q, k, v)                                          # o: Partial over the key blocks
    o = DTensor.from_local(o.to_local(), o.device_mesh, [Replicate()], run_check=False)   # planted: no reduce
    return o, a


LAYOUTS = {"keys": D.Layout("keys", D.LAYOUTS["keys"].placements, _keys_unreduced)}
