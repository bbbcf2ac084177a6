"""The check loop: for each op spec, dtype, shape and trial, run every oracle pair and record the differences.

Importable API::

    from crosscheck import Config, run
    report = run(Config(ops=("attn",), dtypes=("float64",)))
    report.exit_code        # 0 all agree, 1 some disagreement
    report.failures         # [Comparison(...)], each naming op, input, output, oracle, dtype and shape

:func:`run` raises :class:`~crosscheck.errors.UsageError` (and subclasses) for anything that prevents checking;
it does not change global state: JAX's x64 mode, matmul precision and default device are scoped to the run,
and torch's float32 matmul settings (pinned for CUDA) are restored afterwards.
"""

from __future__ import annotations

import contextlib
import math
import platform
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import metrics
from .errors import EnvironmentProblem, ImplError, UsageError
from .specs import SPECS, OpSpec, Side, get_spec, sample_inputs, sample_like

__all__ = ["Config", "Comparison", "Row", "Report", "run", "EDGE_SHAPES", "DEFAULT_DTYPES", "ALL_DTYPES",
           "resolve_shapes"]

Shape = Tuple[int, int, int]

# 1×1 everything; n = 1; d = 1; d ≠ e; tall (n > d) and wide (n < d) q and k; a square n = d = e case.
EDGE_SHAPES: Tuple[Shape, ...] = ((1, 1, 1), (1, 3, 2), (4, 1, 3), (5, 2, 3), (2, 5, 4), (3, 3, 3))
DEFAULT_DTYPES = ("float32", "float64", "complex128")
ALL_DTYPES = ("float32", "float64", "complex64", "complex128")
FRAMEWORKS = ("torch", "jax")


@dataclass
class Config:
    """What to check.  Defaults are the CLI's defaults."""

    ops: Sequence[str] = tuple(SPECS)
    dtypes: Sequence[str] = DEFAULT_DTYPES
    device: str = "cpu"
    seed: int = 0
    trials: int = 2                                    # independent input draws per (op, dtype, shape)
    shapes: Sequence[Shape] = EDGE_SHAPES              # always checked
    random_shapes: int = 2                             # plus this many shapes drawn from the ranges below
    n_range: Tuple[int, int] = (1, 8)                  # inclusive
    d_range: Tuple[int, int] = (1, 8)
    e_range: Tuple[int, int] = (1, 8)
    frameworks: Sequence[str] = FRAMEWORKS
    torch_impl: Optional[Callable] = None              # replaces torch_impl.attn for op "attn"
    torch_impl_name: str = ""
    jax_impl: Optional[Callable] = None                # replaces jax_impl.attn / attn_jvp for op "attn"
    jax_impl_name: str = ""
    jacrev_max_elements: int = 300_000                 # skip jacrev oracles for larger Jacobians
    # the lab asks for a hand-written backward: an `attn` implementation whose gradient autodiff derives from its
    # forward (a plain function of torch / jnp ops) makes the run fail (exit 1); False: only a NOTE
    require_hand_written: bool = True
    tolerances: Dict[str, float] = field(default_factory=lambda: dict(metrics.TOLERANCES))


@dataclass(frozen=True)
class Comparison:
    op: str
    oracle: str
    kind: str                  # "forward" | "vjp" | "jvp"
    dtype: str
    device: str
    shape: Shape
    input_shapes: Tuple[Tuple[int, ...], ...]
    trial: int
    input: str                 # vjp: the gradient's input; jvp: the inputs carrying tangents; forward: "-"
    output: str                # vjp: the outputs carrying cotangents; jvp / forward: the output compared
    rel_err: float
    max_abs: float
    tol: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tol

    def what(self) -> str:
        if self.kind == "vjp":
            return f"grad of {self.input} (cotangent on {self.output})"
        if self.kind == "jvp":
            return f"tangent of {self.output} (tangent on {self.input})"
        return f"forward output {self.output}"

    def message(self) -> str:
        n, d, e = self.shape
        shapes = ", ".join(f"{name} {s}" for name, s in self.input_shapes_named())
        note = f"; {self.note}" if self.note else ""
        return (f"{self.op}: {self.what()} disagrees — {self.oracle}, {self.dtype} on {self.device}, "
                f"n={n} d={d} e={e} ({shapes}), trial {self.trial}: rel err {_fmt(self.rel_err)} > tol "
                f"{self.tol:.0e}, max abs {_fmt(self.max_abs)}{note}")

    def input_shapes_named(self):
        return list(zip(SPECS[self.op].inputs if self.op in SPECS else ("?",) * len(self.input_shapes),
                        self.input_shapes))


