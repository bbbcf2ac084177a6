"""crosscheck: prove the hand-written gradients of tanh attention against exact autodiff in PyTorch and JAX.

    python -m crosscheck --help

or, from Python::

    from crosscheck import Config, run
    report = run(Config(ops=("attn",), dtypes=("float64",)))
    assert report.ok, [c.message() for c in report.failures]

Pieces (docs/crosscheck.md, "Inside crosscheck"): ``specs`` (what is checked, piece by piece), ``cases``
(inputs, every path a gradient can take), ``frameworks`` (one adapter per framework; its operations module
``torch_oracles`` / ``jax_oracles``) and ``drivers`` (each framework's executor, review and ``--shards`` child),
``parts`` and ``jax_executor`` (what a framework computes for a case), ``compare`` and ``metrics`` (oracle pairs →
rows and failures), ``oracles`` (comparison kinds, oracle pairs and their labels), ``config`` (what a run checks),
``results`` (what it found), ``runner`` (the loop), ``availability`` (installed, the device asked) and
``environment`` (numeric settings), ``probe`` (a user implementation's dtypes and complex support), ``review`` (the
lab's asks beyond right numbers), ``jaxpr``, ``shards`` (``--shards N``) and ``kernels`` (``--kernels``: the fused
Triton / Pallas kernels), two packages of one shape on one out-of-process pattern (``remote``), ``hints``,
``closing`` (the verdict, failing and hint lines), ``report`` (table, summary and JSON), ``cli`` and ``cli_text``.
Importing this package imports neither torch nor JAX; a run imports what it checks.
"""

from ._version import __version__
from .errors import EnvironmentProblem, ImplError, UsageError
from .metrics import NORM_FLOOR, TOLERANCES
from .runner import ALL_DTYPES, DEFAULT_DTYPES, EDGE_SHAPES, Comparison, Config, Report, Row, run
from .specs import SPECS, OpSpec, Side

__all__ = ["Config", "run", "Report", "Row", "Comparison", "OpSpec", "Side", "SPECS", "TOLERANCES",
           "NORM_FLOOR", "EDGE_SHAPES", "DEFAULT_DTYPES", "ALL_DTYPES", "UsageError", "EnvironmentProblem",
           "ImplError", "__version__"]
