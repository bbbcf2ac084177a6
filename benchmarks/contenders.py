"""What is timed.  Every contender turns one case (sizes, dtype, inputs) and one *mode* into a zero-argument
``step()`` that runs a full forward + backward and returns the outputs and the input gradients.

Modes (which outputs reach the loss):
    ``both``  grad_o and grad_a given        ``o``  only grad_o (``a`` unused)        ``a``  only grad_a
A torch step is ``torch.autograd.grad`` of the chosen outputs; a JAX step is ``jax.jit`` of a function
returning the forward outputs *and* the VJP of the chosen outputs (returning the outputs stops XLA from
dropping forward work the backward does not need, which torch cannot drop either).
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import torch_impl

MODES = ("both", "o", "a")


@dataclass
class Case:
    n: int
    d: int
    e: int
    dtype: str  # "float32" / "float64"
    seed: int = 0
    device: str = "cpu"
    batch: int = 0      # > 0: a batched case, every array gets a leading dimension of this size (benchmarks.batched)
    # numpy copies of the inputs, shared by torch and JAX so every contender sees the same numbers
    arrays: Dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return (f"batch={self.batch}," if self.batch else "") + f"n={self.n},d={self.d},e={self.e},{self.dtype}"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def make_arrays(self) -> None:
        rng = np.random.default_rng(self.seed)
        shapes = {"q": (self.n, self.d), "k": (self.n, self.d), "v": (self.n, self.e),
                  "go": (self.n, self.e), "ga": (self.n, self.n)}
        # scaled so that q kᵀ is O(1): tanh is not saturated and the gradients are not all ~0
        scale = {"q": self.d ** -0.25 if self.d else 1.0, "k": self.d ** -0.25 if self.d else 1.0}
        if self.batch:
            shapes = {name: (self.batch, *s) for name, s in shapes.items()}
        self.arrays = {name: (rng.standard_normal(s) * scale.get(name, 1.0)).astype(self.dtype)
                       for name, s in shapes.items()}


@dataclass
class Contender:
    name: str             # key in the JSON
    label: str            # human text
    framework: str        # "torch" / "jax" / "floor"
    available: bool = True
    reason: str = ""      # why not available
    # build(case, mode) -> step; for torch contenders also fn(q, k, v) -> (o, a) for the memory probes
    build: Optional[Callable] = None
    fn: Optional[Callable] = None
    setup_seconds: Dict[str, float] = field(default_factory=dict)   # e.g. torch.compile / jit time per case
    extra: Dict[str, dict] = field(default_factory=dict)           # per-case extra facts (jax memory analysis)
    device: object = None  # JAX contenders: the jax.Device their arrays are committed to (from --device)
    # torch.compile contenders: the function compiled afresh for each case (``prepare_compiled``)
    compile_target: Optional[Callable] = None


def described(contenders: List[Contender]) -> Dict[str, dict]:
    """The contenders as the results' JSON lists them: ``{name: {label, framework, available, reason}}``."""
    return {c.name: {"label": c.label, "framework": c.framework, "available": c.available, "reason": c.reason}
            for c in contenders}


# --------------------------------------------------------------------------------------------- torch

def torch_inputs(case: Case, requires_grad: bool = True, device: Optional[str] = None):
    dt, dev = getattr(torch, case.dtype), device or case.device
    a = case.arrays
    q, k, v = (torch.tensor(a[x], dtype=dt, device=dev).requires_grad_(requires_grad) for x in ("q", "k", "v"))
    go, ga = torch.tensor(a["go"], dtype=dt, device=dev), torch.tensor(a["ga"], dtype=dt, device=dev)
    return q, k, v, go, ga


def grad_step(fn: Callable, inputs: tuple, pick: Callable) -> Callable:
    """``step()``: ``out = fn(*inputs)``, then ``(out, grads)``, the gradients w.r.t. ``inputs`` of the outputs
    ``pick(out)`` chooses, given with their cotangents: ``pick(out) -> (outputs, cotangents)`` (an input the
    outputs do not use gets ``None``)."""
    def step():
        out = fn(*inputs)
        outputs, cotangents = pick(out)
        return out, torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
    return step


