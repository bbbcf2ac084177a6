"""The GPU-static check: every Triton and Pallas kernel variant compiled for A100 / H100 (/ B200) on a machine
without a GPU, with the figures a first GPU run would meet.

``python -m benchmarks.gpu_static`` compiles every variant and configuration (``gpu_static_full.{json,md}``);
``--check`` runs the fast subset (``gpu_static.{json,md}``) and exits non-zero on a regression (a compile / lowering failure, any spill, shared memory over the
arch's per-block limit, no HGMMA on an fp16 / bf16 / tf32 sm_90a kernel).  Needs the ``.venv-gpu`` venv
(``.ci/gpu_static`` builds it): triton with its bundled ``ptxas-blackwell`` / ``cuobjdump``, and for the Pallas
side ``jax-cuda13-plugin`` / ``jax-cuda13-pjrt`` installed ``--no-deps`` (run with ``JAX_PLATFORMS=cpu``).

Modules: ``cubin`` (PTX → cubin → figures: ``analyse_ptx``, ``SHARED_LIMIT``), ``triton_side`` (variants captured
from ``torch_impl.kernels.triton_attn``'s launchers), ``pallas_side`` (optional: ``rows(check: bool) ->
list[dict]``), ``__main__`` (runs both, writes the table).

Row schema (one dict per (kernel variant, config, arch); both sides return rows of this shape, JSON-ready):

=====================  ===========================================================================================
key                    meaning
=====================  ===========================================================================================
``framework``          ``"triton"`` or ``"pallas"``
``entry``              the public entry / launcher that produces it (``"o_only_forward"``, ``"attn_o"`` ...)
``kernel``             the kernel's name (``"_forward_kernel"``, ``"_dkdv_kernel"``, a Pallas kernel name)
``variant``            a short stable text naming the flags, e.g. ``"o_forward causal"``, ``"fused_dkdv GA need-K"``
``flags``              dict of the kernel's flags / constexprs that are not sizes (``CAUSAL``, ``HAS_GA``, ...)
``dtype``              ``"fp16"``, ``"bf16"``, ``"fp32"`` (float32, exact / ieee dots) or ``"tf32"``
``d``, ``e``           head dimensions of q/k and of v
``causal``             bool
``config``             dict ``block_q``, ``block_k``, ``num_warps``, ``num_stages`` (the launch configuration)
``default``            bool: the configuration the launcher picks when autotuning is off
``arch``               ``"sm_80"``, ``"sm_90a"`` or ``"sm_100a"``
``in_check``           bool: part of the ``--check`` subset
``compiled``           bool; ``error``: ``None`` or the error's first line
``registers``          per thread (ptxas)
``spill_store_bytes``  ``spill_load_bytes``, ``stack_bytes``: per thread (ptxas)
``shared_bytes``       dynamic + static shared memory per block; ``shared_limit``: the arch's per-block limit
``mma``                dict op → static count (``HGMMA``, ``HMMA``, ...); ``mufu``: dict op → count (``EX2``,
                       ``RCP``, ``TANH``); ``ffma``: FFMA count
``mufu_per_element``   MUFU operations per score element per loop iteration (``None`` when not defined)
``problems``           list of regression texts (empty: clean); the check fails on any row whose list is
                       non-empty and ``in_check`` (the full run reports them all)
``known``              ``None``, or the reason a row's problems are accepted for now (``triton_side.
                       KNOWN_PROBLEMS``); a known row does not fail the check
``seconds``            compile + assemble time of the row
=====================  ===========================================================================================

Numbers missing for a row that did not compile are ``None``.
"""

#: The keys every row carries (both sides).
ROW_KEYS = ("framework", "entry", "kernel", "variant", "flags", "dtype", "d", "e", "causal", "config", "default",
            "arch", "in_check", "compiled", "error", "registers", "spill_store_bytes", "spill_load_bytes",
            "stack_bytes", "shared_bytes", "shared_limit", "mma", "mufu", "ffma", "mufu_per_element",
            "problems", "seconds", "known")
