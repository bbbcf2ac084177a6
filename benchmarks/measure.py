"""How things are measured.

Time: every (contender, mode) step of one case is warmed up, then timed in repetitions (torch contenders and the
floors in one group, JAX in another, see ``run.run_case``): one repetition runs each
step once (``inner`` calls, so that a sample lasts a few milliseconds even at n=2), in a fresh seeded random
order at each repetition (``repetition_orders``), so neither slow drifts of this shared machine's load nor the
after-effects of the step before fall on one contender.  (A fixed cyclic order, rotated by one at each repetition,
keeps every step's predecessor: at n=2 the step after a GEMM-floor step ran 10-15 % slower in every repetition,
which made ``attn`` / bare Function 1.11-1.19 in that order and 0.96-0.98 shuffled.)  Ratios are taken *within*
a repetition (paired) and summarised by their median and inter-quartile range.

Memory (torch contenders): the CPU allocator's own accounting, read from ``torch.profiler`` with
``profile_memory=True``: every allocation and free made by any op (eager ATen, the autograd engine, inductor's
generated code) is an ``Allocation`` event carrying its size (negative for a free).  Hence

* peak of a fwd+bwd step = max over the step of the running sum of its allocation sizes (frees are negative):
  bytes above what was live before it (outputs, saved tensors, temporaries, gradients; not the inputs);
* new n×n buffers in backward = allocation events of at least n²·itemsize bytes inside the
  ``bench::backward`` range (only meaningful when n > max(d, e), otherwise an (n, d) buffer is as big);
* bytes saved for backward = unique storages packed by ``torch.autograd.graph.saved_tensors_hooks`` during the
  forward, each tagged with the input/output it aliases (aliases cost nothing extra: the caller holds them).

``tracemalloc`` cannot see torch's allocations and process RSS is blurred by glibc and the page cache, hence
the profiler.  On CUDA the peak is ``torch.cuda.max_memory_allocated`` (``peak_bytes_cuda``, what the report
shows there), and the profiler's events are filtered to the CUDA device (``peak_bytes``, n×n buffer counts), so
host-side allocations never mix into a GPU figure.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from crosscheck.metrics import diff

from .contenders import Case, torch_inputs, to_numpy_grads

try:  # private but stable since torch 2.0: the profiler's event tree with allocation fields
    from torch._C._profiler import _EventType
except ImportError:  # pragma: no cover
    _EventType = None


# --------------------------------------------------------------------------------------------- time

def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_first_call(step: Callable, device: str = "cpu"):
    """``(result, seconds)`` of one call of ``step``, synchronized on both sides on CUDA: kernels queued before
    it are not billed to it, and its own asynchronous kernels are (compile time = first call minus a warm one)."""
    _sync(device)
    t0 = time.perf_counter()
    result = step()
    _sync(device)
    return result, time.perf_counter() - t0


def repetition_orders(keys, reps: int, seed: int = 0):
    """One order of ``keys`` per repetition, each a fresh permutation from a seeded generator: the same orders
    in every process given the same keys (ranks of a distributed benchmark must agree on them)."""
    rng = random.Random(seed)
    for _ in range(reps):
        order = list(keys)
        rng.shuffle(order)
        yield order


def time_steps(steps: Dict[Tuple[str, str], Callable], *, budget_s: float, min_reps: int, max_reps: int,
               sample_s: float, device: str = "cpu", pause_s: float = 0.002) -> dict:
    """Warm up every step (each must have been called once already), pick ``inner`` per step and the number
    of repetitions from ``budget_s``, then time each step once a repetition, in ``repetition_orders``.  Returns
    ``{"reps", "inner": {key: int}, "samples": {key: [seconds per call, ...]}}``."""
    keys = list(steps)
    est = {}
    for key in keys:   # warm-up (the caller already ran each step once): timed estimate calls, 1 if slow
        ts = []
        while len(ts) < 3 and sum(ts) < 0.05:
            t0 = time.perf_counter()
            steps[key]()
            _sync(device)
            ts.append(time.perf_counter() - t0)
        est[key] = max(min(ts), 1e-7)
    inner = {key: max(1, int(round(sample_s / est[key]))) for key in keys}
    round_s = sum(inner[key] * est[key] for key in keys)
    reps = int(min(max_reps, max(min_reps, budget_s // max(round_s, 1e-9))))
    samples: Dict[Tuple[str, str], List[float]] = {key: [] for key in keys}
    gc_was = gc.isenabled()
    gc.disable()
    t_start = time.perf_counter()
    try:
        for r, order in enumerate(repetition_orders(keys, reps)):
            if r >= min_reps and time.perf_counter() - t_start > 1.5 * budget_s:
                break   # the load rose since the estimate: stop at the budget (every key has r samples)
            for key in order:
                step, m = steps[key], inner[key]
                time.sleep(pause_s)   # let the previous contender's spinning worker threads (OpenMP, XLA) go idle
                t0 = time.perf_counter()
                for _ in range(m):
                    step()
                _sync(device)
                samples[key].append((time.perf_counter() - t0) / m)
            gc.collect(0)   # youngest generation only: a full collection costs ~0.2 s with torch+jax loaded
    finally:
        if gc_was:
            gc.enable()
    return {"reps": len(samples[keys[0]]), "inner": inner, "samples": samples}


@dataclass
class Timing:
    """The ``time_steps`` arguments one program (or one phase of it) times with."""
    budget_s: float
    min_reps: int
    max_reps: int
    sample_s: float
    pause_s: float = 0.002

    def time(self, steps: Dict[Tuple[str, str], Callable], device: str, budget_s: Optional[float] = None) -> dict:
        """``time_steps(steps)`` with these arguments (``budget_s`` in place of this budget where given)."""
        return time_steps(steps, budget_s=self.budget_s if budget_s is None else budget_s, min_reps=self.min_reps,
                          max_reps=self.max_reps, sample_s=self.sample_s, device=device, pause_s=self.pause_s)


def fresh_buffer_cost(nbytes: int, device: str = "cpu", reps: int = 3) -> dict:
    """What one fresh buffer of ``nbytes`` costs in this process as it is now: seconds to allocate it and fill
    it once, against filling an existing one (best of ``reps``).

    On Linux/glibc a buffer of 32 MiB or more is normally mmapped afresh and page-faults on every first write
    (``fresh`` several times ``reused``: *cold*); once the heap holds free chunks that large, as it may late in
    a long run, it is served from there without faults (``fresh`` ≈ ``reused``: *warm*).  The speed-ups that
    come from allocating fewer n×n buffers (``attn`` at n=4096, ``vmap(attn)`` at 8 × 1024) exist only in the
    cold state, so each case records which state it was timed in.  CPU only (CUDA's caching allocator)."""
    if not device.startswith("cpu") or nbytes <= 0:
        return {}
    existing = torch.empty(nbytes, dtype=torch.uint8)
    fresh, reused = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.empty(nbytes, dtype=torch.uint8).fill_(1)
        fresh.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        existing.fill_(1)
        reused.append(time.perf_counter() - t0)
    return {"bytes": int(nbytes), "fresh_s": min(fresh), "reused_s": min(reused)}


def relative_error(result, reference) -> float:
    """max over dq, dk, dv of ‖g − g_ref‖ / ‖g_ref‖ (``None`` = zero gradient): the project's one relative error,
    ``crosscheck.metrics.diff`` (its norm floor for a zero reference; NaN/Inf or a wrong shape is ``inf``)."""
    errors = [diff(g, r).rel_err for g, r in zip(to_numpy_grads(result), to_numpy_grads(reference))
              if g is not None or r is not None]
    return max(errors, default=0.0)


# --------------------------------------------------------------------------------------------- memory

def saved_for_backward(fn: Callable, case: Case, device: str = "cpu") -> dict:
    """Storages packed for backward during one forward, unique by storage, tagged by what they alias."""
    q, k, v, _, _ = torch_inputs(case, device=device)
    packed: List[torch.Tensor] = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, a = fn(q, k, v)
    names = {}
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("a", a)):
        names.setdefault(t.untyped_storage().data_ptr(), name)
    seen, tensors, total, new = set(), [], 0, 0
    for t in packed:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        alias = names.get(ptr, "new")
        nbytes = int(st.nbytes())
        total += nbytes
        new += 0 if alias != "new" else nbytes
        tensors.append({"shape": list(t.shape), "aliases": alias, "bytes": nbytes})
    return {"bytes": total, "bytes_not_aliasing_io": new, "tensors": tensors, "n_packed": len(packed)}


