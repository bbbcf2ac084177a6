"""The test suite (a package, so test files and tests/support/ import as ``tests.*``: see conftest.py), laid out
like the code:

* ``impl/``: torch_impl and jax_impl themselves (the Function, the operators, OpInfo, formulas, messages);
* ``kernels/``: the Triton and Pallas kernels, ``attn_o``, torch.compile, the GPU-static check, the roofline;
* ``sharded/``: DTensor, the ring and JAX's mesh entries (gloo ranks, host devices);
* ``crosscheck/``: the checker's runs; ``crosscheck/modules/``: one crosscheck module each, the mutation targets'
  test commands (mutation/*.toml);
* ``benchmarks/``, ``repo/`` (README, docs, packaging, import layers), ``upstream/`` (the PR stack);
* ``support/``: what the tests share (inputs, closeness, gloo ranks) and the planted bugs and solutions.
"""
