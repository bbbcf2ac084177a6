"""The check loop: for each op spec, dtype, shape and trial, run every oracle pair on every path and record the
differences (``report.failures``: each a ``Comparison`` naming op, input, output, path, oracle, dtype and shape).

:func:`run` raises :class:`~crosscheck.errors.UsageError` (and subclasses) for anything that prevents checking,
before any work; it does not change global state: JAX's x64 mode, matmul precision and default device are
scoped to the run, and torch's float32 matmul settings (pinned for CUDA) are restored afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from typing import Callable, Dict, List, Optional

from . import drivers
from .cases import EDGE_SHAPES, Case, Job, path_shapes, resolve_shapes
from .compare import Collector, compare_case, jacrev_size, second_order_skips
from .availability import check_environment, versions
from .errors import UsageError, first_line
from .frameworks import get as get_framework
from .metrics import dtype as dtype_info
from .probe import check_dtypes, probe_complex
from .review import review
from .oracles import Kind, Oracle, Party
from .results import ALL_DTYPES, DEFAULT_DTYPES, FRAMEWORKS, Comparison, Config, HandWritten, Report, Row
from .kernels import check as check_kernels
from .kernels import unavailable as kernels_unavailable
from .specs import KERNEL_OPS, SPECS, OpSpec, Side

__all__ = ["Config", "Comparison", "Row", "Report", "run", "EDGE_SHAPES", "DEFAULT_DTYPES", "ALL_DTYPES",
           "resolve_shapes", "check_environment", "check_names", "check_options"]


def check_names(names, option: str, allowed, what: str, extra: str = "") -> tuple:
    """A list option (``--op``, ``--dtype``, ``--frameworks``): each name checked, duplicates dropped."""
    names = tuple(dict.fromkeys(names))
    if not names:
        raise UsageError(f"{option}: no {what} given; choose from {', '.join(allowed)}{extra}")
    for name in names:
        if name not in allowed:
            raise UsageError(f"{option}: unknown {what} {name!r}; choose from {', '.join(allowed)}{extra}")
    return names


def check_options(config: Config) -> List[OpSpec]:
    """Every option checked before any work (the CLI calls it before importing an implementation, naming it by
    ``torch_impl_name`` / ``jax_impl_name`` alone); raises UsageError naming the option."""
    for option, value, least in (("--seed", config.seed, 0), ("--trials", config.trials, 1),
                                 ("--path-shapes", config.path_shapes, 0)):
        if type(value) is not int or value < least:
            raise UsageError(f"{option} must be an integer >= {least}, got {value!r}")
    check_names(config.dtypes, "--dtype", ALL_DTYPES, "dtype")
    check_names(config.frameworks, "--frameworks", FRAMEWORKS, "framework")
    users = [fw for fw in FRAMEWORKS if config.user(fw).given]
    for fw in users:
        if fw not in config.frameworks:
            raise UsageError(f"{get_framework(fw).flag} given but --frameworks {','.join(config.frameworks)} does not "
                             f"include {fw}")
    if config.device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {config.device!r}; choose cpu or cuda")
    if type(config.shards) is not int or config.shards < 0 or config.shards == 1:
        raise UsageError(f"--shards must be an integer >= 2 (or 0: no sharded check), got {config.shards!r}")
    for option, text in ((get_framework(fw).layouts_flag, config.user(fw).layouts) for fw in FRAMEWORKS):
        if text and not config.shards:
            raise UsageError(f"{option} needs --shards N")
        if text and not all(text.partition(":")[::2]):
            raise UsageError(f"{option} expects MODULE:ATTR (a dict of layouts), got {text!r}")
    for name, (lo, hi) in (("n", config.n_range), ("d", config.d_range), ("e", config.e_range)):
        if not 0 <= lo <= hi:
            raise UsageError(f"bad {name} range {lo}:{hi}: need 0 <= low <= high")
    for s in config.shapes:
        if len(s) != 3 or any(int(x) < 0 for x in s):
            raise UsageError(f"bad shape {s!r}: need three sizes n, d, e >= 0")
    if not resolve_shapes(config):
        raise UsageError("no shapes to check: --shapes none needs --random-shapes K with K >= 1")
    for op in config.ops:
        if op not in SPECS:
            raise UsageError(f"unknown op {op!r}; registered: {', '.join(SPECS)}")
    user = config.torch_impl is not None or config.jax_impl is not None
    specs = [SPECS[op].with_impls(config.torch_impl, config.torch_impl_name or "user torch impl", config.jax_impl,
                                  config.jax_impl_name or "user jax impl") if user and SPECS[op].replaceable
             else SPECS[op] for op in config.ops]
    given = [get_framework(fw).flag for fw in users]
    if given and not any(spec.replaceable for spec in specs):
        raise UsageError(f"{' / '.join(given)} replaces only the whole op `attn`, and the ops selected "
                         f"({','.join(config.ops)}) do not include it, so your implementation would not be "
                         f"checked at all: add attn to --op (or leave --op out: it defaults to attn when "
                         f"{given[0]} is given)")
    if config.shards and (given or "attn" not in config.ops):
        why = f"it cannot be combined with {' / '.join(given)}" if given else "add attn to --op"
        raise UsageError("--shards checks the project's sharded entries of the whole op `attn` "
                         f"(torch_impl.sharded, jax_impl.sharded): {why}")
    return specs


def _hand_written(fw: str, side: Side, case: Case, device: str) -> HandWritten:
    """Run ``side.autodiff_probe`` on the case's inputs: is the gradient under test really hand-written?"""
    convert = get_framework(fw).ops.to_native
    try:
        path = side.autodiff_probe(tuple(convert(x, device) for x in case.inputs))
    except Exception as exc:                           # noqa: BLE001 - a probe problem must not end the run
        return HandWritten(side.source, None, f"could not tell: {first_line(exc)}")
    return HandWritten(side.source, path is None, path or "")


