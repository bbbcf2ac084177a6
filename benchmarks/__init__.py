"""Benchmarks for tanh attention: time, memory and the GEMM floor of a forward+backward step.

Run ``python -m benchmarks`` from the repository root; ``--quick`` is a
few-second smoke run.  Timings on a shared machine are figures, not assertions: ``tests/benchmarks/test_run.py``
checks the program (every contender runs and agrees with the reference, what the report says, the device
plumbing), never a time.

Pieces: ``harness`` (what every program shares: results and scratch paths, the ``--out`` / ``--update-results``
rule, parser, machine facts, JSON and text files, sample ratios, target tables), ``contenders`` (what is timed:
torch_impl.attn, the reference eager and under torch.compile, the explicit ``torch.ops.attn_lab.attn``, a bare
new-style ``autograd.Function``, JAX custom_vjp and JAX autodiff under jit, the GEMM floor; the composite and the
step builders the other programs use), ``measure`` (interleaved timing, saved-for-backward bytes, allocator peaks,
n×n buffers allocated by backward), ``report`` (stdout table, PNG, markdown), ``run`` (the command line),
``batched`` (the batched cases), ``kernels`` (tanh and tanh_backward timed alone), ``inductor_code`` (what
inductor generates for each compiled contender), ``sharded`` (the sharded case: runs ``distributed`` (torch
DTensor on 4 gloo ranks) and ``distributed_jax`` (JAX on 4 host devices) as subprocesses and folds their results
in; both also run standalone), ``ab`` (a sharded run against another commit's), ``gpu_kernels`` (the fused
Triton and Pallas kernels against their alternatives on one GPU) and ``gpu_static`` (the kernels' compiled code,
read without a GPU).
"""
