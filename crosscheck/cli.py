"""``python -m crosscheck`` / ``attn-crosscheck``: the command line.  See ``python -m crosscheck --help``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional, Sequence, TextIO

from .cli_text import DESCRIPTION, EPILOG, USAGE
from .errors import UsageError
from .frameworks import get
from .results import FRAMEWORKS, USER_DEFAULT_DTYPES
from .runner import ALL_DTYPES, DEFAULT_DTYPES, Config, check_names, check_options, run
from .kernels import describe as describe_kernels
from .specs import KERNEL_OPS, SPECS

__all__ = ["main", "build_parser"]

def _csv(text: str) -> List[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _range(text: str):
    try:
        lo, _, hi = text.partition(":")
        lo, hi = int(lo), int(hi if hi else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH (e.g. 1:8), got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 0 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def _shapes(text: str):
    if text.strip().lower() in ("", "none"):
        return ()
    out = []
    for item in _csv(text):
        try:
            n, d, e = (int(p) for p in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected shapes as NxDxE[,NxDxE...] (e.g. 1x1x1,5x2x3), got "
                                             f"{item!r}") from None
        if min(n, d, e) < 0:
            raise argparse.ArgumentTypeError(f"sizes must be >= 0, got {item!r}")
        out.append((n, d, e))
    return tuple(out)


def _int_at_least(minimum: int):
    """argparse type: an integer >= ``minimum``, with a clear message otherwise."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v
    return parse


_positive, _nonneg = _int_at_least(1), _int_at_least(0)


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, like crosscheck's own errors (not argparse's usage block), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"crosscheck: error: {message} (see python -m crosscheck --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The options as wide as the description and epilog around them (116 columns, argparse's default is the
    terminal's or 80), their help from column 32."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=116)


def build_parser() -> argparse.ArgumentParser:
    """The options in four groups, a student's first: your own solution, the output, what to check, the sharded
    and kernel entries."""
    d = Config()
    p = _Parser(prog="python -m crosscheck", usage=USAGE, description=DESCRIPTION, epilog=EPILOG,
                formatter_class=_Formatter)
    _add_impl_options(p.add_argument_group("your own solution"))
    _add_output_options(p.add_argument_group("output"))
    _add_check_options(p.add_argument_group("what to check"), d)
    _add_scope_options(p.add_argument_group("sharded and kernel entries"), d)
    return p


def _add_check_options(p, d: Config) -> None:
    """Ops, dtypes, device, frameworks, seed, trials, shapes, paths and the Jacobian oracle."""
    p.add_argument("--op", default=None, metavar="OPS",
                   help=f"comma-separated op specs to check, from {', '.join(SPECS)}, or 'all' (default: all; "
                        f"attn when --torch-impl/--jax-impl is given; the kernel ops {', '.join(KERNEL_OPS)} only "
                        f"with --kernels)")
    p.add_argument("--dtype", default=None, metavar="DTYPES",
                   help=f"comma-separated dtypes from {', '.join(ALL_DTYPES)} (default: {','.join(DEFAULT_DTYPES)}; "
                        f"with --torch-impl/--jax-impl the lab's contract, {','.join(USER_DEFAULT_DTYPES)}, with "
                        f"complex support probed and reported apart)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where torch and JAX compute (default: %(default)s); cuda needs a GPU in each framework "
                        "checked, see below")
    p.add_argument("--frameworks", default="torch,jax", metavar="FWS",
                   help="comma-separated frameworks to check: torch, jax (default: %(default)s; the cross-framework "
                        "pairs need both)")
    p.add_argument("--seed", type=_nonneg, default=d.seed,
                   help="seed of every random draw (inputs, cotangents, tangents, random shapes); the same seed "
                        "gives the same numbers, whatever --op/--dtype select (default: %(default)s)")
    p.add_argument("--trials", type=_positive, default=d.trials,
                   help="independent random draws of inputs and cotangents per op, dtype and shape "
                        "(default: %(default)s)")
    p.add_argument("--shapes", type=_shapes, default=d.shapes, metavar="NxDxE,...",
                   help="fixed sizes n x d x e always checked, or 'none' (default: "
                        + ",".join("x".join(map(str, s)) for s in d.shapes) + ")")
    p.add_argument("--random-shapes", type=_nonneg, default=d.random_shapes, metavar="K",
                   help="also check K shapes drawn from the ranges below (default: %(default)s)")
    for name, rng, what in (("n", d.n_range, "sequence length n"), ("d", d.d_range, "q/k width d"),
                            ("e", d.e_range, "v width e")):
        p.add_argument(f"--{name}-range", type=_range, default=rng, metavar="LOW:HIGH",
                       help=f"range of the {what} of random shapes, inclusive (default: {rng[0]}:{rng[1]})")
    p.add_argument("--path-shapes", type=_nonneg, default=d.path_shapes, metavar="K",
                   help="check every path (input subsets, tangent subsets, second order) on K of the shapes, those "
                        "with n, d, e >= 2 first; the others check all inputs requiring grad, each cotangent mode, "
                        "tangents on all inputs and on each alone (default: %(default)s)")
    p.add_argument("--jacrev-max-elements", type=_nonneg, default=d.jacrev_max_elements, metavar="N",
                   help="skip the jacrev oracles when the Jacobian has more elements (default: %(default)s)")


