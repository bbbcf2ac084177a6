"""``--kernels``: the fused Triton and Pallas kernels as more candidates, compared with autodiff of the reference.

A *kernel candidate* is an entry of the project running on its fused kernels, as a
:class:`~crosscheck.specs.Side` named in oracle labels by :attr:`Candidate.name` (``"torch triton fused
(interpreted)"``), run by the same ``parts`` on every path and compared by the same ``compare_case`` as every
other side (the pattern of ``--shards``, ``crosscheck.shards``: one package shape, one out-of-process pattern,
``crosscheck.remote``):

* ``torch triton fused``: ``torch_impl.attn`` with the kernels routed (``AttnFunction`` runs the operators
  ``attn_lab::fused_forward`` / ``fused_backward``), on op ``attn``; its JVP and second order run
  ``formulas`` as ``torch_impl.attn`` does (the kernels are not differentiable; a backward with
  ``create_graph=True`` runs the differentiable formulas).
* ``torch triton o-only``: ``torch_impl.attn_o`` on the Triton kernels (forward and backward), on ops ``attn_o``
  and ``attn_o_causal``; JVP and second order by its ATen blocks, as the entry does.
* ``jax pallas fused``: ``jax_impl.kernels.attn_fused`` (``jax.custom_vjp``), on op ``attn``: no forward mode, so
  its JVP rows are skipped with that reason.
* ``jax pallas o-only``: ``jax_impl.attn_o`` (VJP) and ``attn_o_jvp`` (JVP), on ``attn_o`` / ``attn_o_causal``.

A JAX candidate's second order is checked where JAX can differentiate its backward; where it cannot, its
second-order rows are skipped with the error JAX raises (:func:`crosscheck.specs.second_order_refusal`; the rows:
:func:`crosscheck.compare.second_order_skips`).

Every candidate runs with tiles of ``TILE`` rows on ``KERNEL_SHAPES`` (n not a multiple of the tile, a multiple,
n = 1, d ≠ e; every path on the first), in the kernels' dtypes among the run's (``TORCH_DTYPES``,
``JAX_DTYPES``).  **How they run**: on ``--device cpu`` interpreted — Triton under ``TRITON_INTERPRET=1``, Pallas
with ``interpret=True`` — and on ``--device cuda`` compiled.  The torch candidates always run in a subprocess
(``TRITON_INTERPRET`` must be set before triton is imported; CPU tensors are routed to the kernels with
``torch_impl.kernels.kernel_devices``); the JAX candidates run in the run's own JAX executor.  Without
``--kernels`` none of this runs, and the ops ``attn_o`` / ``attn_o_causal`` (``specs.KERNEL_OPS``) are left
out: :func:`describe` says so.  docs/crosscheck.md, "Kernels".

Pieces: ``candidates`` (the candidates, their sides, which a run selects, :func:`describe`, :func:`unavailable`),
``payload`` (what the torch child gets), ``torch_triton`` (the torch child), ``rows`` (the run's side: :func:`check`).
"""

from .candidates import (CANDIDATES, JAX_DTYPES, SETUP_ENV, TILE, TIMEOUT_S, TORCH_DTYPES, Candidate, describe, how,
                         jax_side, selected, torch_side, unavailable)
from .payload import CaseSpec, Payload
from .rows import check, run_apart

# KERNEL_SHAPES / PATH_SHAPES stay in ``candidates`` alone: the run reads them there (a test sets them there).
__all__ = ["unavailable", "TILE", "TORCH_DTYPES", "JAX_DTYPES", "SETUP_ENV", "TIMEOUT_S", "Candidate",
           "CANDIDATES", "how", "selected", "describe", "torch_side", "jax_side", "CaseSpec", "Payload", "check",
           "run_apart"]
