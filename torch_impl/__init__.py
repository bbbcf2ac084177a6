"""Tanh attention ``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with hand-written gradients (PyTorch side).

    >>> import torch, torch_impl
    >>> o, a = torch_impl.attn(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 4))

Pieces: ``formulas`` (the math, cited by equation number from derivation.md), ``validation`` (the input
contract), ``function`` (``AttnFunction``, its vmap rule's ``BatchedAttnFunction``, ``attn``, ``attn_reference``), ``ops`` (the dispatcher operators
``torch.ops.attn_lab.attn`` and ``torch.ops.attn_lab.attn_composite``).  Importing this package does not
import JAX.
"""

from . import formulas, ops  # ops: registers torch.ops.attn_lab.{attn, attn_composite} (re-import safe)
from .function import AttnFunction, AttnOutput, BatchedAttnFunction, attn, attn_reference
from .validation import check_inputs

__all__ = ["AttnFunction", "AttnOutput", "BatchedAttnFunction", "attn", "attn_reference", "check_inputs", "formulas", "ops"]
