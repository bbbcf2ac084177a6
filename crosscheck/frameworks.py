"""One adapter per framework: what crosscheck needs of PyTorch or JAX, behind one interface, so the rest of it
never branches on the framework's name.

A :class:`Framework` holds the words a report uses for it and, as functions, the code crosscheck reaches through
it: its *operations module* (``crosscheck.torch_oracles`` / ``crosscheck.jax_oracles``, which both provide the same
functions: docs/crosscheck.md, "Inside crosscheck"), its entry package and formulas, its fields of ``Config`` and
``OpSpec``.  Every one is an import or an attribute written out in this module (a loader function or a lambda),
imported on first use, so a rename is an error an import or a test meets, and no name is looked up from a string.
The code standing above ``parts`` (what runs a framework's jobs, its review, its ``--shards`` child) is in
``crosscheck.drivers``: it imports modules that import this one.

Complex convention (derivation.md (17)): every VJP crosscheck compares is in PyTorch's convention, conjugate
Wirtinger; a framework with ``conjugate_vjp`` (JAX: plain transpose) gets conjugated cotangents and has its VJPs
conjugated back, ``torch_vjp(g) = conj(jax_vjp(conj(g)))`` — :meth:`Framework.flips` says when, :func:`eq17`
applies it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, Sequence

__all__ = ["Framework", "BY_NAME", "NAMES", "get", "eq17"]


@dataclass(frozen=True)
class Framework:
    name: str                                  # "torch" | "jax"
    other: str                                 # the other framework checked against it
    title: str                                 # "PyTorch" | "JAX"
    short: str                                 # "torch" | "JAX", in running text
    flag: str                                  # the option that checks a user's implementation
    layouts_flag: str                          # the option naming a user's sharded layouts
    arrays: str                                # "torch tensors" | "JAX arrays"
    load: Callable[[], ModuleType]             # imports the framework itself (ImportError: not installed)
    operations: Callable[[], ModuleType]       # its operations module (see the module docstring)
    autodiff: Dict[str, str]                   # the autodiff oracles' names in oracle labels
    conjugate_vjp: bool                        # its VJP is the conjugate of PyTorch's convention (eq. (17))
    # words: an input that gets a gradient, an unused output's cotangent, what a hand-written gradient is
    requiring: str                             # "requiring grad" | "differentiated"
    requires: tuple                            # ("requires grad", "require grad") | ("is ...", "are ...")
    not_requires: tuple                        # ("does not require grad", "do not require grad") | ...
    unused: str                                # "None" | "a symbolic zero"
    hand_written: str                          # what the lab asks for, in this framework
    backward: str                              # what returns the gradients, in hints: "backward" | "bwd rule"
    impl_kind: str                             # what --torch-impl / --jax-impl takes
    impl_fix: str                              # what to do when given a class that is not one
    review_clean: str                          # what a clean review looked at
    second_order_culprit: str                  # what makes a right backward non-differentiable
    subset_cause: str                          # what depends on which inputs get a gradient
    # where its pieces live
    package: Callable[[], ModuleType]          # the project's entry package: torch_impl | jax_impl
    formulas_module: Callable[[], ModuleType]  # its formulas: torch_impl.formulas | jax_impl.formulas
    entry: str                                 # the project's entry, named in hints: "torch_impl.attn"
    user_fields: Callable[[Any], tuple]        # Config -> its (impl, impl name, layouts), read by Config.user only
    with_user: Callable[[Any, Callable], Any]  # (Config, fn) -> the Config with fn as the user's implementation
    spec_side: Callable[[Any], Callable]       # OpSpec -> its factory of this framework's side
    review_keys: tuple                         # every finding key its review (crosscheck.drivers) can report
    # derivation.md's equation numbers in its convention (hints): the G_A term, the tanh factor, each gradient, all
    equations: Dict[str, str]
    other_convention: str                      # what a VJP in the other complex convention means (the probe)
    # --shards: what its entries run on, a flag giving JAX its host devices ("": none); its child: crosscheck.drivers
    units: str
    device_count_flag: str
    # the environment: what to do when it is missing, its packages' versions reported (beyond torch's, always
    # reported), the function telling why it has no GPU (crosscheck.availability), why it is not needed when left out
    missing_advice: str
    versions: Callable[[], Dict[str, str]]
    gpu_check: Callable[[], str]
    not_needed_on_gpu: str
    # --kernels: the fused kernels' library, the dtypes crosscheck checks them in, the function telling why they
    # cannot run on a device here (below); whether they run in a subprocess; the kernel ops' own entry ("": none)
    kernel_library: str
    kernel_dtypes: tuple
    kernels_check: Callable[[str], str]
    kernel_ops_entry: str

    @property
    def ops(self) -> ModuleType:
        """The operations module (imports the framework)."""
        return self.operations()

    def impl(self) -> ModuleType:
        """The project's entry package (imports the framework)."""
        return self.package()

    def formulas(self) -> ModuleType:
        """The project's formulas module (``torch_impl.formulas`` / ``jax_impl.formulas``)."""
        return self.formulas_module()

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