@dataclass
class Row:
    op: str
    oracle: str
    kind: str
    dtype: str
    device: str
    tol: float
    rel_err: float = 0.0
    max_abs: float = 0.0
    compared: int = 0
    failed: int = 0

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        return "ok" if self.compared else "skip"


@dataclass
class Report:
    config: Config
    shapes: List[Shape]
    rows: List[Row]
    failures: List[Comparison]
    skipped: List[Dict[str, str]]
    elapsed: float
    versions: Dict[str, str]
    # per framework checked on op attn: {"impl": source, "hand_written": True | False | None (could not tell),
    # "detail": how autodiff reaches the inputs, or why it could not tell}
    hand_written: Dict[str, Dict[str, object]] = field(default_factory=dict)

    @property
    def autodiff_sides(self) -> List[str]:
        """Frameworks whose `attn` gradient is not hand-written (autodiff differentiates the forward)."""
        return [fw for fw, h in self.hand_written.items() if h["hand_written"] is False]

    @property
    def ok(self) -> bool:
        return not self.failures and not (self.config.require_hand_written and self.autodiff_sides)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.1e}")


# --- set-up -------------------------------------------------------------------------------------------------------

def versions(frameworks: Sequence[str]) -> Dict[str, str]:
    import torch
    from . import __version__
    v = {"crosscheck": __version__, "python": platform.python_version(), "numpy": np.__version__,
         "torch": torch.__version__, "platform": platform.platform()}
    if "jax" in frameworks:
        import jax
        import jaxlib
        v["jax"] = jax.__version__
        v["jaxlib"] = getattr(jaxlib, "__version__", "?")
    return v


def resolve_shapes(config: Config) -> List[Shape]:
    """The fixed shapes, then ``random_shapes`` drawn from the ranges (seeded by ``config.seed``)."""
    shapes = [tuple(int(x) for x in s) for s in config.shapes]
    rng = np.random.default_rng([config.seed, zlib.crc32(b"shapes")])
    for _ in range(config.random_shapes):
        shapes.append(tuple(int(rng.integers(lo, hi + 1)) for lo, hi in (config.n_range, config.d_range,
                                                                         config.e_range)))
    out = []
    for s in shapes:                                   # keep order, drop duplicates
        if s not in out:
            out.append(s)
    return out


def _validate(config: Config) -> List[OpSpec]:
    for dt in config.dtypes:
        if dt not in ALL_DTYPES:
            raise UsageError(f"unknown dtype {dt!r}; choose from {', '.join(ALL_DTYPES)}")
    for fw in config.frameworks:
        if fw not in FRAMEWORKS:
            raise UsageError(f"unknown framework {fw!r}; choose from {', '.join(FRAMEWORKS)}")
    if not config.frameworks:
        raise UsageError("no framework selected")
    if config.device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {config.device!r}; choose cpu or cuda")
    if config.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {config.trials}")
    for name, (lo, hi) in (("n", config.n_range), ("d", config.d_range), ("e", config.e_range)):
        if not 0 <= lo <= hi:
            raise UsageError(f"bad {name} range {lo}:{hi}: need 0 <= low <= high")
    for s in config.shapes:
        if len(s) != 3 or any(int(x) < 0 for x in s):
            raise UsageError(f"bad shape {s!r}: need three sizes n, d, e >= 0")
    specs = []
    for op in config.ops:
        try:
            spec = get_spec(op)
        except KeyError as e:
            raise UsageError(e.args[0]) from None
        if (config.torch_impl is not None or config.jax_impl is not None) and spec.replaceable:
            spec = spec.with_impls(config.torch_impl, config.torch_impl_name or "user torch impl",
                                   config.jax_impl, config.jax_impl_name or "user jax impl")
        specs.append(spec)
    given = [opt for opt, fn in (("--torch-impl", config.torch_impl), ("--jax-impl", config.jax_impl))
             if fn is not None]
    if given and not any(spec.replaceable for spec in specs):
        raise UsageError(f"{' / '.join(given)} replaces only the whole op `attn`, and the ops selected "
                         f"({','.join(config.ops)}) do not include it, so your implementation would not be "
                         f"checked at all: add attn to --op (or leave --op out: it defaults to attn when "
                         f"{given[0]} is given)")
    if config.jax_impl is not None and "jax" not in config.frameworks:
        raise UsageError("a JAX implementation was given but JAX is not among the frameworks checked")
    if config.torch_impl is not None and "torch" not in config.frameworks:
        raise UsageError("a torch implementation was given but torch is not among the frameworks checked")
    return specs