def _add_impl_options(p) -> None:
    """Your own implementation, the review and the autodiff check."""
    p.add_argument("--torch-impl", metavar="MODULE:ATTR",
                   help="check your own PyTorch attn(q, k, v) -> (o, a) (function or autograd.Function) instead "
                        "of torch_impl.attn; see below")
    p.add_argument("--jax-impl", metavar="MODULE:ATTR",
                   help="check your own JAX attn(q, k, v) -> (o, a) instead of jax_impl.attn / attn_jvp")
    p.add_argument("--strict", action="store_true",
                   help="make the review findings of --torch-impl/--jax-impl fail the run (exit 1)")
    p.add_argument("--no-review", action="store_true",
                   help="skip the review of --torch-impl/--jax-impl (only the correctness checks)")
    p.add_argument("--allow-autodiff", action="store_true",
                   help="accept a --torch-impl/--jax-impl whose gradient autodiff derives from its forward (no "
                        "hand-written backward): a NOTE instead of failing the run")


def _add_output_options(p) -> None:
    """-q and --json."""
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr and no table; still prints the skip reasons, the disagreements (one "
                        "line per distinct wrong result, first 25), NOTEs, the closing verdict line and its "
                        "failing/hint lines, wrapped at 120 columns (a detail line cut at 3 rows; --json keeps "
                        "every word)")
    p.add_argument("--json", metavar="PATH",
                   help="also write the results (rows, every failure, seed, versions) as JSON to PATH "
                        "(schema_version 1)")


def _add_scope_options(p, d: Config) -> None:
    """--shards and its layouts, --kernels."""
    p.add_argument("--shards", type=_nonneg, default=d.shards, metavar="N",
                   help="also check the sharded entries of attn (torch_impl.sharded.layouts.LAYOUTS on N gloo "
                        "ranks, jax_impl.sharded.layouts.LAYOUTS and jit-sharded attn on N JAX host devices) against "
                        "the single-device reference on every path (N >= 2; default: 0, off; see docs/crosscheck.md)")
    p.add_argument("--torch-layouts", metavar="MODULE:ATTR", default="",
                   help="with --shards: check these torch layouts instead of torch_impl.sharded.layouts.LAYOUTS "
                        "(a dict name -> torch_impl.sharded.layouts.Layout)")
    p.add_argument("--jax-layouts", metavar="MODULE:ATTR", default="",
                   help="with --shards: check these JAX layouts instead of jax_impl.sharded.layouts.LAYOUTS (a dict "
                        "name -> f(q, k, v, *, mesh, axis) on global arrays)")
    p.add_argument("--kernels", action="store_true",
                   help="also check the fused kernels (torch_impl's Triton, jax_impl's Pallas) on every path, and the "
                        "ops attn_o, attn_o_causal: interpreted on --device cpu, compiled on cuda; implied by --op "
                        "naming attn_o or attn_o_causal (see docs/crosscheck.md, \"Kernels\")")


class _Progress:
    """Progress on stderr, only once a run has taken more than ``after`` seconds, at most once a second."""

    def __init__(self, stream: TextIO, after: float = 2.0):
        self.stream, self.after, self.t0, self.last, self.shown = stream, after, time.perf_counter(), 0.0, False
        self.tty = getattr(stream, "isatty", lambda: False)()

    def __call__(self, done: int, total: int, label: str) -> None:
        now = time.perf_counter() - self.t0
        if label == "done":
            if self.shown:
                self.stream.write(("\r" if self.tty else "") + f"crosscheck: {done}/{total} steps in {now:.1f} s"
                                  + " " * 20 + "\n")
                self.stream.flush()
            return
        if now < self.after or now - self.last < 1.0:
            return
        self.last, self.shown = now, True
        msg = f"crosscheck: {done}/{total} steps ({label}) {now:.1f} s"
        self.stream.write(("\r" + msg + " " * 10) if self.tty else msg + "\n")
        self.stream.flush()


