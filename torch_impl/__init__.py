"""Tanh attention ``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with hand-written gradients (PyTorch side).

    >>> import torch, torch_impl
    >>> o, a = torch_impl.attn(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 4))

Reading order: ``function`` (``AttnFunction`` and ``attn``: one screen), ``formulas`` (the math, cited by
equation number from derivation.md), ``ops`` (the dispatcher operators ``torch.ops.attn_lab.attn`` and
``attn_composite``), ``validation`` (the input contract).  ``performance`` schedules the same formulas to
allocate less; ``internals`` holds the only private PyTorch APIs used, feature-detected.  ``sharded``
(docs/distributed.md), file for file as ``jax_impl.sharded``: ``blocks`` (the block operators
``attn_lab::attn_block`` and its ``_backward``), ``rules`` (their DTensor sharding rules and ``attn`` on
DTensors), ``layouts`` (the layouts by name), ``ring`` (the sequence-parallel ring).  ``kernels``: the fused
Triton kernels and ``attn_o``, the output alone without an n×n tensor (docs/kernels.md).  Importing this package
registers the operators and imports neither JAX nor triton.
"""

import sys as _sys

from . import formulas, ops
from .function import AttnFunction, AttnOutput, attn, attn_reference
from .kernels.o_only import attn_o
from .sharded import blocks as _blocks  # noqa: F401  (registers the block operators)
from .validation import check_inputs

if "torch.distributed.tensor" in _sys.modules:   # DTensor in use: register the sharding rules now (else on the
    from .sharded import rules as _rules  # noqa: F401    # first DTensor call; the import costs seconds)

__all__ = ["AttnFunction", "AttnOutput", "attn", "attn_o", "attn_reference", "check_inputs", "formulas", "ops"]
