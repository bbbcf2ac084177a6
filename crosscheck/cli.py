"""``python -m crosscheck`` / ``attn-crosscheck``: the command line.  See ``python -m crosscheck --help``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional, Sequence, TextIO

from . import metrics
from .errors import UsageError
from .results import FRAMEWORKS
from .results import USER_DEFAULT_DTYPES
from .runner import ALL_DTYPES, DEFAULT_DTYPES, EDGE_SHAPES, Config, dedupe, resolve_shapes, run
from .specs import SPECS

__all__ = ["main", "build_parser"]

DESCRIPTION = """\
Prove the hand-written gradients of tanh attention, (o, a) = (tanh(q kᵀ) v, tanh(q kᵀ)), against exact
autodiff in PyTorch and JAX, on seeded random inputs (both frameworks get identical numbers).

Op specs (--op): scores x = q kᵀ, tanh a = tanh x, mix o = a v (the building blocks, using the functions of
torch_impl.formulas / jax_impl.formulas, so a failing formula is pinned to its piece) and attn, the whole op
(torch_impl.attn = AttnFunction, jax_impl.attn = custom_vjp, jax_impl.attn_jvp = custom_jvp).

Paths: a gradient is checked on every path it can take — for VJPs, every non-empty subset of the inputs
requiring grad (torch: what ctx.needs_input_grad / output_mask sees) or differentiated (JAX: what
CustomVJPPrimal.perturbed sees), crossed with the cotangent on every output together and on each alone (the
other output unused: None in torch, a symbolic zero in JAX, as under jax.grad of a loss of one output);
gradients not asked for must be absent (None); JVPs with tangents on every non-empty subset of the inputs
(the others: plain tensors / symbolic zeros); and second order through the hand-written backward. Every subset
and second order run on --path-shapes shapes; the others check all inputs requiring grad, each cotangent mode,
and tangents on all inputs together and on each alone.

Oracle pairs, per op and dtype:
  <fw> impl vs <fw> reference        forward outputs of the implementation vs the plain composite
  torch hand VJP vs torch.func.vjp(ref) / torch.func.jacrev(ref)   (every input requiring grad; jacrev:
                                      materialised Jacobian, real view for complex, contracted with the cotangent)
  torch hand VJP (input subsets) vs torch.func.vjp(ref)            (only some inputs requiring grad)
  torch hand JVP vs torch.func.jvp(ref)                            (Function.jvp through forward-mode AD)
  torch hand VJP of VJP vs torch.func.vjp(vjp(ref))   second order: create_graph=True through the hand-written
                                      backward, then its VJP w.r.t. the inputs and the cotangents
  torch hand HVP vs torch.func.jvp(vjp(ref))          Hessian-vector product, forward-over-reverse: forward AD
                                      through the hand-written backward
  jax hand VJP vs jax.vjp(ref) / jax.jacrev(ref);  jax hand VJP (input subsets) vs jax.vjp(ref);
  jax hand JVP vs jax.jvp(ref);  jax hand VJP of VJP vs jax.vjp(vjp(ref)) (grad of grad through the custom rule);
  jax hand HVP vs jax.jvp(vjp(ref))
  torch vs jax                        forward outputs on the same numbers
  torch hand VJP vs jax hand VJP (eq. 17)   torch_vjp(g) = conj(jax_vjp(conj(g)))
  torch hand JVP vs jax hand JVP      (with --jax-impl alone these read "jax ... (yours) vs torch ...": the
                                      project's side is the reference, the denominator of rel err; with both
                                      --torch-impl and --jax-impl, rel err divides by the larger of the two norms)
  <fw> ... vs float64/complex128 truth      for float32/complex64 only: torch.func of the reference on the
                                      same numbers in double precision (CPU)
  torch sharded <layout> on N ranks hand VJP ... / jax sharded <layout> on N devices hand VJP ...   with
                                      --shards N: the same pairs for each sharded layout, gathered to full arrays
