"""The review of a user's implementation against what the lab asks of it, beyond right numbers: findings with
their evidence, reported apart from the correctness verdict (advice; ``--strict`` makes them fail the run).

PyTorch (public tools only): ``torch.profiler`` logs the aten ops a backward runs, with their input shapes;
``torch.autograd.graph.saved_tensors_hooks`` sees what is saved for backward; a hook on the output's
``grad_fn`` node (``Node.register_hook``) sees the gradients backward returns.  The review runs at one shape
with n, d, e all different (``SHAPE``), so the shapes of a matrix product tell its operands apart:

* (n, d) x (d, n) -> (n, n) is x = q kᵀ recomputed; (n, n) x (n, d) a gradient of q or k (10)-(12);
  (n, n) x (n, e) the gradient of v (13); (n, e) x (e, n) the term G_O Vᴴ of (9), needed only for q and k.

Items: input validation (the contract's bad inputs: is a clear error, naming the argument, raised before any
compute?), what is saved (n x n tensors other than ``a``; inputs no requested gradient needs; tensors kept as
ctx attributes), recomputation in the first-order backward (tanh, cosh, q kᵀ), zeros materialised for an unused
output, gradients returned or computed for inputs that do not require grad, ``a`` non-differentiable, and a
backward that cannot be differentiated again.  JAX: input validation, ``symbolic_zeros`` (without it the bwd
rule gets dense zeros for an unused output and cannot see ``perturbed``), and recomputation in the bwd rule
(from the pullback's jaxpr).  An item that cannot run on this version is listed as unavailable, never guessed.
"""

from __future__ import annotations

from typing import Callable

from .common import BAD_INPUTS, KEYS, SHAPE, Finding, Review, Unavailable

__all__ = ["Finding", "Review", "review", "SHAPE", "BAD_INPUTS", "KEYS"]


def review(framework: str, fn: Callable, impl: str, dtype: str = "float64") -> Review:
    """Review ``fn`` (attn(q, k, v) -> (o, a)) of ``framework`` on CPU inputs of ``dtype`` (a real dtype it
    accepts); never raises for a problem of ``fn``."""
    result = Review(framework, impl)
    from importlib import import_module
    items = import_module(f".{framework}", __name__).ITEMS
    for name, item in items:
        try:
            result.findings += item(fn, dtype)
        except Unavailable as e:
            result.unavailable.append(f"{name}: {e}")
        except Exception as e:                     # noqa: BLE001 - the correctness rows report a crash
            result.unavailable.append(f"{name}: could not run ({type(e).__name__}: "
                                      f"{(str(e).strip().splitlines() or [''])[0]})")
    return result
