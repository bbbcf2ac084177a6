"""What a run checks: :class:`Config` (the CLI's options as data) and :class:`UserImpl` (a framework's fields of
it), with the dtype sets the CLI offers.  ``crosscheck.results`` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

from . import metrics
from .cases import EDGE_SHAPES
from .frameworks import NAMES, get
from .sampling import Shape
from .specs import SPECS

__all__ = ["Config", "UserImpl", "DEFAULT_DTYPES", "USER_DEFAULT_DTYPES", "ALL_DTYPES", "FRAMEWORKS"]

DEFAULT_DTYPES = ("float32", "float64", "complex128")
# a user's implementation: the lab's contract is real (complex is probed apart, see crosscheck.probe)
USER_DEFAULT_DTYPES = ("float32", "float64")
ALL_DTYPES = ("float32", "float64", "complex64", "complex128")
FRAMEWORKS = NAMES


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
    path_shapes: int = 2                               # shapes checked on every path (cases.path_shapes)
    require_hand_written: bool = True                  # an autodiff-derived attn gradient fails the run (else a NOTE)
    review: bool = True                                # review a user's attn (crosscheck.review): advice, ...
    strict: bool = False                               # ... unless strict: any finding fails the run (exit 1)
    probe_complex: bool = False                        # probe a user's complex support apart (crosscheck.probe)
    tolerances: Dict[str, float] = field(default_factory=lambda: dict(metrics.TOLERANCES))
    shards: int = 0                                    # also check the sharded entries on N ranks (crosscheck.shards)
    torch_layouts: str = ""                            # with shards: "MODULE:ATTR", layouts instead of the project's
    jax_layouts: str = ""

    def user(self, fw: str) -> "UserImpl":
        """What the user gave for framework ``fw`` (``--torch-impl``, ``--torch-layouts`` ...): the one reader of
        the per-framework fields (``Framework.user_fields`` reads them)."""
        return UserImpl(*get(fw).user_fields(self))

    def with_user(self, fw: str, fn: Callable) -> "Config":
        """This config with ``fn`` as the user's implementation for ``fw``."""
        return get(fw).with_user(self, fn)

    def impl_name(self, fw: str) -> str:
        """The name of the user's implementation checked for ``fw`` (``--torch-impl`` / ``--jax-impl``), or ""."""
        return self.user(fw).name


@dataclass(frozen=True)
class UserImpl:
    """A framework's fields of :class:`Config`: the user's implementation, its name, their sharded layouts."""

    fn: Optional[Callable]
    name: str
    layouts: str

    @property
    def given(self) -> bool:
        """An implementation given (by object, or by name before it is loaded)."""
        return self.fn is not None or bool(self.name)