def check_environment(device: str, frameworks: Sequence[str]) -> None:
    """Raise :class:`EnvironmentProblem` naming the framework and the reason when ``device`` is unusable."""
    import torch
    if "jax" in frameworks:
        try:
            import jax  # noqa: F401
            import jax_impl  # noqa: F401
        except ImportError as e:
            raise EnvironmentProblem(
                f"JAX side unavailable: {e}. Install it with `pip install -e \".[jax]\"`, or check the PyTorch "
                f"side alone with --frameworks torch") from None
    if device != "cuda":
        return
    # checked even for --frameworks jax: the torch side (and the ground truth's inputs) live on the device too
    if not torch.cuda.is_available():
        why = ("this PyTorch build has no CUDA support (torch.version.cuda is None)" if torch.version.cuda is None
               else "torch.cuda.is_available() is False (no GPU visible, or a driver problem)")
        raise EnvironmentProblem(f"--device cuda: PyTorch cannot use CUDA: {why} (torch {torch.__version__})")
    if "jax" in frameworks:
        import jax
        try:
            jax.devices("gpu")
        except RuntimeError as e:
            raise EnvironmentProblem(
                f"--device cuda: JAX has no GPU backend: {str(e).splitlines()[0]} (jax {jax.__version__}; "
                f"install a CUDA build, e.g. `pip install \"jax[cuda12]\"`)") from None


@contextlib.contextmanager
def _torch_precision(device: str):
    """On CUDA, pin float32 matmuls to full precision (no TF32), restoring the previous settings after."""
    import torch
    if device != "cuda":
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


# --- one case -----------------------------------------------------------------------------------------------------

class _Failed:
    """A hand-written derivative that raised: recorded as a disagreement, not a crash."""

    def __init__(self, exc: BaseException, inputs: Sequence[str]):
        self.text = f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        # torch: "returned an invalid gradient at index 1 - got [2, 5] ..."; JAX: "... at output[1] the bwd rule ..."
        m = re.search(r"at index (\d+)", str(exc)) or re.search(r"at output\[(\d+)\]", str(exc))
        self.index = int(m.group(1)) if m and int(m.group(1)) < len(inputs) else None


class _Skip:
    def __init__(self, reason: str):
        self.reason = reason


def _modes(names: Sequence[str]) -> List[Tuple[str, ...]]:
    """All names together, then each alone (if there is more than one)."""
    modes = [tuple(names)]
    if len(names) > 1:
        modes += [(n,) for n in names]
    return modes


def _case_rng(seed: int, op: str, dtype: str, shape: Shape, trial: int) -> np.random.Generator:
    # Keyed by the case itself, so `--op attn --dtype float64` draws the same numbers as the full run.
    return np.random.default_rng([seed, zlib.crc32(op.encode()), zlib.crc32(dtype.encode()), *shape, trial])


class _Case:
    def __init__(self, spec: OpSpec, dtype: str, shape: Shape, trial: int, seed: int):
        rng = _case_rng(seed, spec.name, dtype, shape, trial)
        self.shape = shape
        n, d, e = shape
        self.inputs = sample_inputs(spec, rng, shape, dtype)
        out_shapes = spec.output_shapes(n, d, e)
        g = [sample_like(rng, s, dtype) for s in out_shapes]
        t = [sample_like(rng, s, dtype) for s in spec.input_shapes(n, d, e)]
        self.cot_modes = _modes(spec.outputs)
        self.tan_modes = _modes(spec.inputs)
        self.cots = [tuple(gi if name in m else None for gi, name in zip(g, spec.outputs)) for m in self.cot_modes]
        self.tans = [tuple(ti if name in m else None for ti, name in zip(t, spec.inputs)) for m in self.tan_modes]


def _np_tuple(values, convert, conj: bool = False):
    out = []
    for v in values:
        a = convert(v)
        out.append(np.conj(a) if (conj and a is not None) else a)
    return tuple(out)


# The parts one framework computes for a case.  Each maps (side, inputs, cots_list, tans_list) to raw results.
def _parts(fw: str, side: Side, do_jacrev: bool) -> Dict[str, Callable]:
    if fw == "torch":
        from . import torch_oracles as O
        ref_vjp, ref_jvp = O.func_vjp, O.func_jvp
    else:
        from . import jax_oracles as O
        ref_vjp, ref_jvp = O.ref_vjp, O.ref_jvp
    parts: Dict[str, Callable] = {"forward": lambda x, c, t: tuple(side.forward(*x))}
    if side.forward_is_hand:
        parts["forward_ref"] = lambda x, c, t: tuple(side.reference(*x))
    parts["vjp"] = lambda x, c, t: side.vjp(x, c)
    parts["vjp_ref"] = lambda x, c, t: ref_vjp(side.reference, x, c)
    if do_jacrev:
        parts["vjp_jac"] = lambda x, c, t: O.jacrev_vjp(side.reference, x, c)
    if side.jvp is not None:
        parts["jvp"] = lambda x, c, t: side.jvp(x, t)
    parts["jvp_ref"] = lambda x, c, t: ref_jvp(side.reference, x, t)
    return parts