def torch_step(fn: Callable, case: Case, mode: str, tensors=None) -> Callable:
    """A step of an ``fn(q, k, v) -> (o, a)`` contender in ``mode`` (``grad_step``; mode ``a``: v's gradient None)."""
    q, k, v, go, ga = tensors if tensors is not None else torch_inputs(case)
    pick = {"both": lambda out: (tuple(out), (go, ga)), "o": lambda out: ((out[0],), (go,)),
            "a": lambda out: ((out[1],), (ga,))}[mode]
    return grad_step(fn, (q, k, v), pick)


def composite(q, k, v):
    """``(o, a)`` as three torch ops, ``a = tanh(q kᵀ)``, ``o = a v`` (on stacks too), for autograd or inductor to
    differentiate: what the lab's op is timed against."""
    a = torch.tanh(q @ k.mT)
    return a @ v, a


def composite_o(q, k, v):
    """``o`` alone of :func:`composite`."""
    return torch.tanh(q @ k.mT) @ v


def _explicit_op():
    """``torch.ops.attn_lab.attn`` if some import registered it (importing torch_impl is meant to)."""
    try:
        ns = torch.ops.attn_lab
        if hasattr(ns, "attn"):
            return ns.attn, ""
        return None, "n/a (not available): torch.ops.attn_lab.attn is not registered"
    except (AttributeError, RuntimeError) as exc:  # torch.ops namespaces raise AttributeError for missing ops
        return None, f"n/a (not available): {exc}"


def _compiled(target: Callable):
    """``torch.compile(target)``, e.g. ``torch.compile(attn_reference)``: inductor (C++/OpenMP codegen on CPU).
    Built once per case after a dynamo reset, with ``dynamic=False``, so every size gets its own specialised
    kernels and the cache limit is never hit; the compile time (first fwd+bwd minus a warm one) is reported
    separately.  The dynamo reset does not clear inductor's FX-graph / kernel caches, so after a first cold case
    that figure is a cache hit.
    ``torch.compile(torch_impl.attn)`` and ``torch.compile(torch.ops.attn_lab.attn)`` are built the same way
    (``compiled_contenders``); inductor sees their formulas too (``benchmarks/inductor_code.py``)."""
    return torch.compile(target, dynamic=False)


class BareFunction(torch.autograd.Function):
    """The least any ``autograd.Function`` costs: new-style (``forward`` + ``setup_context``, as ``torch.func``
    needs), the three products (1)-(3) of ``attn_reference`` and the backward (9)-(13) in plain ops, with no
    validation, no scheduling, every gradient computed.  The floor of ``attn`` at small n, where
    ``Function.apply`` itself dominates.  Real dtypes only (no conjugates), as the benchmark's cases."""

    @staticmethod
    def forward(q, k, v):
        a = torch.tanh(q @ k.mT)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, output[1])

    @staticmethod
    def backward(ctx, g_o, g_a):
        q, k, v, a = ctx.saved_tensors
        g_x = (g_o @ v.mT + g_a) * (1 - a * a)
        return g_x @ k, g_x.mT @ q, a.mT @ g_o


def bare_function(q, k, v):
    return BareFunction.apply(q, k, v)


def torch_contenders(skip_compile: bool = False) -> List[Contender]:
    out = [
        Contender("attn", "torch_impl.attn", "torch", fn=torch_impl.attn),
        Contender("reference", "attn_reference eager (autograd)", "torch", fn=torch_impl.attn_reference),
        Contender("bare_function", "a bare new-style autograd.Function, the same products", "torch",
                  fn=bare_function),
    ]
    out += compiled_contenders({"compiled": ("torch.compile(attn_reference)", torch_impl.attn_reference),
                                "compiled_attn": ("torch.compile(torch_impl.attn)", torch_impl.attn),
                                "compiled_op": ("torch.compile(torch.ops.attn_lab.attn)", _explicit_op()[0])},
                               skip_compile)
    op, why = _explicit_op()
    out.append(Contender("op", "torch.ops.attn_lab.attn", "torch", available=op is not None, reason=why, fn=op))
    return eager_builds(out)


def eager_builds(contenders: List[Contender]) -> List[Contender]:
    """Every available eager torch contender given its ``build``: ``torch_step`` of its ``fn``."""
    for c in contenders:
        if c.available and c.compile_target is None:
            c.build = (lambda fn: lambda case, mode, tensors=None: torch_step(fn, case, mode, tensors))(c.fn)
    return contenders


