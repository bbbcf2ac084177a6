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

from typing import Dict

import numpy as np

from .parts import Failed, Skip, impl_error, parts, skip_reason, to_numpy_results

__all__ = ["JaxExecutor"]

# Compiled JAX programs, kept for the life of the process (so a second run in the same process, e.g. in a test
# suite, does not compile again).  Keyed by the identity of every function a program calls (Side.key), so a
# different or monkeypatched implementation gets its own program.
_PROGRAMS: Dict[tuple, object] = {}


class JaxExecutor:
    """Builds (in the background) and runs the program of each job ``(side, spec, case, do_jacrev)``."""

    # XLA:CPU settings that cut compile time (measured ~5x on these programs): no LLVM optimisation pipeline,
    # and the classic elemental emitter instead of the newer fusion emitters.  Tried in order; a jaxlib that does
    # not know an option rejects it, and the next (finally: XLA's defaults) is used.
    FAST_CPU_OPTIONS = (
        {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
         "xla_cpu_use_fusion_emitters": False},
        {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
        None,
    )

    def __init__(self, device: str, workers: int = 2):
        import concurrent.futures
        import jax
        self.jax = jax
        self.device = device
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="crosscheck-xla")
        self.futures: Dict[object, object] = {}

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        for key, fut in list(self.futures.items()):     # keep only programs that were built
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                side_key = key[0]
                if side_key is not None:
                    _PROGRAMS[key] = fut

    def _args(self, job, dtype: str, concrete: bool):
        """``(inputs, cotangents per mode, tangents per subset, (g, w, t) for second order)``; ``None`` stays
        ``None`` (an unused output / an input without tangent: part of the program's structure).  JAX gets the
        conjugate cotangent; its VJP is conjugated back later (eq. (17))."""
        from . import jax_oracles as O
        side, spec, case, do_jacrev = job
        flip = np.dtype(dtype).kind == "c"
        cj = (lambda a: None if a is None else np.conj(a)) if flip else (lambda a: a)
        g, w, t = case.second
        tree = (tuple(case.inputs), [tuple(cj(c) for c in cs) for cs in case.cots], [tuple(ts) for ts in case.tans],
                (tuple(cj(c) for c in g), tuple(w), tuple(t)))
        if concrete:                                   # one transfer for the whole tree (None: no leaf)
            return self.jax.device_put(tree, O.jax_device(self.device))
        return self.jax.tree_util.tree_map(lambda a: self.jax.ShapeDtypeStruct(a.shape, a.dtype), tree)

    def _build(self, job, dtype: str):
        """Trace and compile one program; returns (executable, trace failures {part: exception})."""
        from .jax_oracles import JvpUnsupported, jax_context
        jax = self.jax
        side, spec, case, do_jacrev = job
        with jax_context(self.device):
            args = self._args(job, dtype, concrete=False)
            todo = parts("jax", side, case.request_masks(spec), do_jacrev, case.all_paths)
            failures: Dict[str, BaseException] = {}

            def make_program(todo):                    # a new function each time: JAX caches traces per function
                todo = dict(todo)
                return lambda a: {name: fn(*a) for name, fn in todo.items()}

            try:
                lowered = jax.jit(make_program(todo)).lower(args)
            except Exception:                          # noqa: BLE001 - find the parts that fail, leave them out
                for name, fn in list(todo.items()):
                    try:                               # (some errors only surface when lowering, not in eval_shape)
                        jax.jit(lambda a, fn=fn: fn(*a)).lower(args)
                    except Exception as exc:           # noqa: BLE001
                        if name == "jvp" and isinstance(exc, TypeError) and "custom_vjp" in str(exc):
                            exc = JvpUnsupported(str(exc))
                        failures[name] = exc
                        del todo[name]
                lowered = jax.jit(make_program(todo)).lower(args)
            for options in (self.FAST_CPU_OPTIONS if self.device == "cpu" else (None,)):
                try:
                    exe = lowered.compile() if options is None else lowered.compile(options)
                    break
                except Exception:                      # noqa: BLE001 - an option unknown to this jaxlib
                    if options is None:
                        raise
            return exe, failures

    def _key(self, job, dtype: str):
        side, spec, case, do_jacrev = job
        side_key = side.key or None
        try:
            hash(side_key)
        except TypeError:                              # an unhashable user callable: never reuse
            side_key = None
        return (side_key, self.device, spec.name, dtype, case.shape, do_jacrev, case.all_paths)

    def prefetch(self, job, dtype: str) -> None:
        key = self._key(job, dtype)
        if key[0] is not None and key in _PROGRAMS:
            self.futures[key] = _PROGRAMS[key]
        if key not in self.futures:
            self.futures[key] = self.pool.submit(self._build, job, dtype)

    def run(self, job, dtype: str) -> Dict[str, object]:
        """Numpy results of one op's case, VJPs in PyTorch's convention."""
        from . import jax_oracles as O
        side, spec, case, do_jacrev = job
        self.prefetch(job, dtype)
        exe, failures = self.futures[self._key(job, dtype)].result()
        got = exe(self._args(job, dtype, concrete=True))
        raw: Dict[str, object] = {}
        for name in parts("jax", side, case.request_masks(spec), do_jacrev, case.all_paths):      # part order
            if name not in failures:
                raw[name] = got[name]
                continue
            exc = failures[name]
            count = {"vjp": len(case.vjp_requests), "jvp": len(case.tans)}.get(name, 1)
            if isinstance(exc, O.JvpUnsupported):
                raw[name] = [Skip(skip_reason(side, name, exc))] * count
            elif name == "forward":
                raise impl_error(side, spec, case.shape, dtype, exc, "jax", case.inputs)
            elif name in ("vjp", "jvp", "vjp_vjp", "hvp"):
                raw[name] = [Failed(exc, spec.inputs)] * count
            else:
                raise exc                              # an oracle failing is crosscheck's own bug: show it
        return to_numpy_results("jax", side, spec, raw, case.shape, np.dtype(dtype).kind == "c")