# --- the code each Framework reaches, imported on first use (JAX only when its side runs) ---------------------

def _torch():
    import torch
    return torch


def _jax():
    import jax
    return jax


def _torch_operations():
    from . import torch_oracles
    return torch_oracles


def _jax_operations():
    from . import jax_oracles
    return jax_oracles


def _torch_impl():
    import torch_impl
    return torch_impl


def _jax_impl():
    import jax_impl
    return jax_impl


def _torch_formulas():
    from torch_impl import formulas
    return formulas


def _jax_formulas():
    from jax_impl import formulas
    return formulas


def _jax_versions() -> Dict[str, str]:
    import jax
    import jaxlib
    return {"jax": getattr(jax, "__version__", "?"), "jaxlib": getattr(jaxlib, "__version__", "?")}


# --- why a framework's kernels cannot be checked here (Framework.kernels_check: crosscheck.kernels.unavailable) ---

def _jax_unavailable(device: str) -> str:
    """``jax_impl.kernels`` refuses a JAX older than its ``MIN_JAX`` at import."""
    try:
        import jax_impl.kernels  # noqa: F401 - the import is the check
    except ImportError as exc:
        return str(exc)
    return ""


def _torch_unavailable(device: str) -> str:
    """On the CPU the Triton interpreter must run the kernels' loops over a runtime bound, which triton 3.6's (what
    torch 2.11 installs) failed to do on this project's CI machine (tests/kernels/test_triton.py probes it); triton
    3.9's does."""
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "the torch kernels need triton, which is not installed (pip install triton)"
    if device == "cpu" and tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (3, 9):
        return (f"triton {version}'s interpreter cannot run the kernels' loops on the CPU (triton >= 3.9's can); "
                f"on a GPU they run compiled")
    return ""


# --- why a framework cannot run on the GPU (Framework.gpu_check: crosscheck.availability.check_environment) -----

def _torch_cuda_problem() -> str:
    """Why torch cannot run on CUDA here ("" when it can)."""
    import torch
    if torch.cuda.is_available():
        return ""
    why = ("this PyTorch build has no CUDA support (torch.version.cuda is None)" if torch.version.cuda is None
           else "torch.cuda.is_available() is False (no GPU visible, or a driver problem)")
    return f"PyTorch cannot use CUDA: {why} (torch {torch.__version__})"


def _jax_gpu_problem() -> str:
    """Why JAX has no GPU backend here ("" when it has)."""
    import jax
    try:
        jax.devices("gpu")
    except RuntimeError as e:
        return (f"JAX has no GPU backend: {(str(e).strip().splitlines() or [''])[0]} (jax {jax.__version__}; "
                f"install JAX with CUDA: pip install -e \".[jax-cuda]\" (docs/gpu.md))")
    return ""


