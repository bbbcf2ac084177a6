"""Tanh attention sharded over devices (docs/distributed.md): the same four files as ``jax_impl.sharded``.

* ``blocks``: the block operators ``attn_lab::attn_block`` and ``attn_lab::attn_block_backward`` (eqs. (32)-(35)
  of derivation.md, section 15), what every layout runs on each rank's shards;
* ``rules``: their DTensor sharding rules (replicate, rows, keys), ``register_rules`` (the one hook registering
  them) and ``attn``, the lab's op on DTensors;
* ``layouts``: the layouts by name (``LAYOUTS``: placements and entry);
* ``ring``: the sequence-parallel ring, ``ring_attn`` on ``Shard(0)`` DTensors and ``ring_attn_local`` on local
  shards (P2P, never gathers).

``import torch_impl`` imports ``blocks`` (it registers the operators; no ``torch.distributed``), and ``rules``
when ``torch.distributed.tensor`` is already imported (else the first DTensor call does: importing it costs
seconds).  ``rules``, ``layouts`` and ``ring`` import ``torch.distributed.tensor``; import them by name::

    from torch_impl.sharded.ring import ring_attn, ring_attn_local
"""