def _impl_error(side: Side, spec: OpSpec, shape: Shape, dtype: str, exc: BaseException, fw: str = "",
                inputs=None) -> ImplError:
    if side.user and fw and inputs is not None:       # a torch impl given to --jax-impl, or vice versa?
        from .impls import wrong_framework
        hint = wrong_framework(fw, side.forward, side.source, inputs)
        if hint:
            return ImplError(hint)
    n, d, e = shape
    return ImplError(f"{side.source} raised {type(exc).__name__}: {exc} — when called as {spec.name}"
                     f"({', '.join(spec.inputs)}) on {dtype} inputs of shapes "
                     f"{', '.join(str(s) for s in spec.input_shapes(n, d, e))} (to check only some dtypes or "
                     f"shapes, use --dtype / --shapes)")


def _check_forward_shapes(side: Side, spec: OpSpec, shape: Shape, outs) -> None:
    n, d, e = shape
    want = spec.output_shapes(n, d, e)
    got = tuple(tuple(getattr(o, "shape", ())) for o in outs)
    if len(outs) != len(want) or got != want:
        raise ImplError(f"{side.source} returns wrong shapes: expected {len(want)} outputs "
                        f"({', '.join(spec.outputs)}) of shapes {', '.join(map(str, want))} for inputs of shapes "
                        f"{', '.join(str(s) for s in spec.input_shapes(n, d, e))}, got "
                        f"{len(outs)} of shapes {', '.join(map(str, got))}")


def _evaluate(fw: str, side: Side, spec: OpSpec, parts: Dict[str, Callable], call: Callable, args,
              shape: Shape, dtype: str, n_cots: int, n_tans: int, inputs=None) -> Dict[str, object]:
    """Run the parts one by one through ``call(name, fn, args)``; a hand-written derivative that raises becomes a
    recorded failure (``_Failed``) or, for a missing forward-mode rule, a skip; a forward that raises is an
    ImplError (nothing can be checked)."""
    if fw == "torch":
        from .torch_oracles import JvpUnsupported
    else:
        from .jax_oracles import JvpUnsupported
    unsupported = (JvpUnsupported,)
    raw: Dict[str, object] = {}
    for name, fn in parts.items():
        try:
            raw[name] = call(name, fn, args)
        except unsupported as exc:
            raw[name] = [_Skip(f"{side.source} has no forward-mode (JVP) rule: {str(exc).splitlines()[0]}")] * n_tans
        except Exception as exc:   # noqa: BLE001 - any failure of user code becomes a clear message
            if name == "forward":
                raise _impl_error(side, spec, shape, dtype, exc, fw, inputs) from None
            if name in ("vjp", "jvp"):
                raw[name] = [_Failed(exc, spec.inputs)] * (n_cots if name == "vjp" else n_tans)
            else:
                raise                                  # an oracle failing is crosscheck's own bug: show it
    return raw


def _to_numpy_results(fw: str, side: Side, spec: OpSpec, raw: Dict[str, object], shape: Shape,
                      flip: bool) -> Dict[str, object]:
    """Check the forward's shapes, convert to numpy; JAX VJPs are conjugated back (eq. (17))."""
    if fw == "torch":
        from .torch_oracles import to_numpy
    else:
        from .jax_oracles import to_numpy
    _check_forward_shapes(side, spec, shape, raw["forward"])
    res: Dict[str, object] = {}
    for name, value in raw.items():
        if name.startswith("forward"):
            res[name] = _np_tuple(value, to_numpy)
        else:
            res[name] = [r if isinstance(r, (_Failed, _Skip)) else _np_tuple(r, to_numpy, flip and name.startswith("vjp"))
                         for r in value]
    if "jvp" not in res:
        res["jvp"] = [_Skip(side.jvp_missing)] * len(res["jvp_ref"])
    return res


