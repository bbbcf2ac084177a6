"""The JAX side of a run: every part of one (op, dtype, shape) as ONE compiled XLA program.

Eager JAX compiles every primitive anew for every shape (hundreds of compilations, ~20 s); instead, one jitted
program per (op, dtype, shape) computes every part (forward, hand-written VJP on every path, JVPs, second order,
the autodiff oracles) and is reused by all trials.  The structure of a case (which inputs are differentiated,
which outputs are unused, which inputs carry tangents) is part of the trace, so the custom rules see
``perturbed`` flags and symbolic zeros exactly as in real use.  The programs are tiny, so compile time
dominates: they are compiled with cheap XLA:CPU settings, ahead of use, in a small thread pool (XLA releases
the GIL while compiling) that overlaps the torch work.  A part that cannot even be traced (a user rule returning
a wrong shape, a ``custom_vjp`` function under ``jax.jvp``) is found part by part, left out of the program and
reported.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from .frameworks import get
from .jax_oracles import context
from .parts import CaseResults, evaluate, parts, to_numpy_results

__all__ = ["JaxExecutor"]

# Compiled JAX programs, kept for the life of the process (so a second run in the same process, e.g. in a test
# suite, does not compile again).  Keyed by the identity of every function a program calls (Side.key), so a
# different or monkeypatched implementation gets its own program.
_PROGRAMS: Dict[tuple, object] = {}


class JaxExecutor:
    """Builds (in the background) and runs the program of each :class:`~crosscheck.cases.Job`."""

    # XLA:CPU settings that cut compile time (measured ~5x on these programs): no LLVM optimisation pipeline,
    # and the classic elemental emitter instead of the newer fusion emitters.  Tried in order; a jaxlib that does
    # not know an option rejects it, and the next (finally: XLA's defaults) is used.
    FAST_CPU_OPTIONS = (
        {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
         "xla_cpu_use_fusion_emitters": False},
        {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
        None,
    )

    def __init__(self, fw: str, device: str, workers: int = 2, sharding=None):
        import concurrent.futures
        import jax
        self.jax = jax
        self.device = device
        # where the programs' arguments live: one device (default), or a jax.sharding.Sharding (the sharded
        # candidates of crosscheck.shards: replicated over their mesh, so the program's input shardings match)
        self.sharding = sharding
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="crosscheck-xla")
        self.futures: Dict[object, object] = {}

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        for key, fut in list(self.futures.items()):     # keep only reusable programs that were built
            if key[0] is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                _PROGRAMS[key] = fut

    def _args(self, job, concrete: bool):
        """``(inputs, cotangents per mode, tangents per subset, (g, w, t) for second order)``; ``None`` stays
        ``None`` (an unused output / an input without tangent: part of the program's structure).  JAX gets the
        conjugate cotangent; its VJP is conjugated back later (eq. (17))."""
        from . import jax_oracles as O                 # (looked up here: tests pretend a GPU through it)
        case, (g, w, t) = job.case, job.case.second
        cj = (lambda cs: tuple(None if c is None else np.conj(c) for c in cs)) if get("jax").flips(job.dtype) else tuple
        tree = (tuple(case.inputs), [cj(cs) for cs in case.cots], [tuple(ts) for ts in case.tans],
                (cj(g), tuple(w), tuple(t)))
        if concrete:                                   # one transfer for the whole tree (None: no leaf)
            return self.jax.device_put(tree, self.sharding or O.jax_device(self.device))
        return self.jax.tree_util.tree_map(lambda a: self.jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                                sharding=self.sharding), tree)

    def _build(self, job):
        """Trace and compile one program; returns (executable, trace failures {part or (part, request): exc})."""
        jax = self.jax
        with context(self.device):
            args = self._args(job, concrete=False)
            todo = parts("jax", job.side, job.case, job.spec, job.do_jacrev)
            failures: Dict[object, BaseException] = {}
            try:
                lowered = jax.jit(_program(todo, failures)).lower(args)
            except Exception:                          # noqa: BLE001 - find what fails, leave it out
                failures = self._trace_failures(todo, args)
                lowered = jax.jit(_program(todo, failures)).lower(args)
            for options in (self.FAST_CPU_OPTIONS if self.device == "cpu" else (None,)):
                try:
                    exe = lowered.compile() if options is None else lowered.compile(options)
                    break
                except Exception:                      # noqa: BLE001 - an option unknown to this jaxlib
                    if options is None:
                        raise
            return exe, failures

    def _trace_failures(self, todo, args) -> Dict[object, BaseException]:
        """The parts that cannot be traced (some errors only surface when lowering, not in eval_shape); of a
        hand-written part, each request on its own, so one that raises does not take the others with it."""
        from .jax_oracles import JvpUnsupported
        failures: Dict[object, BaseException] = {}

        def fails(fn):
            try:
                self.jax.jit(lambda a: fn(*a)).lower(args)
            except Exception as exc:                   # noqa: BLE001
                return exc
            return None

        for name, part in todo.items():
            fns = {(name, i): el for i, el in enumerate(part)} if isinstance(part, list) else {name: part}
            if fails(lambda *a, fns=fns: [fn(*a) for fn in fns.values()]) is None:
                continue
            for key, fn in fns.items():
                exc = fails(fn)
                if exc is not None:
                    unsupported = name == "jvp" and isinstance(exc, TypeError) and "custom_vjp" in str(exc)
                    failures[key] = JvpUnsupported(str(exc)) if unsupported else exc
        return failures

    def _key(self, job):
        side_key = job.side.key or None
        try:
            hash(side_key)
        except TypeError:                              # an unhashable user callable: never reuse
            side_key = None
        return (side_key, self.device, job.spec.name, job.dtype, job.case.shape, job.do_jacrev, job.case.all_paths)

    def prefetch(self, job) -> None:
        key = self._key(job)
        if key[0] is not None and key in _PROGRAMS:
            self.futures[key] = _PROGRAMS[key]
        if key not in self.futures:
            self.futures[key] = self.pool.submit(self._build, job)

    def run(self, job) -> CaseResults:
        """Numpy results of one op's case, VJPs in PyTorch's convention."""
        side, spec, case, dtype = job.side, job.spec, job.case, job.dtype
        self.prefetch(job)
        exe, failures = self.futures[self._key(job)].result()
        got = exe(self._args(job, concrete=True))

        def result(name, i):                           # a part or request that could not be traced raises here
            key = name if i is None else (name, i)
            if key in failures:
                raise failures[key]
            return got[name] if i is None else got[name][i]

        raw = evaluate("jax", side, spec, parts("jax", side, case, spec, job.do_jacrev), result, case.shape, dtype,
                       case.inputs)
        return to_numpy_results("jax", side, spec, raw, case.shape, dtype)


def _program(todo, failures) -> Callable:
    """The program of the parts and requests that trace (a new function each time: JAX caches traces per
    function); a request left out gives None."""
    todo = {name: part for name, part in todo.items() if name not in failures}

    def program(a):
        return {name: [None if (name, i) in failures else el(*a) for i, el in enumerate(part)]
                if isinstance(part, list) else part(*a) for name, part in todo.items()}

    return program