# --- the run -------------------------------------------------------------------------------------------------------

def run(config: Optional[Config] = None, progress: Optional[Callable[[int, int, str], None]] = None,
        kernels: bool = False) -> Report:
    """Run every check of ``config``; see the module docstring.  ``progress(done, total, label)`` is called
    before each (dtype, shape, trial) step and once at the end.  ``kernels`` (``--kernels``): also check the fused
    kernels (``crosscheck.kernels``) and the kernel ops (``specs.KERNEL_OPS``); without it the kernel ops are left
    out of ``config.ops``."""
    t0 = time.perf_counter()
    config = _normalised(config or Config(), kernels)
    specs = check_options(config)
    check_environment(config.device, config.frameworks)
    users = [(fw, config.user(fw).fn, config.impl_name(fw) or f"user {fw} impl") for fw in FRAMEWORKS
             if config.user(fw).fn is not None]
    for fw, fn, source in users:                       # a dtype its forward rejects: named before any work
        check_dtypes(fw, fn, source, config.dtypes)
    complex_support = {fw: probe_complex(fw, fn, get_framework(fw).impl().attn_reference)
                       for fw, fn, _ in users if config.probe_complex}
    shapes = resolve_shapes(config)
    full_paths = path_shapes(shapes, config.path_shapes)
    col = Collector(config)
    with contextlib.ExitStack() as stack:
        executors = {}
        for fw in FRAMEWORKS:
            if fw in config.frameworks:
                stack.enter_context(get_framework(fw).ops.context(config.device))
                executors[fw] = drivers.get(fw).executor(config.device)
                stack.callback(executors[fw].close)
        hand, done = _check_cases(config, col, executors, specs, shapes, full_paths, progress)
        if config.shards:                              # the sharded candidates, in their own processes
            from .shards import check as check_sharded
            check_sharded(config, col, progress)
        if kernels:                                    # the fused kernels, as more candidates (crosscheck.kernels)
            check_kernels(config, col, executors, progress)
        if progress is not None:
            progress(done, done, "done")
    reviews = {fw: review(fw, fn, source, _review_dtype(config.dtypes)) for fw, fn, source in users
               if config.review and (fw not in hand or hand[fw].hand_written is not False)}
    rows = sorted(col.rows.values(), key=lambda r: (config.ops.index(r.op), config.dtypes.index(r.dtype)))  # stable
    return Report(config, shapes, rows, col.failures, list(col.skipped), time.perf_counter() - t0,
                  versions(config.frameworks), {fw: hand[fw] for fw in FRAMEWORKS if fw in hand}, full_paths,
                  reviews, complex_support)