def _write_json(path: str, doc) -> bool:
    """Write ``--json PATH``; on failure say so on stderr and return False (the run then exits 2)."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        return True
    except OSError as e:
        print(f"crosscheck: error: cannot write --json {path!r}: {e}", file=sys.stderr)
        return False


def _check_writable(path: str) -> None:
    """Fail before any work if ``--json PATH`` cannot be written (by trying: permission bits do not tell root's
    story, a read-only file system or a directory in the way)."""
    if os.path.isdir(path):
        raise UsageError(f"--json {path!r} is a directory; give a file path")
    existed = os.path.exists(path)
    try:
        open(path, "a", encoding="utf-8").close()
    except OSError as e:
        raise UsageError(f"--json {path!r} cannot be written: {e.strerror or e}") from None
    if not existed:
        os.remove(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (0 agree, 1 disagree, 2 usage/environment error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:                         # argparse: --help (0) or a usage error (2, message printed)
        return int(e.code or 0)
    config, json_ok = Config(), False
    try:
        if args.json:
            _check_writable(args.json)
            json_ok = True
        config = _config_from_args(args)
        kernels = _kernels(args)
        report = run(config, progress=None if args.quiet else _Progress(sys.stderr), kernels=kernels)
    except UsageError as e:
        print(f"crosscheck: error: {e}", file=sys.stderr)
        if json_ok:
            from .report import error_json
            _write_json(args.json, error_json(config, str(e), {}))
        return 2
    except KeyboardInterrupt:
        print("crosscheck: interrupted", file=sys.stderr)
        return 2
    from .report import fit, format_summary, format_table, to_json
    kernel_line = "" if (args.torch_impl or args.jax_impl) else describe_kernels(report.config, kernels) + "\n"
    if args.quiet:                                   # lines that fit a terminal (report.fit)
        print(fit(kernel_line + format_summary(report)))
    else:
        print(format_table(report) + "\n\n" + kernel_line + format_summary(report))
    if args.json and not _write_json(args.json, to_json(report)):
        return 2
    return report.exit_code


def _kernels(args) -> bool:
    """``--kernels``, or an op named that only runs kernels (``specs.KERNEL_OPS``)."""
    named = _csv(args.op) if args.op else []
    return bool(args.kernels or set(named) & set(KERNEL_OPS))


def _config_from_args(args) -> Config:
    """The options as a Config, checked (``runner.check_options``) before the implementations are imported."""
    from .impls import load_impl
    user = bool(args.torch_impl or args.jax_impl)
    dtypes = (USER_DEFAULT_DTYPES if user else DEFAULT_DTYPES) if args.dtype is None else _csv(args.dtype)
    ops = (("attn",) if user else tuple(SPECS)) if args.op is None else \
        check_names(_csv(args.op), "--op", tuple(SPECS) + ("all",), "op", " (all: every op)")
    config = Config(ops=tuple(SPECS) if "all" in ops else ops, dtypes=dtypes, device=args.device, seed=args.seed,
                    trials=args.trials, shapes=args.shapes, random_shapes=args.random_shapes, n_range=args.n_range,
                    d_range=args.d_range, e_range=args.e_range, frameworks=_csv(args.frameworks),
                    torch_impl_name=args.torch_impl or "", jax_impl_name=args.jax_impl or "",
                    jacrev_max_elements=args.jacrev_max_elements, require_hand_written=not args.allow_autodiff,
                    path_shapes=args.path_shapes, review=not args.no_review, strict=args.strict,
                    probe_complex=user and args.dtype is None, shards=args.shards,
                    torch_layouts=args.torch_layouts, jax_layouts=args.jax_layouts)
    check_options(config)
    for fw in FRAMEWORKS:                             # each implementation named: loaded, once the options are right
        name, words = config.user(fw).name, get(fw)
        if name:
            try:
                words.load()
            except ImportError as e:
                raise UsageError(f"{words.flag} given but {words.title} is not installed ({e})") from None
            config = config.with_user(fw, load_impl(name, words.flag, fw)[0])
    return config
