"""The words of ``python -m crosscheck --help``, in the order a newcomer needs them: the usage line (``USAGE``), what
it does and how to check your own solution (``DESCRIPTION``), the options, then (``EPILOG``) your own
implementation, the exit codes, what is checked, and last the error measure and tolerances."""

from __future__ import annotations

from . import metrics
from .cases import EDGE_SHAPES

__all__ = ["USAGE", "DESCRIPTION", "EPILOG"]

USAGE = "python -m crosscheck [--torch-impl MODULE:ATTR] [--jax-impl MODULE:ATTR] [options]"

DESCRIPTION = """\
Prove the hand-written gradients of tanh attention, (o, a) = (tanh(q kᵀ) v, tanh(q kᵀ)), against exact
autodiff in PyTorch and JAX, on seeded random inputs (both frameworks get identical numbers).  Check your own
solution (more under "your own implementation" below):

    python -m crosscheck --torch-impl my_attn.py:MyAttn          # JAX: --jax-impl my_attn_jax.py:attn

What is checked and how, the review, the hints, --shards and a real session: docs/crosscheck.md.
"""

EPILOG = f"""\
your own implementation (--torch-impl / --jax-impl MODULE:ATTR):
  MODULE is an importable module or a .py file; ATTR a function attn(q, k, v) -> (o, a), q (n, d), k (n, d),
  v (n, e), o (n, e), a (n, n) (torch: also your autograd.Function subclass; JAX: a custom_vjp / custom_jvp
  function).  It replaces the whole op attn (--op defaults to attn); references and oracles stay the project's:
      python -m crosscheck --torch-impl my_attn.py:MyAttn --jax-impl my_attn_jax.py:attn
  Rows of yours read "(yours)".  Without --dtype: float32 and float64, complex support probed apart (advice).
  A gradient that autodiff derives from your forward fails the run (--allow-autodiff: a NOTE only); the review
  of the lab's asks is advice (--strict: findings fail the run).  "failing" and "hint" lines name the path
  that fails and point at derivation.md.

exit codes:
  0  every comparison agrees (and a --torch-impl / --jax-impl gradient is hand-written, or --allow-autodiff);
     review findings and the complex probe are advice
  1  some comparison disagrees (a wrong number or shape, or a hand-written request that raised), each named
     (op, gradient, path, oracle, dtype, shape); or an autodiff-derived gradient; or a review finding under --strict
  2  usage or environment error, nothing judged: a bad option, an implementation that cannot be loaded, whose
     forward raises on a dtype asked for or returns wrong shapes, --device cuda without a GPU, JAX missing

what is checked:
  Ops (--op): the building blocks scores x = q kᵀ, tanh a = tanh x, mix o = a v (the functions of
  torch_impl.formulas / jax_impl.formulas) and attn, the whole op (torch_impl.attn, jax_impl.attn / attn_jvp).
  A gradient is checked on every path: each subset of the inputs requiring grad (JAX: differentiated) crossed
  with the cotangent on both outputs and on each alone (the other unused); JVP tangents on each subset; second
  order (VJP of the VJP, HVP) through the hand-written backward.  Each oracle pair is a row: the
  implementation's forward / VJP / JVP / second order vs torch.func or JAX autodiff (vjp, jacrev, jvp) of the
  plain composite reference; torch vs jax on the same numbers (VJPs by eq. 17: torch_vjp(g) =
  conj(jax_vjp(conj(g)))); float32/complex64 vs a float64/complex128 ground truth; with --shards N the sharded
  layouts too.  Shapes n d e default to {" ".join("x".join(map(str, s)) for s in EDGE_SHAPES)} plus random ones.
  --device cuda pins float32 matmuls to full precision in both frameworks (no TF32); the float64 ground truth
  is computed on the CPU.

error measure and tolerances:
  rel err = ‖actual − expected‖_F / max(‖expected‖_F, {metrics.NORM_FLOOR:g}); a comparison fails when
  rel err > tol: {", ".join(f"{k} {v:g}" for k, v in metrics.TOLERANCES.items())}
  A correct implementation's rel err is roundoff, bounded by the error model (crosscheck/metrics.py,
  docs/crosscheck.md): ≲ u·(4·k·κ + (2·c_t + 1)·sinh²(max |q kᵀ|)), u the unit roundoff (2⁻²⁴ float32,
  2⁻⁵³ float64), k ≤ 16 the longest sum, κ its cancellation, c_t ≤ {metrics.C_TANH:g} tanh's error in ulps; on any
  x86-64 CPU.  Default run (seed 0): worst rel err per row ≤ {metrics.DEFAULT_RUN_BOUNDS["float32"]:g} float32 \
(from the model),
  ≤ {metrics.DEFAULT_RUN_BOUNDS["float64"]:g} float64/complex128 (measured 3.0e-13, margin 3).  Every seed: inputs are \
drawn with
  |q kᵀ| ≤ {metrics.x_limit("float32"):.2f} (float32/complex64), ≤ {metrics.x_limit("float64"):.2f} (float64/complex128), \
a draw past it scaled down, so that the
  tanh term stays within half of tol.  A formula bug gives 1e-3 to 10.
"""
