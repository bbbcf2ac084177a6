"""One adapter per framework: what crosscheck needs of PyTorch or JAX, behind one interface, so the rest of it
never branches on the framework's name.

A :class:`Framework` holds the words a report uses for it and names its *operations module*
(``crosscheck.torch_oracles`` / ``crosscheck.jax_oracles``, imported on first use), which both provide the same
functions: docs/crosscheck.md, "Inside crosscheck".

Complex convention (derivation.md (17)): every VJP crosscheck compares is in PyTorch's convention, conjugate
Wirtinger; a framework with ``conjugate_vjp`` (JAX: plain transpose) gets conjugated cotangents and has its VJPs
conjugated back, ``torch_vjp(g) = conj(jax_vjp(conj(g)))`` — :meth:`Framework.flips` says when, :func:`eq17`
applies it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Dict, Sequence

__all__ = ["Framework", "BY_NAME", "get", "eq17"]


@dataclass(frozen=True)
class Framework:
    name: str                                  # "torch" | "jax"
    other: str                                 # the other framework checked against it
    title: str                                 # "PyTorch" | "JAX"
    short: str                                 # "torch" | "JAX", in running text
    flag: str                                  # the option that checks a user's implementation
    arrays: str                                # "torch tensors" | "JAX arrays"
    module: str                                # its operations module (see the module docstring)
    executor_path: str                         # "module:Class" running its jobs: eager, or compiled programs
    autodiff: Dict[str, str]                   # the autodiff oracles' names in oracle labels
    conjugate_vjp: bool                        # its VJP is the conjugate of PyTorch's convention (eq. (17))
    # words: an input that gets a gradient, an unused output's cotangent, what a hand-written gradient is
    requiring: str                             # "requiring grad" | "differentiated"
    requires: tuple                            # ("requires grad", "require grad") | ("is ...", "are ...")
    not_requires: tuple                        # ("does not require grad", "do not require grad") | ...
    unused: str                                # "None" | "a symbolic zero"
    hand_written: str                          # what the lab asks for, in this framework
    impl_kind: str                             # what --torch-impl / --jax-impl takes
    impl_fix: str                              # what to do when given a class that is not one
    review_clean: str                          # what a clean review looked at
    second_order_culprit: str                  # what makes a right backward non-differentiable
    subset_cause: str                          # what depends on which inputs get a gradient

    def executor(self, device: str):
        """What runs this framework's jobs (``prefetch(job)``, ``run(job)``, ``close()``): ``executor_path``."""
        module, _, name = self.executor_path.partition(":")
        return getattr(importlib.import_module(module), name)(self.name, device)

    @property
    def ops(self):
        """The operations module (imports the framework)."""
        return importlib.import_module(self.module)

    def flips(self, dtype: str) -> bool:
        """Whether cotangents go in conjugated and VJPs come back conjugated (eq. (17)): complex dtypes only."""
        from .metrics import dtype as dtype_info
        return self.conjugate_vjp and dtype_info(dtype).is_complex

    def missing(self, names: Sequence[str]) -> str:
        """``"v does not require grad"`` / ``"k and v are not differentiated"``."""
        return f"{' and '.join(names)} {self.not_requires[len(names) > 1]}"


def eq17(values: tuple, flip: bool) -> tuple:
    """A VJP result tuple (numpy, ``None`` = absent) in PyTorch's convention: conjugated when ``flip``."""
    return tuple(None if v is None else v.conj() for v in values) if flip else values


BY_NAME: Dict[str, Framework] = {
    "torch": Framework(
        name="torch", other="jax", title="PyTorch", short="torch", flag="--torch-impl", arrays="torch tensors",
        module="crosscheck.torch_oracles", executor_path="crosscheck.parts:EagerExecutor",
        autodiff={"vjp": "torch.func.vjp", "jac": "torch.func.jacrev", "jvp": "torch.func.jvp",
                  "vjp_vjp": "torch.func.vjp(vjp(ref))", "hvp": "torch.func.jvp(vjp(ref))"},
        conjugate_vjp=False, requiring="requiring grad", requires=("requires grad", "require grad"),
        not_requires=("does not require grad", "do not require grad"), unused="None",
        hand_written="an autograd.Function with backward (called through .apply), or a torch.library op with an "
                     "autograd registration",
        impl_kind="a torch.autograd.Function subclass",
        impl_fix="derive it from torch.autograd.Function (crosscheck calls its .apply)",
        review_clean="input validation, what is saved, the backward's ops, differentiability",
        second_order_culprit="a .detach(), .data, torch.no_grad() or an in-place write on a saved tensor inside "
                             "backward",
        subset_cause="what setup_context saves and backward computes for ctx.needs_input_grad"),
    "jax": Framework(
        name="jax", other="torch", title="JAX", short="JAX", flag="--jax-impl", arrays="JAX arrays",
        module="crosscheck.jax_oracles", executor_path="crosscheck.jax_executor:JaxExecutor",
        autodiff={"vjp": "jax.vjp", "jac": "jax.jacrev", "jvp": "jax.jvp", "vjp_vjp": "jax.vjp(vjp(ref))",
                  "hvp": "jax.jvp(vjp(ref))"},
        conjugate_vjp=True, requiring="differentiated", requires=("is differentiated", "are differentiated"),
        not_requires=("is not differentiated", "are not differentiated"), unused="a symbolic zero",
        hand_written="a jax.custom_vjp or jax.custom_jvp function", impl_kind="a function",
        impl_fix="give a function decorated with jax.custom_vjp (or custom_jvp)",
        review_clean="input validation, symbolic zeros, the bwd rule's ops",
        second_order_culprit="a jax.lax.stop_gradient or non-differentiable op inside the bwd rule",
        subset_cause="what the fwd rule saves and the bwd rule returns when an input's CustomVJPPrimal.perturbed is "
                     "False"),
}


def get(name: str) -> Framework:
    return BY_NAME[name]
