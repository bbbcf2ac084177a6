"""Tanh attention ``(o, a) = (tanh(q kᵀ) v, tanh(q kᵀ))`` with hand-written gradients (PyTorch side).

    >>> import torch, torch_impl
    >>> o, a = torch_impl.attn(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 4))

Pieces: ``formulas`` (the math, cited by equation number from derivation.md), ``validation`` (the input
contract), ``function`` (``AttnFunction``, ``attn``, ``attn_reference``).  Importing this package does not
import JAX.
"""

from . import formulas
from .function import AttnFunction, AttnOutput, attn, attn_reference
from .validation import check_inputs

__all__ = ["AttnFunction", "AttnOutput", "attn", "attn_reference", "check_inputs", "formulas"]