# Lines kineto writes straight to file descriptor 2 at every profiler start/stop (``USDT: ... profiler_start``,
# ``STAGE: ...``): dozens per run, no information.  Only they are dropped; anything else is passed through.
_PROFILER_NOISE = ("USDT:", "STAGE:")


@contextlib.contextmanager
def _quiet_profiler_noise():
    """Capture fd 2 for the duration and write back every line except kineto's start/stop chatter (it comes
    from C++, so ``sys.stderr`` redirection cannot catch it; raising the kineto log level would hide its errors
    too)."""
    fd = 2   # kineto writes to the descriptor, whatever sys.stderr is now
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(_PROFILER_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _walk(events):
    for e in events:
        yield e
        yield from _walk(e.children)


def _enclosing(e, names):
    p = e.parent
    while p is not None:
        if p.name in names:
            return p.name
        p = p.parent
    return None


def _allocations(prof, device=None) -> list:
    """A profiled run's allocator events in time order (a free's size negative); only ``device``'s where given."""
    tree = prof.profiler.kineto_results.experimental_event_tree()
    return sorted((e for e in _walk(tree) if e.tag == _EventType.Allocation
                   and (device is None or getattr(e.extra_fields, "device", device) == device)),
                  key=lambda e: e.start_time_ns)


def profiled_peak(step: Callable) -> int:
    """CPU allocator peak of one ``step`` above what was live before it (running sum of its allocation events)."""
    with _quiet_profiler_noise(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        res = step()
    del res
    live = peak = 0
    for e in _allocations(prof):
        live += int(e.extra_fields.alloc_size)
        peak = max(peak, live)
    return peak


def cuda_peak(step: Callable) -> int:
    """Bytes the CUDA allocator held at the peak of one ``step`` above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return int(peak)


def _op_of(e):
    p = e.parent
    while p is not None and p.tag != _EventType.TorchOp:
        p = p.parent
    return p.name if p is not None else "?"


def step_memory(fn: Callable, case: Case, mode: str, device: str = "cpu") -> dict:
    """Allocator peak of one fwd+bwd step, and the big buffers allocated in forward and in backward."""
    q, k, v, go, ga = torch_inputs(case, device=device)
    outs_grads = {"both": lambda o, a: ((o, a), (go, ga)), "o": lambda o, a: ((o,), (go,)),
                  "a": lambda o, a: ((a,), (ga,))}[mode]

    def step():
        with record_function("bench::forward"):
            o, a = fn(q, k, v)
        with record_function("bench::backward"):
            outs, gouts = outs_grads(o, a)
            grads = torch.autograd.grad(outs, (q, k, v), gouts, allow_unused=True)
        return o, a, grads

    step()  # warm (compiled: no compile inside the profiled run)
    result = {}
    if device.startswith("cuda"):
        result["peak_bytes_cuda"] = cuda_peak(step)
    with _quiet_profiler_noise(), profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else []),
            profile_memory=True) as prof:
        res = step()
    del res
    # only the allocations on the case's device: on CUDA the host-side ones (pinned buffers, CPU scalars) are
    # a different memory and must not mix into the GPU's running sum
    allocs = _allocations(prof, q.device)
    nn_bytes = case.n * case.n * case.itemsize * max(case.batch, 1)   # batched cases: one (B, n, n) stack
    # Running sum of this step's own events.  (The events' ``total_allocated`` is the reporter's counter since
    # the *first* profiling session: blocks allocated under an earlier profiler and freed after it ended are
    # never subtracted from it, so it drifts upwards across sessions.)
    live, peak, big = 0, 0, {"bench::forward": [], "bench::backward": []}
    for e in allocs:
        f = e.extra_fields
        live += int(f.alloc_size)
        peak = max(peak, live)
        if f.alloc_size >= nn_bytes and f.alloc_size > 0:
            where = _enclosing(e, ("bench::forward", "bench::backward"))
            if where:
                big[where].append(_op_of(e))
    meaningful = case.n > max(case.d, case.e)
    result.update({
        "peak_bytes": peak,
        "nxn_bytes": nn_bytes,
        "nxn_allocs_forward": len(big["bench::forward"]) if meaningful else None,
        "nxn_allocs_backward": len(big["bench::backward"]) if meaningful else None,
        "nxn_ops_forward": big["bench::forward"] if meaningful else [],
        "nxn_ops_backward": big["bench::backward"] if meaningful else [],
    })
    return result