def _torch_case(side: Side, spec: OpSpec, case: "_Case", shape: Shape, dtype: str, device: str,
                do_jacrev: bool) -> Dict[str, object]:
    from . import torch_oracles as O
    conv = lambda a: None if a is None else O.to_torch(a, device)
    args = (tuple(conv(x) for x in case.inputs), [tuple(conv(c) for c in cs) for cs in case.cots],
            [tuple(conv(t) for t in ts) for ts in case.tans])
    parts = _parts("torch", side, do_jacrev)
    raw = _evaluate("torch", side, spec, parts, lambda name, fn, a: fn(*a), args, shape, dtype,
                    len(case.cots), len(case.tans), case.inputs)
    import torch
    if not all(isinstance(o, torch.Tensor) for o in raw["forward"]):
        types = ", ".join(sorted({type(o).__module__.split(".")[0] + "." + type(o).__name__ for o in raw["forward"]}))
        raise _impl_error(side, spec, shape, dtype, TypeError(f"returned {types}, not torch tensors"), "torch",
                          case.inputs)
    return _to_numpy_results("torch", side, spec, raw, shape, False)


# Compiled JAX programs, kept for the life of the process (so a second run in the same process, e.g. in a test
# suite, does not compile again).  Keyed by the identity of every function a program calls (Side.key), so a
# different or monkeypatched implementation gets its own program.
_PROGRAMS: Dict[tuple, object] = {}


class _JaxExecutor:
    """Runs the JAX work of each (op, dtype, shape) as ONE compiled XLA program.

    Eager JAX compiles every primitive anew for every shape (hundreds of compilations, ~20 s); instead, one
    jitted program per (op, dtype, shape) computes every part (forward, hand-written VJP and JVP, the autodiff
    oracles) and is reused by all trials and modes.  The programs are tiny, so compile time dominates: they are
    compiled with cheap XLA:CPU settings, ahead of use, in a small thread pool (XLA releases the GIL while
    compiling) that overlaps the torch work.  A part that cannot even be traced (a user rule returning a wrong
    shape, a ``custom_vjp`` function under ``jax.jvp``) is found with ``jax.eval_shape`` part by part, left out
    of the program and reported."""

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

    def _args(self, job, dtype: str, concrete: bool, mode: int = 0):
        """``(inputs, [cotangents of one mode], [tangents of one mode])``.  JAX has no "absent" cotangent or
        tangent (its rules receive zeros), so modes differ only in values: the program is traced for ONE mode,
        with zeros in place of ``None``, and executed once per mode — 3-4x less to compile than tracing every
        mode.  JAX gets the conjugate cotangent; its VJP is conjugated back later (eq. (17))."""
        from . import jax_oracles as O
        side, spec, case, do_jacrev = job
        flip = np.dtype(dtype).kind == "c"
        if concrete:
            conv = lambda a: O.to_jax(a, self.device)
        else:
            conv = lambda a: self.jax.ShapeDtypeStruct(a.shape, a.dtype)
        n, d, e = case.shape
        cots = case.cots[min(mode, len(case.cots) - 1)]
        tans = case.tans[min(mode, len(case.tans) - 1)]
        cots = tuple(np.zeros(s, dtype) if c is None else (np.conj(c) if flip else c)
                     for c, s in zip(cots, spec.output_shapes(n, d, e)))
        tans = tuple(np.zeros(x.shape, dtype) if t is None else t for t, x in zip(tans, case.inputs))
        return (tuple(conv(x) for x in case.inputs), [tuple(conv(c) for c in cots)], [tuple(conv(t) for t in tans)])

    def _build(self, job, dtype: str):
        """Trace and compile one program; returns (executable, trace failures {part: exception})."""
        from .jax_oracles import jax_context
        jax = self.jax
        side, spec, case, do_jacrev = job
        with jax_context(self.device):
            args = self._args(job, dtype, concrete=False)
            parts = _parts("jax", side, do_jacrev)
            failures: Dict[str, BaseException] = {}

            def make_program(parts):                   # a new function each time: JAX caches traces per function
                parts = dict(parts)
                return lambda a: {name: fn(*a) for name, fn in parts.items()}

            try:
                lowered = jax.jit(make_program(parts)).lower(args)
            except Exception:                          # noqa: BLE001 - find the parts that fail, leave them out
                from .jax_oracles import JvpUnsupported
                for name, fn in list(parts.items()):
                    try:                               # (some errors only surface when lowering, not in eval_shape)
                        jax.jit(lambda a, fn=fn: fn(*a)).lower(args)
                    except Exception as exc:           # noqa: BLE001
                        if name == "jvp" and isinstance(exc, TypeError) and "custom_vjp" in str(exc):
                            exc = JvpUnsupported(str(exc))
                        failures[name] = exc
                        del parts[name]
                lowered = jax.jit(make_program(parts)).lower(args)
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
        return (side_key, self.device, spec.name, dtype, case.shape, do_jacrev)

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
        n_modes = max(len(case.cots), len(case.tans))
        per_mode = [exe(self._args(job, dtype, concrete=True, mode=m)) for m in range(n_modes)]
        raw: Dict[str, object] = {}
        for name in _parts("jax", side, do_jacrev):   # part order
            if name in failures:
                exc = failures[name]
                n_part = len(case.cots) if name.startswith("vjp") else len(case.tans)
                if isinstance(exc, O.JvpUnsupported):
                    raw[name] = [_Skip(f"{side.source} has no forward-mode (JVP) rule: "
                                       f"{str(exc).splitlines()[0]}")] * n_part
                elif name == "forward":
                    raise _impl_error(side, spec, case.shape, dtype, exc, "jax", case.inputs)
                elif name in ("vjp", "jvp"):
                    raw[name] = [_Failed(exc, spec.inputs)] * n_part
                else:
                    raise exc                          # an oracle failing is crosscheck's own bug: show it
            elif name.startswith("forward"):
                raw[name] = per_mode[0][name]
            else:                                      # each execution computed one mode: gather them
                count = len(case.cots) if name.startswith("vjp") else len(case.tans)
                raw[name] = [per_mode[m][name][0] for m in range(count)]
        return _to_numpy_results("jax", side, spec, raw, case.shape, np.dtype(dtype).kind == "c")


