"""What runs each framework, beside its words in ``frameworks``: the executor of its jobs (eager torch, or JAX's
compiled programs), its review's items, and the child process of ``--shards``.

These pieces import ``parts``, ``review.common`` and ``specs``, which import ``frameworks``; held there, they would
close an import circle, so they stand here, above the modules they name, each reached by a function that imports it
on first use (JAX only when its side runs).  This module and ``frameworks`` are the only ones keyed by a
framework's name (``tests/crosscheck/test_shape.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple

__all__ = ["Driver", "get"]


@dataclass(frozen=True)
class Driver:
    executor: Callable[[str], object]          # device -> what runs its jobs: prefetch(job), run(job), close()
    review_items: Callable[[], Tuple]          # its review: ((name, item(fn, dtype) -> findings), ...)
    shards_main: Callable[[str, str], None]    # the --shards child: main(payload_path, out_path), run there


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


BY_NAME: Dict[str, Driver] = {
    "torch": Driver(executor=_torch_executor, review_items=_torch_review, shards_main=torch_shards_child),
    "jax": Driver(executor=_jax_executor, review_items=_jax_review, shards_main=jax_shards_child),
}


def get(name: str) -> Driver:
    return BY_NAME[name]
