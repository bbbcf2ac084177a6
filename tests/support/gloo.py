"""The torch.distributed tests' gloo ranks: a test module's check function run on ``world`` gloo ranks (CPU, one
machine) and every rank's results collected, written once for tests/sharded/test_distributed_torch.py,
tests/sharded/test_ring_second_order.py, tests/sharded/test_rank_losses.py, tests/sharded/test_dtensor_second_order.py and tests/sharded/test_docs.py.

:func:`rank_results` runs ``checks(rank, world)`` (a module-level function of the test module: it reaches the
ranks by pickle) on ``world`` ranks, each in a gloo process group (``pg_timeout_s``: that group's timeout, so a
rank left waiting in a collective fails in seconds instead of hanging), and returns what each rank's call
returned, in rank order.  :func:`launch` is its start-and-wait part for any ``fn(rank, world, port, *args)``.  The
ranks come from ``crosscheck.ranks.run_ranks`` (a forkserver that imported :data:`PRELOAD`, a free port, a
deadline); a deadline passed, or a rank that raised or died, fails the test with the rank's traceback.
"""

from __future__ import annotations

import datetime
import os
import traceback
import warnings
from typing import Callable, List, Optional, Sequence

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from crosscheck.ranks import run_ranks

PRELOAD = ("torch", "torch.distributed.tensor", "torch_impl", "torch_impl.sharded.layouts")


def _result_path(outdir: str, rank: int) -> str:
    return os.path.join(outdir, f"rank{rank}.pt")


def _worker(rank: int, world: int, port: int, checks: Callable, outdir: str, pg_timeout_s: Optional[float]) -> None:
    """One rank: ``checks(rank, world)`` in a gloo process group, its result saved for the test process."""
    timeout = {} if pg_timeout_s is None else {"timeout": datetime.timedelta(seconds=pg_timeout_s)}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **timeout)
    try:
        torch.save(checks(rank, world), _result_path(outdir, rank))
    except BaseException:
        raise RuntimeError(f"rank {rank}: {traceback.format_exc()}")
    finally:
        dist.destroy_process_group()


def launch(fn: Callable, world: int, args: tuple, *, timeout_s: float, preload: Sequence[str] = PRELOAD,
           failed: str = "a rank failed") -> None:
    """``run_ranks(fn, world, args, ...)``; past the deadline, or where a rank raised or died, ``pytest.fail``
    (``failed``, then the rank's traceback).

    Loosened for one case: a rank killed by a signal (no Python exception: the process itself crashed) is launched
    once more, with a warning naming the signal, and fails only if it crashes again.  In the CI matrix's torch 2.11
    entry, rank 0 of tests/sharded/test_rank_losses.py once died of heap corruption inside torch ("malloc():
    unaligned tcache chunk detected", SIGABRT) and passed 6 of 6 reruns on the same wheel; a crash that repeats,
    an exception raised on a rank and a passed deadline still fail the test at once."""
    for attempt in (1, 2):
        try:
            run_ranks(fn, world, args, preload=preload, timeout_s=timeout_s)
            return
        except TimeoutError as exc:
            pytest.fail(str(exc))
        except mp.ProcessExitedException as exc:
            if attempt == 1 and getattr(exc, "signal_name", None):
                warnings.warn(f"{failed}: {exc} (a crash, not an exception): launched once more")
                continue
            pytest.fail(f"{failed}:\n{exc}")
        except mp.ProcessRaisedException as exc:
            pytest.fail(f"{failed}:\n{exc}")


def rank_results(checks: Callable, world: int, outdir, *, timeout_s: float, preload: Sequence[str] = PRELOAD,
                 pg_timeout_s: Optional[float] = None) -> List:
    """``checks(rank, world)`` of every rank of ``world`` gloo ranks, in rank order; see the module docstring."""
    launch(_worker, world, (checks, str(outdir), pg_timeout_s), timeout_s=timeout_s, preload=preload)
    return [torch.load(_result_path(str(outdir), r)) for r in range(world)]