def _truth(spec: OpSpec, case: _Case, dtype: str) -> Dict[str, object]:
    """float64/complex128 ground truth on CPU: torch.func of the torch reference, on the same numbers upcast."""
    from . import torch_oracles as O
    ref = spec.torch_side().reference if not spec.replaceable else __import__("torch_impl").attn_reference
    wide = metrics.GROUND_TRUTH_DTYPE[dtype]
    up = lambda x: None if x is None else O.to_torch(x.astype(wide), "cpu")
    inputs = tuple(up(x) for x in case.inputs)
    cots = [tuple(up(c) for c in cs) for cs in case.cots]
    tans = [tuple(up(t) for t in ts) for ts in case.tans]
    return {"forward": _np_tuple(ref(*inputs), O.to_numpy),
            "vjp": [_np_tuple(r, O.to_numpy) for r in O.func_vjp(ref, inputs, cots)],
            "jvp": [_np_tuple(r, O.to_numpy) for r in O.func_jvp(ref, inputs, tans)]}


class _Collector:
    def __init__(self, config: Config):
        self.config = config
        self.rows: Dict[Tuple[str, str, str], Row] = {}
        self.failures: List[Comparison] = []
        self.skipped: Dict[Tuple[str, str, str, str], None] = {}

    def row(self, op, oracle, kind, dtype) -> Row:
        key = (op, oracle, dtype)
        if key not in self.rows:
            self.rows[key] = Row(op, oracle, kind, dtype, self.config.device, self.config.tolerances[dtype])
        return self.rows[key]

    def skip(self, op, oracle, kind, dtype, reason):
        self.row(op, oracle, kind, dtype)
        self.skipped[(op, oracle, dtype, reason)] = None

    def compare(self, spec: OpSpec, case_info, oracle: str, kind: str, actual, expected, mode: Tuple[str, ...],
                symmetric: bool = False):
        """Compare one result tuple against another, element by element (per gradient / per output);
        ``symmetric``: neither is the reference (see ``metrics.diff``)."""
        dtype, shape, trial, input_shapes = case_info
        row = self.row(spec.name, oracle, kind, dtype)
        if isinstance(expected, _Skip):
            self.skip(spec.name, oracle, kind, dtype, expected.reason)
            return
        if isinstance(actual, _Skip):
            self.skip(spec.name, oracle, kind, dtype, actual.reason)
            return
        labels = spec.inputs if kind == "vjp" else spec.outputs
        mode_label = ",".join(mode)
        for i, label in enumerate(labels):
            note = ""
            if isinstance(actual, _Failed):
                if actual.index is not None and actual.index != i:
                    continue                         # the error names another gradient
                d = metrics.Diff(math.inf, math.inf)
                note = f"hand-written {kind.upper()} {actual.text}"
            else:
                d = metrics.diff(actual[i], expected[i], symmetric)
                note = d.note
            inp, out = (label, mode_label) if kind == "vjp" else (mode_label, label)
            if kind == "forward":
                inp = "-"
            c = Comparison(spec.name, oracle, kind, dtype, self.config.device, shape, input_shapes, trial, inp,
                           out, d.rel_err, d.max_abs, row.tol, note)
            row.compared += 1
            row.rel_err = max(row.rel_err, d.rel_err) if not math.isnan(d.rel_err) else math.inf
            row.max_abs = max(row.max_abs, d.max_abs) if not math.isnan(d.max_abs) else math.inf
            if not c.ok:
                row.failed += 1
                self.failures.append(c)


