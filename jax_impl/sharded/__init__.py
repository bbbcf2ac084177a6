"""Tanh attention sharded over devices (docs/distributed-jax.md): the same four files as ``torch_impl.sharded``.

* ``blocks``: the block (eqs. (32)-(36) of derivation.md, section 15) with its hand-written rules
  (``attn_custom_vjp``, ``attn_custom_jvp``, which ``jax_impl.attn`` / ``attn_jvp`` run too) and ``attn_block`` /
  ``attn_block_jvp`` for local shards inside ``shard_map``;
* ``rules``: the formulas on ``Explicit`` mesh axes (each rule body's result shardings) and the ``shard_map``
  helpers;
* ``layouts``: ``attn_rows``, ``ring_attn``, ``ring_attn_jvp`` on global arrays over a mesh (``LAYOUTS``);
* ``ring``: the ring's body on local shards, ``ring_attn_local`` / ``ring_attn_local_jvp``.

    >>> from jax_impl.sharded import layouts
    >>> o, a = jax.jit(lambda q, k, v: layouts.ring_attn(q, k, v, mesh=mesh))(q, k, v)
"""