BY_NAME: Dict[str, Framework] = {
    "torch": Framework(
        name="torch", other="jax", title="PyTorch", short="torch", flag="--torch-impl", layouts_flag="--torch-layouts",
        arrays="torch tensors",
        load=_torch, operations=_torch_operations,
        autodiff={"vjp": "torch.func.vjp", "jac": "torch.func.jacrev", "jvp": "torch.func.jvp",
                  "vjp_vjp": "torch.func.vjp(vjp(ref))", "hvp": "torch.func.jvp(vjp(ref))"},
        conjugate_vjp=False, requiring="requiring grad", requires=("requires grad", "require grad"),
        not_requires=("does not require grad", "do not require grad"), unused="None",
        hand_written="an autograd.Function with backward (called through .apply), or a torch.library op with an "
                     "autograd registration",
        backward="backward", impl_kind="a torch.autograd.Function subclass",
        impl_fix="derive it from torch.autograd.Function (crosscheck calls its .apply)",
        review_clean="input validation, what is saved, the backward's ops, differentiability",
        second_order_culprit="a .detach(), .data, torch.no_grad() or an in-place write on a saved tensor inside "
                             "backward",
        subset_cause="what setup_context saves and backward computes for ctx.needs_input_grad",
        package=_torch_impl, formulas_module=_torch_formulas, entry="torch_impl.attn",
        user_fields=lambda config: (config.torch_impl, config.torch_impl_name, config.torch_layouts),
        with_user=lambda config, fn: dataclasses.replace(config, torch_impl=fn),
        spec_side=lambda spec: spec.torch_side,
        review_keys=("validation", "saves_nxn", "ctx_attributes", "saves_unneeded", "recomputes", "zeros",
                     "returns_unrequested", "returns_zeros", "computes_unrequested", "a_not_differentiable",
                     "not_twice_differentiable"),
        equations={"ga": "(9)", "qk": "(10)–(12)", "q": "(11)", "k": "(12)", "v": "(13)", "all": "(9)–(13)"},
        other_convention="a missing conjugate, derivation.md (9)–(13)",
        units="ranks", device_count_flag="",
        missing_advice="Install it with `pip install -e .` (every run needs it: the float64 ground truth is torch's)",
        versions=dict, gpu_check=_torch_cuda_problem, kernel_library="triton", kernel_dtypes=("float32",),
        kernels_check=_torch_unavailable, kernel_ops_entry="",
        not_needed_on_gpu="(PyTorch's CUDA is not needed: --frameworks leaves torch out, and the float64 ground truth "
                          "is computed on the CPU)"),
    "jax": Framework(
        name="jax", other="torch", title="JAX", short="JAX", flag="--jax-impl", layouts_flag="--jax-layouts",
        arrays="JAX arrays",
        load=_jax, operations=_jax_operations,
        autodiff={"vjp": "jax.vjp", "jac": "jax.jacrev", "jvp": "jax.jvp", "vjp_vjp": "jax.vjp(vjp(ref))",
                  "hvp": "jax.jvp(vjp(ref))"},
        conjugate_vjp=True, requiring="differentiated", requires=("is differentiated", "are differentiated"),
        not_requires=("is not differentiated", "are not differentiated"), unused="a symbolic zero",
        hand_written="a jax.custom_vjp or jax.custom_jvp function", backward="bwd rule", impl_kind="a function",
        impl_fix="give a function decorated with jax.custom_vjp (or custom_jvp)",
        review_clean="input validation, symbolic zeros, the bwd rule's ops",
        second_order_culprit="a jax.lax.stop_gradient or non-differentiable op inside the bwd rule",
        subset_cause="what the fwd rule saves and the bwd rule returns when an input's CustomVJPPrimal.perturbed is "
                     "False",
        package=_jax_impl, formulas_module=_jax_formulas, entry="jax_impl.attn",
        user_fields=lambda config: (config.jax_impl, config.jax_impl_name, config.jax_layouts),
        with_user=lambda config, fn: dataclasses.replace(config, jax_impl=fn),
        spec_side=lambda spec: spec.jax_side,
        review_keys=("validation", "recomputes", "zeros"),
        equations={"ga": "(18)", "qk": "(19)–(21)", "q": "(20)", "k": "(21)", "v": "(22)", "all": "(18)–(22)"},
        other_convention="an extra conjugate (JAX's VJP has none), derivation.md (18)–(22) and (17)",
        units="devices", device_count_flag="--xla_force_host_platform_device_count",
        missing_advice="Install it with `pip install -e \".[jax]\"`, or check the PyTorch side alone with --frameworks torch",
        versions=_jax_versions, gpu_check=_jax_gpu_problem, not_needed_on_gpu="", kernel_library="pallas",
        kernel_dtypes=("float32", "float64"), kernels_check=_jax_unavailable,
        kernel_ops_entry="jax_impl.attn_o / attn_o_jvp (Pallas, {how}, default tiles)"),
}


NAMES = tuple(BY_NAME)                         # every framework, in the order runs and reports list them


def get(name: str) -> Framework:
    return BY_NAME[name]
