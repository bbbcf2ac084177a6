"""``--shards N``: the sharded entries of the whole op as one more candidate, compared with the single-device reference.

A *sharded candidate* is the whole op ``attn`` run sharded over ``N`` ranks / devices and gathered back to full
tensors: a :class:`~crosscheck.specs.Side` that the same ``parts`` run on every path and the same ``compare_case``
compares with the reference's autodiff, in rows that name it.  torch: ``N`` gloo ranks spawned from a fresh
interpreter; JAX: ``N`` host devices in one subprocess.  Every rank / the subprocess builds the cases from the
run's seed, so the numbers are the run's.  Layouts, dtypes, shapes, skips and timeouts: docs/crosscheck.md,
"Sharded entries".

Pieces: ``payload`` (what a child gets and sends back, the candidates' names, the shapes), ``rows`` (the run's
side: :func:`check`, :func:`run_layouts`), ``torch_ranks`` (the torch candidate and its rank worker) and
``jax_devices`` (the JAX candidate and its subprocess).  Importing this package imports neither torch nor JAX:
only the children import ``torch_ranks`` / ``jax_devices``.
"""

from .payload import STUCK_S, TIMEOUT_S, CaseSpec, Payload, candidate, sharded_shapes
from .rows import check, run_layouts

__all__ = ["TIMEOUT_S", "STUCK_S", "sharded_shapes", "candidate", "CaseSpec", "Payload", "run_layouts", "check"]
