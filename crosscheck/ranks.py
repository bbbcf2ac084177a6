"""gloo ranks on one machine, with a deadline: how ``--shards``, the torch.distributed tests and
``benchmarks/distributed.py`` start theirs.

``run_ranks(fn, world, args, preload, timeout_s)`` calls ``fn(rank, world, port, *args)`` in ``world`` processes
of a forkserver (it imports the ``preload`` modules once, so each rank does not pay torch's import), on a free
local port, and waits for them.  Past the deadline it raises ``TimeoutError``; a rank that raises or dies makes
torch's ``ProcessRaisedException`` / ``ProcessExitedException`` propagate, with the rank's traceback.  Ranks still
running when it returns or raises are terminated.
"""

from __future__ import annotations

import socket
import time
from typing import Callable, Sequence

__all__ = ["free_port", "run_ranks"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for ``init_method=f"tcp://127.0.0.1:{port}"``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn: Callable, world: int, args: tuple, preload: Sequence[str], timeout_s: float) -> None:
    """``fn(rank, world, port, *args)`` on ``world`` forkserver processes; see the module docstring."""
    import torch.multiprocessing as mp
    mp.get_context("forkserver").set_forkserver_preload(list(preload))
    ctx = mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=False,
                             start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} gloo ranks did not finish in {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
