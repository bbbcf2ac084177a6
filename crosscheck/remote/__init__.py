"""A check run in another process — ``--shards`` (gloo ranks, JAX host devices) and ``--kernels`` (Triton under
``TRITON_INTERPRET=1``), which must set the environment before torch / JAX / triton load — in three steps, the same
for both:

* :func:`process.run_child` (in the run) pickles a payload into a temporary folder, runs ``entry(*args,
  payload_path, out_path)`` in ``sys.executable`` from the repository root with this package first on
  ``PYTHONPATH`` (``entry``: a module-level function, imported in the child by its ``__module__`` and
  ``__name__``), and returns the pickle the child wrote.  A child past ``timeout`` seconds, one that exits non-zero
  or writes nothing, is a ``UsageError`` naming ``what`` with the last lines it printed;
* :func:`process.run_job` (in the child) runs one case's job into a ``parts.Outcome``: the results, or the error;
* :func:`outcome.compare_outcome` (back in the run) compares an outcome as any side's results are compared.

``process`` stands below the comparison in the import graph (it imports no comparison module), ``outcome`` above
it; this ``__init__`` imports neither.  (A child still runs the ``crosscheck`` package's ``__init__``, as any import
of a crosscheck module does.)
"""