def compiled_contenders(targets: Dict[str, tuple], skip: bool) -> List[Contender]:
    """One ``torch.compile`` contender per ``name: (label, function)``; the function is compiled afresh for
    each case by ``prepare_compiled`` (see ``_compiled``)."""
    out = []
    for name, (label, target) in targets.items():
        if skip:
            out.append(Contender(name, label, "torch", available=False,
                                 reason="n/a (skipped: --quick or --no-compile)"))
        elif target is None:
            out.append(Contender(name, label, "torch", available=False, reason=_explicit_op()[1]))
        else:
            out.append(Contender(name, label, "torch", fn=None, compile_target=target))
    return out


def prepare_compiled(c: Contender, case: Case) -> None:
    """Fresh dynamo state and a fresh compiled function for this case."""
    if not c.available or c.compile_target is None:
        return
    torch.compiler.reset()
    fn = _compiled(c.compile_target)
    c.fn = fn
    c.build = lambda case, mode, tensors=None: torch_step(fn, case, mode, tensors)


# --------------------------------------------------------------------------------------------- GEMM floor

def floor_step(case: Case, mode: str, prealloc: bool) -> Callable:
    """The matrix products of one fwd+bwd alone, same shapes, no autograd, no elementwise work:
    forward X = Q Kᵀ (1), O = X V (3); backward G_A = G_O Vᵀ (9), G_V = Aᵀ G_O (13), G_Q = G_X K (11),
    G_K = G_Xᵀ Q (12).  Mode ``a`` needs only four (no G_O).  ``prealloc`` writes into buffers allocated
    once (pure compute: no page faults for fresh n×n outputs)."""
    q, k, v, go, ga = torch_inputs(case, requires_grad=False)
    dt, dev = q.dtype, q.device
    n, d, e = case.n, case.d, case.e
    if not prealloc:
        def step():
            x = q @ k.mT
            o = x @ v
            if mode == "a":
                return o, ga @ k, ga.mT @ q
            g = go @ v.mT
            return o, x.mT @ go, g @ k, g.mT @ q
        return step
    x, g = torch.empty(n, n, dtype=dt, device=dev), torch.empty(n, n, dtype=dt, device=dev)
    o, gv = torch.empty(n, e, dtype=dt, device=dev), torch.empty(n, e, dtype=dt, device=dev)
    gq, gk = torch.empty(n, d, dtype=dt, device=dev), torch.empty(n, d, dtype=dt, device=dev)

    def step_out():
        torch.mm(q, k.mT, out=x)
        torch.mm(x, v, out=o)
        gx = ga
        if mode != "a":
            torch.mm(go, v.mT, out=g)
            torch.mm(x.mT, go, out=gv)
            gx = g
        torch.mm(gx, k, out=gq)
        torch.mm(gx.mT, q, out=gk)
        return o, gq, gk, gv
    return step_out


def eager_floor_step(case: Case, mode: str) -> Callable:
    """The least an eager torch implementation can take: the GEMM floor's products plus ATen's own elementwise
    kernels, (2) ``tanh_`` in place on X and (10) ``tanh_backward`` in place on Ĝ_A (fused with (9) by ``addmm``
    when both gradients come in), every output preallocated but the one fresh n×n buffer an implementation must
    return (``a``); no autograd, no checks, no Python between the kernels."""
    q, k, v, go, ga = torch_inputs(case, requires_grad=False)
    n, d, e = case.n, case.d, case.e
    g = torch.empty(n, n, dtype=q.dtype, device=q.device)
    o, gv, gq, gk = (torch.empty(n, m, dtype=q.dtype, device=q.device) for m in (e, e, d, d))

    def step():
        a = torch.mm(q, k.mT).tanh_()                                # (1), (2)
        torch.mm(a, v, out=o)                                        # (3)
        if mode == "a":
            torch.ops.aten.tanh_backward.grad_input(ga, a, grad_input=g)            # (10), Ĝ_A = G_A
        else:
            if mode == "both":
                torch.addmm(ga, go, v.mT, out=g)                     # (9)
            else:
                torch.mm(go, v.mT, out=g)                            # (9), G_A absent
            torch.mm(a.mT, go, out=gv)                               # (13)
            torch.ops.aten.tanh_backward.grad_input(g, a, grad_input=g)             # (10)
        torch.mm(g, k, out=gq)                                       # (11)
        torch.mm(g.mT, q, out=gk)                                    # (12)
        return a, o, gq, gk, None if mode == "a" else gv             # mode a: v gets no gradient
    return step


