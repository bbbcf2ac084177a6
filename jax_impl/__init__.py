"""Tanh attention ``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with hand-written gradients (JAX side).

    >>> import jax.numpy as jnp, jax_impl
    >>> o, a = jax_impl.attn(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 4)))

Pieces: ``formulas`` (the math, cited by equation number from derivation.md, JAX's convention (18)-(22)),
``validation`` (the input contract, same messages as torch_impl), ``core`` (``attn`` = ``jax.custom_vjp``,
``attn_jvp`` = ``jax.custom_jvp``, ``attn_reference`` = the plain composite).  Importing this package does not
import torch, and does not change JAX's configuration (no x64 switch).
"""

from . import formulas
from .core import AttnOutput, attn, attn_block, attn_block_jvp, attn_jvp, attn_reference
from .validation import check_block_inputs, check_inputs

__all__ = ["AttnOutput", "attn", "attn_jvp", "attn_reference", "check_inputs", "formulas",
           "attn_block", "attn_block_jvp", "check_block_inputs"]
