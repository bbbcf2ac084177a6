"""What runs each framework, beside its words in ``frameworks``: the executor of its jobs (eager torch, or JAX's
compiled programs), its review's items, and its child processes of ``--shards`` and (where its kernels must run
in a fresh interpreter) ``--kernels``.

These pieces import ``parts``, ``review.common`` and ``specs``, which import ``frameworks``; held there, they would
close an import circle, so they stand here, above the modules they name, each reached by a function that imports it
on first use (JAX only when its side runs).  This module and ``frameworks`` are the only ones keyed by a
framework's name (``tests/crosscheck/test_shape.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

__all__ = ["Driver", "get"]


@dataclass(frozen=True)
class Driver:
    executor: Callable[[str], object]          # device -> what runs its jobs: prefetch(job), run(job), close()
    review_items: Callable[[], Tuple]          # its review: ((name, item(fn, dtype) -> findings), ...)
    shards_main: Callable[[str, str], None]    # the --shards child: main(payload_path, out_path), run there
    # the --kernels child, or None: the candidates run in the run's own executor
    kernels_main: Optional[Callable[[str, str], None]]
    kernels_env: Callable[[str], Dict[str, Optional[str]]]     # device -> that child's variables (None: unset)
    kernel_side: Callable[..., object]         # (candidate, op, device) -> its Side, where it runs


def _torch_executor(device: str):
    from .parts import EagerExecutor
    return EagerExecutor("torch", device)


def _jax_executor(device: str):
    from .jax_executor import JaxExecutor
    return JaxExecutor("jax", device)


def _torch_review() -> Tuple:
    from .review.torch import ITEMS
    return ITEMS


def _jax_review() -> Tuple:
    from .review.jax import ITEMS
    return ITEMS


def torch_shards_child(payload_path: str, out_path: str) -> None:
    """The torch ``--shards`` child: imported by ``remote.process.run_child`` in the fresh interpreter, so the run
    itself never imports ``shards.torch_ranks`` (torch.distributed, DTensor)."""
    from .shards.torch_ranks import main
    main(payload_path, out_path)


def jax_shards_child(payload_path: str, out_path: str) -> None:
    """The JAX ``--shards`` child (``shards.jax_devices``, JAX on N host devices), likewise run only there."""
    from .shards.jax_devices import main
    main(payload_path, out_path)


def torch_kernels_child(payload_path: str, out_path: str) -> None:
    """The torch ``--kernels`` child (``kernels.torch_triton``): apart because triton reads ``TRITON_INTERPRET``
    when it is imported, and routing CPU tensors to the kernels is process state."""
    from .kernels.torch_triton import main
    main(payload_path, out_path)


def _torch_kernel_side(cand, op: str, device: str):
    from .kernels.candidates import torch_side
    return torch_side(cand, op, device)


def _jax_kernel_side(cand, op: str, device: str):
    from .kernels.candidates import jax_side
    return jax_side(cand, op, device)


def _triton_env(device: str) -> Dict[str, Optional[str]]:
    return {"TRITON_INTERPRET": "1" if device == "cpu" else None}       # interpreted on the CPU, compiled on a GPU


def _no_env(device: str) -> Dict[str, Optional[str]]:
    return {}


BY_NAME: Dict[str, Driver] = {
    "torch": Driver(executor=_torch_executor, review_items=_torch_review, shards_main=torch_shards_child,
                    kernels_main=torch_kernels_child, kernels_env=_triton_env, kernel_side=_torch_kernel_side),
    "jax": Driver(executor=_jax_executor, review_items=_jax_review, shards_main=jax_shards_child,
                  kernels_main=None, kernels_env=_no_env, kernel_side=_jax_kernel_side),
}


def get(name: str) -> Driver:
    return BY_NAME[name]