def _jacrev_size(spec: OpSpec, case: _Case, shape: Shape, dtype: str) -> int:
    n, d, e = shape
    in_numel = sum(x.size for x in case.inputs)
    out_numel = sum(int(np.prod(s)) for s in spec.output_shapes(n, d, e))
    return in_numel * out_numel * (4 if np.dtype(dtype).kind == "c" else 1)


def _compare_case(col: _Collector, spec: OpSpec, sides: Dict[str, Side], case: _Case, dtype: str, shape: Shape,
                  trial: int, results: Dict[str, Dict[str, object]], jac_elems: int) -> None:
    n, d, e = shape
    info = (dtype, shape, trial, spec.input_shapes(n, d, e))
    F, V, J = "forward", "vjp", "jvp"
    autodiff = {"torch": ("torch.func.vjp", "torch.func.jacrev", "torch.func.jvp"),
                "jax": ("jax.vjp", "jax.jacrev", "jax.jvp")}
    for fw, r in results.items():
        vjp_name, jac_name, jvp_name = autodiff[fw]
        if sides[fw].forward_is_hand:
            col.compare(spec, info, f"{fw} impl vs {fw} reference", F, r["forward"], r["forward_ref"], spec.outputs)
        for m, got, want in zip(case.cot_modes, r["vjp"], r["vjp_ref"]):
            col.compare(spec, info, f"{fw} hand VJP vs {vjp_name}(ref)", V, got, want, m)
        if "vjp_jac" in r:
            for m, got, want in zip(case.cot_modes, r["vjp"], r["vjp_jac"]):
                col.compare(spec, info, f"{fw} hand VJP vs {jac_name}(ref)", V, got, want, m)
        else:
            col.skip(spec.name, f"{fw} hand VJP vs {jac_name}(ref)", V, dtype,
                     f"Jacobian of {jac_elems} elements (empty, or above --jacrev-max-elements)")
        for m, got, want in zip(case.tan_modes, r["jvp"], r["jvp_ref"]):
            col.compare(spec, info, f"{fw} hand JVP vs {jvp_name}(ref)", J, got, want, m)
    if "torch" in results and "jax" in results:
        # The reference (denominator of rel err) is the project's side when the other is the user's: a wrong user
        # gradient near zero must not blow the relative error up.  The user's side is labelled "(yours)".
        actual, expected = ("jax", "torch") if (sides["jax"].user and not sides["torch"].user) else ("torch", "jax")
        label = {fw: fw + (" (yours)" if sides[fw].user else "") for fw in ("torch", "jax")}
        got_r, want_r = results[actual], results[expected]
        both_user = sides["torch"].user and sides["jax"].user      # no trusted side: divide by the larger norm

        def name(what: str) -> str:
            if not what:
                return f"{label[actual]} vs {label[expected]}"
            return (f"{actual} hand {what}{' (yours)' if sides[actual].user else ''} vs {expected} hand "
                    f"{what}{' (yours)' if sides[expected].user else ''}" + (" (eq. 17)" if what == "VJP" else ""))

        col.compare(spec, info, name(""), F, got_r["forward"], want_r["forward"], spec.outputs, both_user)
        for what, kind, modes in (("VJP", V, case.cot_modes), ("JVP", J, case.tan_modes)):
            for m, got, want in zip(modes, got_r[kind], want_r[kind]):
                for fw, value in ((actual, got), (expected, want)):
                    if isinstance(value, _Failed):
                        skip = _Skip(f"the {'JAX' if fw == 'jax' else 'torch'} hand {what} raised (reported in its "
                                     f"own rows)")
                        got, want = (skip, want) if fw == actual else (got, skip)
                col.compare(spec, info, name(what), kind, got, want, m, both_user)
    if dtype in metrics.LOW_PRECISION:
        truth = _truth(spec, case, dtype)
        wide = metrics.LOW_PRECISION[dtype]
        for fw, r in results.items():
            col.compare(spec, info, f"{fw} vs {wide} truth", F, r["forward"], truth["forward"], spec.outputs)
            for m, got, want in zip(case.cot_modes, r["vjp"], truth["vjp"]):
                col.compare(spec, info, f"{fw} hand VJP vs {wide} truth", V, got, want, m)
            for m, got, want in zip(case.tan_modes, r["jvp"], truth["jvp"]):
                col.compare(spec, info, f"{fw} hand JVP vs {wide} truth", J, got, want, m)