def floor_contenders() -> List[Contender]:
    return [
        Contender("gemm_floor", "GEMM floor (the 6 matmuls, fresh outputs)", "floor",
                  build=lambda case, mode, tensors=None: floor_step(case, mode, prealloc=False)),
        Contender("gemm_floor_prealloc", "GEMM floor, preallocated outputs", "floor",
                  build=lambda case, mode, tensors=None: floor_step(case, mode, prealloc=True)),
        Contender("eager_floor", "eager floor (GEMM floor + ATen's tanh_ and tanh_backward, one fresh n×n)",
                  "floor", build=lambda case, mode, tensors=None: eager_floor_step(case, mode)),
    ]


# --------------------------------------------------------------------------------------------- precision

# float32 matmuls at full IEEE precision in both frameworks, so a JAX-vs-torch ratio never compares TF32 with
# fp32 (torch's CUDA default is IEEE, JAX's dots default to TF32 on Ampere and later).  Measured, not assumed:
# the report shows torch's settings read back during the run and the precision of every dot in JAX's lowering.
JAX_FP32_PRECISION = "float32"   # full precision (HIGHEST); every JAX accepts this spelling, not "highest"


def _torch_matmul_precision_attrs():
    """The per-backend float32 matmul settings of torch >= 2.9 (``fp32_precision``), or [] on older torch.  Only
    the new API is read and written: once it has been used, the legacy getters raise (mixing the two APIs)."""
    out = []
    for name, obj in (("cuda.matmul", getattr(torch.backends.cuda, "matmul", None)),
                      ("mkldnn.matmul", getattr(torch.backends.mkldnn, "matmul", None))):
        if obj is not None and hasattr(obj, "fp32_precision"):
            out.append((name, obj))
    return out


def torch_fp32_precision() -> Dict[str, str]:
    """torch's float32 matmul settings as they are now (for the report)."""
    attrs = _torch_matmul_precision_attrs()
    if attrs:
        return {name: str(obj.fp32_precision) for name, obj in attrs}
    return {"float32_matmul_precision": torch.get_float32_matmul_precision()}


@contextlib.contextmanager
def pinned_fp32_precision():
    """torch's float32 matmuls at IEEE precision (no TF32, no bf16 passes) for the duration, restored after.
    JAX's dots are pinned where they are lowered (``jax_step``), so no global JAX state is touched."""
    attrs = _torch_matmul_precision_attrs()
    if attrs:
        saved = [(obj, obj.fp32_precision) for _, obj in attrs]
        try:
            for obj, _ in saved:
                obj.fp32_precision = "ieee"
            yield
        finally:
            for obj, value in saved:
                obj.fp32_precision = value
    else:  # torch < 2.9: the legacy API only
        saved = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("highest")
            yield
        finally:
            torch.set_float32_matmul_precision(saved)


# --------------------------------------------------------------------------------------------- JAX

def jax_device(device: str):
    """The ``jax.Device`` for ``--device`` (``cpu``, ``cuda``, ``cuda:N``), or ``(None, why not)``.  Always an
    explicit device: with a CUDA-enabled JAX, JAX's *default* device is the GPU even when torch runs on the CPU."""
    import jax

    platform, _, index = device.partition(":")
    index = int(index) if index else 0
    kind = {"cpu": "cpu", "cuda": "gpu"}.get(platform)
    if kind is None:
        return None, f"JAX contenders need --device cpu or cuda[:N], got {device!r}"
    try:
        devices = jax.devices(kind)
    except RuntimeError as exc:   # no such backend in this jaxlib
        return None, (f"--device {device}, but this JAX ({jax.__version__}, default backend "
                      f"{jax.default_backend()}) has no GPU backend ({str(exc).splitlines()[0]}); "
                      f"install JAX with CUDA (pip install -e \".[jax-cuda]\") or pass --no-jax")
    if index >= len(devices):
        return None, f"--device {device}, but JAX sees only {len(devices)} {kind} device(s): {devices}"
    return devices[index], ""


def describe_jax_device(dev) -> str:
    return f"{dev.platform}:{dev.id} ({dev.device_kind})"