def _normalised(config: Config, kernels: bool) -> Config:
    """``config`` with each name once (``--op attn,attn`` checks attn once) and, without ``kernels``, without the
    kernel ops; raises UsageError for kernel ops without ``kernels``, or ``kernels`` with a user implementation or
    without the kernels' requirements."""
    config = dataclasses.replace(config, ops=tuple(dict.fromkeys(config.ops)),
                                 dtypes=tuple(dict.fromkeys(config.dtypes)),
                                 frameworks=tuple(dict.fromkeys(config.frameworks)))
    if not kernels and config.ops and all(SPECS.get(op) is not None and SPECS[op].kernel for op in config.ops):
        raise UsageError(f"{', '.join(config.ops)}: kernel ops, checked with --kernels (from Python: run(config, "
                         f"kernels=True))")
    if not kernels:
        return dataclasses.replace(config, ops=tuple(op for op in config.ops if op not in KERNEL_OPS))
    if any(config.user(fw).given for fw in FRAMEWORKS):
        raise UsageError("--kernels checks the project's fused kernels: it cannot be combined with --torch-impl / "
                         "--jax-impl")
    missing = [why for fw in config.frameworks for why in [kernels_unavailable(fw, config.device)] if why]
    if missing:
        raise UsageError(f"--kernels: {'; '.join(missing)} (--frameworks names the frameworks to check)")
    return config


def _check_cases(config: Config, col: Collector, executors: Dict[str, object], specs: List[OpSpec], shapes,
                 full_paths, progress) -> tuple:
    """Every (dtype, shape, trial) of every op on every framework's executor, into ``col``; returns (whether each
    framework's gradient is hand-written, the number of steps)."""
    hand: Dict[str, HandWritten] = {}
    all_sides = [{fw: spec.side(fw) for fw in executors} for spec in specs]
    total, done = len(config.dtypes) * len(shapes) * config.trials, 0
    for spec in specs:                                 # an op not checked in some dtypes (the kernels' dtypes)
        for dtype in config.dtypes:
            if spec.dtypes and dtype not in spec.dtypes:
                col.skip(spec.name, Oracle(Kind.FORWARD, config.frameworks[0], Party(f"{spec.name} in {dtype}")),
                         dtype, f"{spec.name} is checked in {', '.join(spec.dtypes)} only (the kernels' dtypes)")
    for dtype, shape in itertools.product(config.dtypes, shapes):    # build every program ahead (JAX: compiled in
        for *_, jobs in _step(config, specs, all_sides, full_paths, dtype, shape, 0):     # the background)
            for fw, job in jobs.items():
                executors[fw].prefetch(job)
    for dtype, shape, trial in itertools.product(config.dtypes, shapes, range(config.trials)):
        if progress is not None:
            progress(done, total, f"{dtype} n={shape[0]} d={shape[1]} e={shape[2]} trial {trial}")
        for spec, sides, case, size, jobs in _step(config, specs, all_sides, full_paths, dtype, shape, trial):
            results = {fw: executors[fw].run(job) for fw, job in jobs.items()}
            compare_case(col, spec, sides, case, dtype, shape, trial, results, size)
            for fw in results:                         # no second order (a kernel's backward): its refusal
                second_order_skips(col, spec, sides[fw], case, dtype, fw)
            for fw in results:                         # once per run, on inputs the forward has accepted
                if sides[fw].autodiff_probe is not None and fw not in hand:
                    hand[fw] = _hand_written(fw, sides[fw], case, config.device)
        done += 1
    return hand, done


def _step(config: Config, specs, all_sides, full_paths, dtype: str, shape, trial: int) -> list:
    """Per op of a (dtype, shape, trial): (spec, its sides, the case, its Jacobian's size, {framework: job})."""
    out = []
    for spec, sides in zip(specs, all_sides):
        if spec.dtypes and dtype not in spec.dtypes:
            continue                                   # skipped once per dtype (_check_cases)
        case = Case(spec, dtype, shape, trial, config.seed, shape in full_paths)
        size = jacrev_size(spec, case, shape, dtype)
        jacrev = 0 < size <= config.jacrev_max_elements
        out.append((spec, sides, case, size, {fw: Job(side, spec, case, dtype, jacrev) for fw, side in sides.items()}))
    return out


def _review_dtype(dtypes) -> str:
    """The review runs in float64 if it is checked (the forward accepts it), else in the first real dtype
    checked, else in float64 anyway (a complex-only run: the contract is real)."""
    real = [d for d in dtypes if not dtype_info(d).is_complex]
    return "float64" if "float64" in dtypes or not real else real[0]