def _hand_written(fw: str, side: Side, case: _Case, device: str) -> Dict[str, object]:
    """Run ``side.autodiff_probe`` on the case's inputs: is the gradient under test really hand-written?"""
    if fw == "torch":
        from .torch_oracles import to_torch as convert
    else:
        from .jax_oracles import to_jax as convert
    try:
        path = side.autodiff_probe(tuple(convert(x, device) for x in case.inputs))
    except Exception as exc:                           # noqa: BLE001 - a probe problem must not end the run
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return {"impl": side.source, "hand_written": None,
                "detail": f"could not tell: {type(exc).__name__}: {first_line}"}
    return {"impl": side.source, "hand_written": path is None, "detail": path or ""}


# --- the run -------------------------------------------------------------------------------------------------------

def run(config: Optional[Config] = None, progress: Optional[Callable[[int, int, str], None]] = None) -> Report:
    """Run every check of ``config``; see the module docstring.  ``progress(done, total, label)`` is called
    before each (dtype, shape, trial) step and once at the end."""
    config = config or Config()
    t0 = time.perf_counter()
    specs = _validate(config)
    check_environment(config.device, config.frameworks)
    shapes = resolve_shapes(config)
    col = _Collector(config)
    hand: Dict[str, Dict[str, object]] = {}
    total = len(config.dtypes) * len(shapes) * config.trials
    done = 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(_torch_precision(config.device))
        executor = None
        if "jax" in config.frameworks:
            from .jax_oracles import jax_context
            stack.enter_context(jax_context(config.device))
            executor = _JaxExecutor(config.device)
            stack.callback(executor.close)
        all_sides = []
        for spec in specs:
            sides = {}
            for fw in FRAMEWORKS:
                if fw in config.frameworks:
                    sides[fw] = spec.torch_side() if fw == "torch" else spec.jax_side()
            all_sides.append(sides)

        def make_jobs(dtype, shape, trial):
            cases, jac_sizes, jobs = [], [], {}
            for spec, sides in zip(specs, all_sides):
                case = _Case(spec, dtype, shape, trial, config.seed)
                size = _jacrev_size(spec, case, shape, dtype)
                cases.append(case)
                jac_sizes.append(size)
                if "jax" in sides:
                    jobs[spec.name] = (sides["jax"], spec, case, 0 < size <= config.jacrev_max_elements)
            return cases, jac_sizes, jobs

        if executor is not None:                       # compile every program ahead, in the background
            for dtype in config.dtypes:
                for shape in shapes:
                    for job in make_jobs(dtype, shape, 0)[2].values():
                        executor.prefetch(job, dtype)
        for dtype in config.dtypes:
            for shape in shapes:
                for trial in range(config.trials):
                    if progress is not None:
                        progress(done, total, f"{dtype} n={shape[0]} d={shape[1]} e={shape[2]} trial {trial}")
                    cases, jac_sizes, jobs = make_jobs(dtype, shape, trial)
                    jax_results = {op: executor.run(job, dtype) for op, job in jobs.items()}
                    for spec, sides, case, size in zip(specs, all_sides, cases, jac_sizes):
                        results = {}
                        if "torch" in sides:
                            results["torch"] = _torch_case(sides["torch"], spec, case, shape, dtype, config.device,
                                                           0 < size <= config.jacrev_max_elements)
                        if spec.name in jax_results:
                            results["jax"] = jax_results[spec.name]
                        _compare_case(col, spec, sides, case, dtype, shape, trial, results, size)
                        for fw in results:                 # once per run, on inputs the forward has accepted
                            if sides[fw].autodiff_probe is not None and fw not in hand:
                                hand[fw] = _hand_written(fw, sides[fw], case, config.device)
                    done += 1
        if progress is not None:
            progress(done, total, "done")
    op_order = {s.name: i for i, s in enumerate(specs)}
    dt_order = {d: i for i, d in enumerate(config.dtypes)}
    rows = sorted(col.rows.values(), key=lambda r: (op_order[r.op], dt_order[r.dtype]))    # stable: oracle order kept
    skipped = [{"op": op, "oracle": oracle, "dtype": dt, "reason": reason}
               for (op, oracle, dt, reason) in col.skipped]
    return Report(config, shapes, rows, col.failures, skipped, time.perf_counter() - t0,
                  versions(config.frameworks), {fw: hand[fw] for fw in FRAMEWORKS if fw in hand})