def jax_contenders(skip: bool = False, device: str = "cpu") -> List[Contender]:
    names = [("jax_attn", "jax.jit(jax.vjp(jax_impl.attn)) custom_vjp", "attn"),
             ("jax_reference", "jax.jit(jax.vjp(jax_impl.attn_reference)) autodiff", "attn_reference")]
    if skip:
        return [Contender(n, l, "jax", available=False, reason="n/a (skipped: --no-jax)") for n, l, _ in names]
    try:
        import jax
        jax.config.update("jax_enable_x64", True)   # float64 cases; float32 arrays stay float32
        import jax_impl
    except Exception as exc:  # ImportError, or a half-built jax_impl
        return [Contender(n, l, "jax", available=False, reason=f"n/a (not available): {type(exc).__name__}: {exc}")
                for n, l, _ in names]
    dev, why = jax_device(device)
    if dev is None:
        return [Contender(n, l, "jax", available=False, reason=f"n/a (not run): {why}") for n, l, _ in names]
    out = []
    for name, label, attr in names:
        fn = getattr(jax_impl, attr, None)
        if fn is None:
            out.append(Contender(name, label, "jax", available=False,
                                 reason=f"n/a (not available): jax_impl.{attr} does not exist"))
            continue
        c = Contender(name, label, "jax", fn=fn, device=dev)
        c.build = (lambda c: lambda case, mode, tensors=None: jax_step(c, case, mode))(c)
        out.append(c)
    return out


def jax_step(c: Contender, case: Case, mode: str) -> Callable:
    import jax

    fn = c.fn
    # committed to the --device's jax.Device: jit then runs there, never on JAX's default device
    arr = {x: jax.device_put(case.arrays[x], c.device) for x in ("q", "k", "v", "go", "ga")}
    if mode == "both":
        f, cot = (lambda q, k, v: tuple(fn(q, k, v))), (arr["go"], arr["ga"])
    elif mode == "o":
        f, cot = (lambda q, k, v: fn(q, k, v)[0]), arr["go"]
    else:
        f, cot = (lambda q, k, v: fn(q, k, v)[1]), arr["ga"]

    def fwd_bwd(q, k, v, cot):
        out, pullback = jax.vjp(f, q, k, v)
        return out, pullback(cot)

    step, lowered, seconds, memory = jax_compiled(fwd_bwd, (arr["q"], arr["k"], arr["v"], cot))
    c.setup_seconds[f"{case.key},{mode}"] = seconds
    # what the dots were lowered with (StableHLO `precision = [HIGHEST, HIGHEST]`), for the report
    c.extra[f"{case.key},{mode}"] = {"dot_precision": sorted(
        set(re.findall(r"precision = \[(\w+), \w+\]", lowered.as_text()))), **memory}
    return step


def jax_compiled(f: Callable, args: tuple):
    """``jax.jit(f)`` lowered at ``args`` with float32 dots pinned (``JAX_FP32_PRECISION``, fixed in the executable)
    and compiled: ``(step, lowered, seconds, memory)``; ``step()`` runs it to completion, ``memory`` is XLA's
    ``{"temp_bytes", "output_bytes"}`` (empty where a backend or version has no memory analysis)."""
    import jax

    t0 = time.perf_counter()
    with jax.default_matmul_precision(JAX_FP32_PRECISION):
        lowered = jax.jit(f).lower(*args)
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    try:
        ma = compiled.memory_analysis()
        memory = {"temp_bytes": int(ma.temp_size_in_bytes), "output_bytes": int(ma.output_size_in_bytes)}
    except Exception:  # memory_analysis is best effort (not every backend/version has it)
        memory = {}
    return (lambda: jax.block_until_ready(compiled(*args))), lowered, seconds, memory


def to_numpy_grads(result) -> List[np.ndarray]:
    """(outputs, grads) of any step -> [dq, dk, dv] as numpy; ``None`` (torch) and zeros (JAX) both mean
    "no gradient" (``dv`` in mode ``a``)."""
    _, grads = result
    # .cpu() first: a CUDA (or any non-CPU) tensor has no numpy view; on a CPU tensor it is a no-op
    return [None if g is None else np.asarray(g.detach().cpu().numpy() if isinstance(g, torch.Tensor) else g)
            for g in grads]
