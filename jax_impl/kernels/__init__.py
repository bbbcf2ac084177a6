"""Fused kernels for tanh attention (JAX side: Pallas), the mirror of ``torch_impl.kernels`` (Triton).

* :func:`attn_o` -- ``o = tanh(q kᵀ [causal mask]) v`` for stacks ``(..., n, d)``, no n×n array forward or
  backward (also exported as ``jax_impl.attn_o``); reverse mode (``jax.custom_vjp``), to any order (the
  derivatives of the kernels' results by autodiff of ``jax_impl.formulas``, n×n memory from the second order on).
* :func:`attn_o_jvp` -- the same ``o`` with forward mode instead (``jax.custom_jvp``: the forward kernel for
  ``o``, a tangent kernel for ``ȯ``, eq. (36); ``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``; also
  ``jax_impl.attn_o_jvp``).
* :class:`LaunchConfig`, :func:`launch_config`, :data:`KERNELS` -- the launch configurations (tiles,
  ``num_warps``, ``num_stages``) per kernel, as data.
* :func:`attn_o_reference` -- the composite ``tanh(q kᵀ [masked]) v`` (n×n), differentiated by JAX: the oracle.
* :func:`attn_fused` -- the lab's op ``AttnOutput(o, a)``, ``a`` written once and read by tiles in the backward;
  reverse mode to any order, as :func:`attn_o`.
* :func:`o_only_forward`, :func:`o_only_backward`, :func:`fused_forward`, :func:`fused_backward` -- the kernel
  drivers, one per ``torch_impl.kernels`` function of the same name; :func:`o_only_jvp` the JVP kernel's.

On a CPU backend the kernels run under Pallas' interpreter (``interpret=True``), see
``jax_impl/kernels/pallas_attn.py`` and docs/kernels-pallas.md.
"""

import jax

# The Pallas API the kernels use (block specs, grid specs, interpret mode as written here) is JAX 0.10's: checked on
# 0.10.2; JAX 0.4.30 (the floor of jax_impl itself) fails inside pallas_call.  Refused at import, in one line.
MIN_JAX = (0, 10)
if tuple(int(p) for p in jax.__version__.split(".")[:2]) < MIN_JAX:
    raise ImportError(f"jax_impl.kernels (attn_o, attn_o_jvp, attn_fused) needs JAX >= "
                      f"{'.'.join(map(str, MIN_JAX))} for its Pallas kernels; this is JAX {jax.__version__} "
                      f"(jax_impl.attn and the sharded entries work on it)")

from .pallas_attn import (APPROX_TANH_REL_ERROR, KERNEL_DTYPES, KERNEL_MESSAGES, KERNELS, LaunchConfig, attn_fused,
                          attn_o, attn_o_jvp, attn_o_reference, check_stack_inputs, launch_config, default_interpret,
                          fused_backward, fused_forward, o_only_backward, o_only_forward, o_only_jvp)

__all__ = ["MIN_JAX", "attn_o", "attn_o_jvp", "attn_o_reference", "attn_fused", "o_only_forward", "o_only_backward", "o_only_jvp",
           "fused_forward", "fused_backward",
           "check_stack_inputs", "default_interpret", "KERNEL_DTYPES", "KERNEL_MESSAGES", "LaunchConfig", "KERNELS",
           "launch_config", "APPROX_TANH_REL_ERROR"]
