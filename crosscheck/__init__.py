"""crosscheck: prove the hand-written gradients of tanh attention against exact autodiff in PyTorch and JAX.

    python -m crosscheck --help

or, from Python::

    from crosscheck import Config, run
    report = run(Config(ops=("attn",), dtypes=("float64",)))
    assert report.ok, [c.message() for c in report.failures]

Pieces: ``specs`` (op specs: what is checked, piece by piece), ``cases`` (inputs, every path a gradient can
take, a job), ``frameworks`` (one adapter per framework: its words and its operations module, ``torch_oracles``
/ ``jax_oracles``, running hand-written and autodiff derivatives; eq. (17) in one place), ``parts`` (what a
framework computes for a case), ``jax_executor`` (the JAX side as compiled programs), ``compare`` (oracle pairs
→ rows and failures), ``metrics`` (error measure, the dtype table and its tolerances), ``environment``
(versions, device checks, torch precision), ``results`` (Config, Oracle, Comparison, Row, Report), ``runner``
(the loop), ``probe`` (a user implementation's dtypes and complex support, before any work), ``review`` (a user
implementation against the lab's asks beyond right numbers: ``common``, ``torch``, ``jax``; docs/crosscheck.md),
``jaxpr`` (the one jaxpr walker), ``sharded`` (``--shards N``: the sharded entries as one more candidate, on gloo
ranks and JAX host devices), ``hints`` (the hint table), ``report`` (table and JSON), ``cli``.  Importing
this package imports neither torch nor JAX; a run imports what it checks.
"""

__version__ = "0.1.0"

from .errors import EnvironmentProblem, ImplError, UsageError
from .metrics import NORM_FLOOR, TOLERANCES
from .runner import ALL_DTYPES, DEFAULT_DTYPES, EDGE_SHAPES, Comparison, Config, Report, Row, run
from .specs import SPECS, OpSpec, Side

__all__ = ["Config", "run", "Report", "Row", "Comparison", "OpSpec", "Side", "SPECS", "TOLERANCES",
           "NORM_FLOOR", "EDGE_SHAPES", "DEFAULT_DTYPES", "ALL_DTYPES", "UsageError", "EnvironmentProblem",
           "ImplError", "__version__"]
