"""Tanh attention ``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with hand-written gradients (JAX side).

    >>> import jax.numpy as jnp, jax_impl
    >>> o, a = jax_impl.attn(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 4)))

Pieces: ``formulas`` (the math, cited by equation number from derivation.md, JAX's convention (18)-(22)),
``validation`` (the input contract, same messages as torch_impl), ``output`` (``AttnOutput``), ``core``
(``attn`` = ``jax.custom_vjp``, ``attn_jvp`` = ``jax.custom_jvp``, ``attn_reference`` = the plain composite),
``sharded`` (docs/distributed-jax.md), file for file as ``torch_impl.sharded``: ``blocks`` (the derivative rules
and ``attn_block`` / ``attn_block_jvp`` for local shards), ``rules`` (the rules on ``Explicit`` mesh axes;
``shard_map`` helpers), ``layouts`` (``attn_rows``, ``ring_attn``, ``ring_attn_jvp`` on global arrays over a
mesh: ``from jax_impl.sharded import layouts``), ``ring`` (the ring's body on local shards) and ``kernels``
(fused Pallas kernels: ``attn_o`` / ``attn_o_jvp``, output only, and ``attn_fused``, the lab's op;
docs/kernels-pallas.md).  ``jax_impl.attn_o``, ``jax_impl.attn_o_jvp`` and ``jax_impl.kernels`` are imported on
first use, so ``import jax_impl`` does not import Pallas.  Importing this package does not import torch, and does
not change JAX's configuration (no x64 switch).
"""

from . import formulas
from .core import AttnOutput, attn, attn_jvp, attn_reference
from .sharded.blocks import attn_block, attn_block_jvp
from .validation import check_block_inputs, check_inputs

__all__ = ["AttnOutput", "attn", "attn_jvp", "attn_reference", "check_inputs", "formulas",
           "attn_block", "attn_block_jvp", "check_block_inputs", "attn_o", "attn_o_jvp", "kernels"]


def __getattr__(name):
    # The Pallas kernels, on first use (PEP 562): ``jax_impl.attn_o``, ``jax_impl.attn_o_jvp``, ``jax_impl.kernels``.
    if name in ("attn_o", "attn_o_jvp", "kernels"):
        import importlib

        kernels = importlib.import_module(".kernels", __name__)
        return kernels if name == "kernels" else getattr(kernels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