"""

EPILOG = f"""\
error measure and tolerances:
  rel err = ‖actual − expected‖_F / max(‖expected‖_F, {metrics.NORM_FLOOR:g}) per gradient / output (the
  table shows the worst over shapes, trials and modes); max abs = max |actual − expected| (shown, not judged).
  A comparison fails when rel err > tol, where tol depends on the dtype checked:
    {", ".join(f"{k} {v:g}" for k, v in metrics.TOLERANCES.items())}
  Correct formulas stay near the unit roundoff: on the default run the worst rel err per row is ≲ 1e-6 for
  float32 and ≲ 1e-12 for float64/complex128 (most rows 1e-16 to 1e-14; the torch-vs-jax rows reach ~3e-13
  where a gradient's norm is small).  A formula bug (missing conjugate, wrong transpose, 1 − a instead of
  1 − a², a dropped term) gives 1e-3 to 10 (the planted bugs of tests/support/planted_bugs.py on the default run).

your own implementation (--torch-impl / --jax-impl MODULE:ATTR):
  MODULE is an importable module (the current directory is on the path) or a path to a .py file; ATTR a
  function attn(q, k, v) -> (o, a) with q (n, d), k (n, d), v (n, e), o (n, e), a (n, n) — for torch it may also
  be your torch.autograd.Function subclass (its .apply is used).  It replaces the project's implementation of
  the whole op `attn` (the default --op then becomes attn); the references and oracles stay the project's.
  Checked: its forward vs the reference, its VJP (your backward / custom_vjp rule) against both autodiff oracles,
  its JVP if it has one (torch: Function.jvp via forward-mode AD; JAX: jax.jvp — a custom_vjp-only function is
  reported as skipped), and against the other framework (--torch-impl alone: JAX autodiff of the reference,
  not the project's JAX implementation; rows of yours are marked "(yours)").  Example:
      python -m crosscheck --torch-impl my_attn.py:MyAttn --jax-impl my_attn_jax.py:attn
  It only replaces the op attn: --op without attn is a usage error (exit 2).  Passing a PyTorch implementation
  to --jax-impl (or a JAX one to --torch-impl) is detected and named (exit 2).
  Dtypes: without --dtype, the lab's contract, float32 and float64; complex support is probed apart and
  reported as "complex (...): supported and right / not supported / supported but WRONG" (naming a missing
  conjugate), not counted in the verdict.  A dtype given with --dtype that your forward rejects is named
  before any work (exit 2), with the dtypes it accepts.
  Each request runs on its own (inputs requiring grad x cotangent mode, each tangent subset, each second-
  order check): a backward that raises fails that request only, listed under RAISED once per distinct
  exception with the paths that raised it, so the "failing" and "hint" lines name the path ("raises
  TypeError only when o is unused").
  Review (advice, not counted; --strict makes findings fail the run, --no-review skips it): input validation
  (the contract's bad inputs: non-tensor, 3-D q, 1-D v, mismatched d or n, mixed dtypes: a clear error naming
  the argument before any compute?), what is saved for backward (n x n tensors other than a, inputs no
  requested gradient reads, tensors kept as ctx attributes), the first-order backward's ops (recomputed tanh
  or q kᵀ, zeros materialised for an unused output, gradients computed or returned for inputs that do not
  require grad), a non-differentiable a, a backward that cannot be differentiated again; JAX: validation and
  the pullback's ops (recomputation, dense zero cotangents without symbolic_zeros=True, gradients of inputs
  not differentiated).  See docs/crosscheck.md.
  Hand-written or not: the lab asks for a hand-written backward, so crosscheck checks that autodiff does not
  derive your gradient from your forward — torch: every path of the autograd graph from o, a back to q, k, v
  passes through an autograd.Function node (call it through .apply, not .forward) or a torch.library op's
  autograd node; JAX: o, a depend on q, k, v only through jax.custom_vjp / custom_jvp calls.  If not (a plain
  function of torch / jnp ops, a CompositeImplicitAutograd-style op), the "hand" rows compare autodiff with
  autodiff: a NOTE says so and the run fails (exit 1) even if every comparison agrees; --allow-autodiff keeps
  the NOTE but lets such a run pass.
  On failure, "failing" lines group the failing gradients by the cotangent modes they fail in (o and a
  together, o alone, a alone), or name the path when only that path fails ("only when v does not require
  grad", "second order only"), and "hint" lines point at derivation.md when the pattern is clear, the most
  specific pattern first (e.g. failing only with both cotangents: a term of (9) dropped; only with a's
  cotangent: the G_A term, (9); only when o is unused: the handling of an absent G_O; only when v does not
  require grad: what is saved / skipped for needs_input_grad, section 5; only in second order: a backward that
  is not differentiable as written, or the review's finding that explains it, section 9; only complex dtypes:
  a conjugate).  --json
  writes the same closing lines (summary, failing, hints, notes), the complex probe and the review with every
  failure.

exit codes:
  0  every comparison agrees (and a --torch-impl / --jax-impl gradient is hand-written, or --allow-autodiff);
     review findings and the complex probe are advice
  1  some comparison disagrees; each is named (op, gradient/output, cotangent/tangent, oracle, dtype, shape).
     A hand-written request that raises is one failure naming its path and the exception; a gradient of
     the wrong shape is a disagreement for that gradient.  Also: --torch-impl / --jax-impl whose gradient
     is not hand-written (autodiff), unless --allow-autodiff; any review finding under --strict.
  2  usage or environment error, nothing judged (options are checked before any work; repeated names in
     --op/--dtype/--frameworks count once): bad option (e.g. --seed < 0, a --json PATH that cannot be
     written), unknown op, dtype or framework, MODULE:ATTR that cannot be loaded, --torch-impl / --jax-impl
     with an --op that excludes attn, an implementation given to the other framework's flag, an
     implementation whose forward raises (on any dtype asked for) or returns wrong shapes, --device cuda without a GPU in a framework
     checked (each one lacking it is named), JAX not installed.

GPU: --device cuda runs torch on CUDA and JAX on its GPU backend with float32 matmuls pinned to full
precision in both (torch: fp32_precision 'ieee' for cuBLAS matmuls and cuDNN convolutions, or on torch
older than 2.9 allow_tf32 = False and float32_matmul_precision 'highest', restored afterwards; JAX:
default_matmul_precision 'float32', i.e. HIGHEST), since TF32 would drown real errors.  The float64 ground truth is
computed on the CPU, so --frameworks jax --device cuda needs a GPU in JAX only.

Shapes n d e default to {" ".join("x".join(map(str, s)) for s in EDGE_SHAPES)} (1×1, n=1, d≠e, tall and wide
q/k) plus random ones.
"""


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
        parts = item.lower().split("x")
        try:
            n, d, e = (int(p) for p in parts)
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


def build_parser() -> argparse.ArgumentParser:
    d = Config()
    p = _Parser(prog="python -m crosscheck", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default=None, metavar="OPS",
                   help=f"comma-separated op specs to check, from {', '.join(SPECS)}, or 'all' (default: all; "
                        f"attn when --torch-impl/--jax-impl is given)")
    p.add_argument("--dtype", default=None, metavar="DTYPES",
                   help=f"comma-separated dtypes from {', '.join(ALL_DTYPES)} (default: {','.join(DEFAULT_DTYPES)}; "
                        f"with --torch-impl/--jax-impl the lab's contract, {','.join(USER_DEFAULT_DTYPES)}, with "
                        f"complex support probed and reported apart)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where torch and JAX compute (default: %(default)s); cuda needs a GPU in each framework "
                        "checked, see below")
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
    p.add_argument("--frameworks", default="torch,jax", metavar="FWS",
                   help="comma-separated frameworks to check: torch, jax (default: %(default)s; the cross-framework "
                        "pairs need both)")
    p.add_argument("--torch-impl", metavar="MODULE:ATTR",
                   help="check your own PyTorch attn(q, k, v) -> (o, a) (function or autograd.Function) instead "
                        "of torch_impl.attn; see below")
    p.add_argument("--jax-impl", metavar="MODULE:ATTR",
                   help="check your own JAX attn(q, k, v) -> (o, a) instead of jax_impl.attn / attn_jvp")
    p.add_argument("--strict", action="store_true",
                   help="make the review findings of --torch-impl/--jax-impl (input validation, what is saved, "
                        "recomputation, zeros, unrequested gradients, differentiability) fail the run (exit 1)")
    p.add_argument("--no-review", action="store_true",
                   help="skip the review of --torch-impl/--jax-impl (only the correctness checks)")
    p.add_argument("--allow-autodiff", action="store_true",
                   help="accept an --torch-impl/--jax-impl whose gradient autodiff derives from its forward (no "
                        "hand-written backward; e.g. a CompositeImplicitAutograd-style solution): report it in a "
                        "NOTE instead of failing the run (default: fail, exit 1; see below)")
    p.add_argument("--path-shapes", type=_nonneg, default=d.path_shapes, metavar="K",
                   help="check every path on K of the shapes (those with n, d, e >= 2 first): every non-empty subset "
                        "of the inputs requiring grad / differentiated, tangents on every subset, second order (VJP of "
                        "the VJP, HVP); the other shapes check every input requiring grad, each cotangent mode and "
                        "tangents on all inputs and on each alone (default: %(default)s)")
    p.add_argument("--jacrev-max-elements", type=_nonneg, default=d.jacrev_max_elements, metavar="N",
                   help="skip the jacrev oracles when the Jacobian has more elements (default: %(default)s)")
    p.add_argument("--shards", type=_nonneg, default=d.shards, metavar="N",
                   help="also check the sharded entries of attn on N ranks / devices (N >= 2) against the "
                        "single-device reference on every path: torch_impl.distributed's layouts (replicate, rows, "
                        "keys, all_shard0, ring) on N gloo ranks; jax_impl.ring's (rows, ring) and jax_impl.attn / "
                        "attn_jvp under jit with q's rows sharded (jit_rows, jit_rows_jvp) on N JAX host devices "
                        "(a subprocess); float64/complex128; n = N+1 (not divisible), 2N, 1 and 0.  Rows read "
                        "\"torch sharded ring on N ranks ...\" (default: 0, off; see docs/crosscheck.md)")
    p.add_argument("--torch-layouts", metavar="MODULE:ATTR", default="",
                   help="with --shards: check these torch layouts instead of torch_impl.distributed's (a dict "
                        "name -> torch_impl.distributed.Layout)")
    p.add_argument("--jax-layouts", metavar="MODULE:ATTR", default="",
                   help="with --shards: check these JAX layouts instead of jax_impl.ring.LAYOUTS (a dict name -> "
                        "f(q, k, v, *, mesh, axis) on global arrays)")
    p.add_argument("--json", metavar="PATH",
                   help="also write the results (rows, every failure, seed, versions) as JSON to PATH "
                        "(schema_version 1)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr and no table; still prints the skip reasons, the disagreements (one "
                        "line per distinct wrong result, first 25), NOTEs, the closing verdict line and its "
                        "failing/hint lines")
    return p


class _Progress:
    """Progress on stderr, only once a run has taken more than ``after`` seconds, at most once a second."""

    def __init__(self, stream: TextIO, after: float = 2.0):
        self.stream, self.after = stream, after
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.shown = False
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


def _write_json(path: str, doc) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")


def _check_writable(path: str) -> None:
    """Fail before any work if ``--json PATH`` cannot be written (by trying: permission bits do not tell root's
    story, a read-only file system or a directory in the way)."""
    if os.path.isdir(path):
        raise UsageError(f"--json {path!r} is a directory; give a file path")
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise UsageError(f"--json {path!r} cannot be written: {e.strerror or e}") from None
    if not existed:
        os.remove(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (0 agree, 1 disagree, 2 usage/environment error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:                         # argparse: --help (0) or a usage error (2, message printed)
        return int(e.code or 0)
    config = Config()
    json_ok = False
    try:
        if args.json:
            _check_writable(args.json)
            json_ok = True
        config = _config_from_args(args)
        report = run(config, progress=None if args.quiet else _Progress(sys.stderr))
    except UsageError as e:
        print(f"crosscheck: error: {e}", file=sys.stderr)
        if json_ok:
            from .report import error_json
            try:
                _write_json(args.json, error_json(config, str(e), {}))
            except OSError as oe:
                print(f"crosscheck: error: cannot write --json {args.json!r}: {oe}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("crosscheck: interrupted", file=sys.stderr)
        return 2
    from .report import format_summary, format_table, to_json
    if not args.quiet:
        print(format_table(report))
        print()
    print(format_summary(report))
    if args.json:
        try:
            _write_json(args.json, to_json(report))
        except OSError as e:
            print(f"crosscheck: error: cannot write --json {args.json!r}: {e}", file=sys.stderr)
            return 2
    return report.exit_code


def _names(text: str, option: str, allowed: Sequence[str], what: str, extra: str = "") -> tuple:
    """A comma-separated list option: each name checked, duplicates dropped (first-seen order kept)."""
    names = dedupe(_csv(text))
    if not names:
        raise UsageError(f"{option}: no {what} given; choose from {', '.join(allowed)}{extra}")
    for name in names:
        if name not in allowed:
            raise UsageError(f"{option}: unknown {what} {name!r}; choose from {', '.join(allowed)}{extra}")
    return names


def _config_from_args(args) -> Config:
    """Every option is checked before the implementations are imported and before any work."""
    from .impls import load_impl
    frameworks = _names(args.frameworks, "--frameworks", FRAMEWORKS, "framework")
    user = bool(args.torch_impl or args.jax_impl)
    default = USER_DEFAULT_DTYPES if user else DEFAULT_DTYPES
    dtypes = default if args.dtype is None else _names(args.dtype, "--dtype", ALL_DTYPES, "dtype")
    if args.op is None:
        ops = None
    else:
        ops = _names(args.op, "--op", tuple(SPECS) + ("all",), "op", " (all: every op)")
        ops = tuple(SPECS) if "all" in ops else ops
    probe = Config(shapes=args.shapes, random_shapes=args.random_shapes, seed=args.seed, n_range=args.n_range,
                   d_range=args.d_range, e_range=args.e_range)
    if not resolve_shapes(probe):
        raise UsageError("no shapes to check: --shapes none needs --random-shapes K with K >= 1")
    for option, given in (("--torch-impl", args.torch_impl), ("--jax-impl", args.jax_impl)):
        fw = option[2:-5]
        if given and fw not in frameworks:
            raise UsageError(f"{option} given but --frameworks {','.join(frameworks)} does not include {fw}")
    torch_fn = jax_fn = None
    torch_name = jax_name = ""
    if args.torch_impl:
        torch_fn, torch_name = load_impl(args.torch_impl, "--torch-impl", "torch")
    if args.jax_impl:
        try:
            import jax  # noqa: F401
        except ImportError as e:
            raise UsageError(f"--jax-impl given but JAX is not installed ({e})") from None
        jax_fn, jax_name = load_impl(args.jax_impl, "--jax-impl", "jax")
    if ops is None:
        ops = ("attn",) if (torch_fn or jax_fn) else tuple(SPECS)
    return Config(ops=ops, dtypes=dtypes, device=args.device, seed=args.seed, trials=args.trials,
                  shapes=args.shapes, random_shapes=args.random_shapes, n_range=args.n_range,
                  d_range=args.d_range, e_range=args.e_range, frameworks=frameworks, torch_impl=torch_fn,
                  torch_impl_name=torch_name, jax_impl=jax_fn, jax_impl_name=jax_name,
                  jacrev_max_elements=args.jacrev_max_elements, require_hand_written=not args.allow_autodiff,
                  path_shapes=args.path_shapes, review=not args.no_review, strict=args.strict,
                  probe_complex=user and args.dtype is None, shards=args.shards,
                  torch_layouts=args.torch_layouts, jax_layouts=args.jax_layouts)
