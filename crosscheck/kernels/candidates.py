"""The kernel candidates (``crosscheck.kernels``): which there are, the sides they run, which a run selects, the line
saying what was checked, and why a framework's kernels cannot run here."""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import List, Tuple

from ..frameworks import get
from ..specs import KERNEL_OPS, _hand_side, o_only_side, without_second_order

__all__ = ["unavailable", "TILE", "KERNEL_SHAPES", "TORCH_DTYPES", "JAX_DTYPES", "SETUP_ENV", "TIMEOUT_S", "Candidate",
           "CANDIDATES", "candidate", "how", "selected", "describe", "torch_side", "jax_side"]

TILE = 16                                               # query and key rows per tile (the kernels' least)
# n = 17: two tiles, the second with one row; n = 32: exactly two tiles; n = 1; d = e = 1; d ≠ e throughout
KERNEL_SHAPES: Tuple[Tuple[int, int, int], ...] = ((17, 3, 2), (1, 2, 3), (32, 4, 5), (6, 1, 1))
PATH_SHAPES = 1                                         # the first shapes, checked on every path
# Triton: float16, bfloat16, float32 (crosscheck: float32); Pallas: also float64 (x64 is on in the run)
TORCH_DTYPES, JAX_DTYPES = get("torch").kernel_dtypes, get("jax").kernel_dtypes
SETUP_ENV = "CROSSCHECK_KERNELS_SETUP"                  # MODULE:ATTR called in the torch subprocess first (tests)
TIMEOUT_S = 600


def how(device: str) -> str:
    """``"interpreted"`` on the CPU (Triton's and Pallas' interpreters), ``"compiled"`` on CUDA."""
    return "interpreted" if device == "cpu" else "compiled"


@dataclass(frozen=True)
class Candidate:
    fw: str                                             # "torch" | "jax"
    kind: str                                           # "fused" (the lab's op (o, a)) | "o-only"
    ops: Tuple[str, ...]                                # the ops it is checked on
    entry: str                                          # what runs, in words

    def name(self, device: str) -> str:
        """Its name in oracle labels: ``"torch triton fused (interpreted)"``."""
        return f"{self.fw} {get(self.fw).kernel_library} {self.kind} ({how(device)})"

    @property
    def dtypes(self) -> Tuple[str, ...]:
        return get(self.fw).kernel_dtypes


CANDIDATES: Tuple[Candidate, ...] = (
    Candidate("torch", "fused", ("attn",), "torch_impl.attn on attn_lab::fused_forward / fused_backward (Triton)"),
    Candidate("torch", "o-only", ("attn_o", "attn_o_causal"), "torch_impl.attn_o on the Triton o-only kernels"),
    Candidate("jax", "fused", ("attn",), "jax_impl.kernels.attn_fused (Pallas)"),
    Candidate("jax", "o-only", ("attn_o", "attn_o_causal"), "jax_impl.attn_o / attn_o_jvp (Pallas)"),
)


def candidate(fw: str, kind: str) -> Candidate:
    """Framework ``fw``'s candidate of ``kind``."""
    return next(c for c in CANDIDATES if (c.fw, c.kind) == (fw, kind))


def unavailable(fw: str, device: str) -> str:
    """Why ``fw``'s kernels cannot be checked here (one line), or ``""`` (``Framework.kernels_check``)."""
    return get(fw).kernels_check(device)


def selected(config) -> List[Candidate]:
    """The candidates a run of ``config`` checks: their framework checked, one of their ops selected, one of their
    dtypes asked for."""
    return [c for c in CANDIDATES if c.fw in config.frameworks and set(c.ops) & set(config.ops)
            and set(c.dtypes) & set(config.dtypes)]


def describe(config, kernels: bool) -> str:
    """One line: the kernels a run checked and how, or that it did not and how to check them."""
    if not kernels:
        return ("kernels: not checked (the fused Triton / Pallas kernels, and ops attn_o, attn_o_causal); "
                "check them with --kernels (on CPU through the interpreters: minutes)")
    cands = selected(config)
    items = [f"{c.name(config.device)} [{', '.join(d for d in c.dtypes if d in config.dtypes)}; "
             f"{', '.join(o for o in c.ops if o in config.ops)}]" for c in cands]
    ops = [op for op in KERNEL_OPS if op in config.ops]
    items += [get(fw).kernel_ops_entry.format(how=how(config.device)) + f" on the run's shapes [{', '.join(ops)}]"
              for fw in config.frameworks if ops and get(fw).kernel_ops_entry
              and set(get(fw).kernel_dtypes) & set(config.dtypes)]
    if not items:
        return (f"kernels: none checked (they need op attn or attn_o and dtype "
                f"{' or '.join(sorted(set(TORCH_DTYPES + JAX_DTYPES)))})")
    return f"kernels: checked {'; '.join(items)}; candidates' tiles: {TILE} rows"


# --- sides --------------------------------------------------------------------------------------------------------

def torch_side(cand: Candidate, op: str, device: str):
    """The torch candidate's side on ``op``, in the subprocess (the kernels routed, see ``kernels.torch_triton.main``).  Each
    call first checks that the kernels take the inputs (else the rows would check ATen): a RuntimeError if not."""
    import torch_impl
    from torch_impl import kernels as K
    from torch_impl.kernels.o_only import attn_o_reference

    name = cand.name(device)

    def guarded(fn, applies):
        def run(*xs):
            if not applies(*xs[:3]):
                raise RuntimeError(f"{name}: the kernels do not take these inputs (torch_impl.kernels."
                                   f"{applies.__name__} is False): the rows would check ATen")
            return fn(*xs)
        return run

    if cand.kind == "fused":
        fn = guarded(torch_impl.attn, K.fused_applies)
        side = _hand_side("torch", fn, cand.entry)
        return dataclasses.replace(side, autodiff_probe=None, candidate=name)
    causal = op == "attn_o_causal"
    fn = guarded(partial(torch_impl.attn_o, causal=causal), K.triton_applies)
    return o_only_side("torch", fn, fn, partial(attn_o_reference, causal=causal),
                       cand.entry + (" (causal)" if causal else ""), candidate=name)


def _pallas_functions(P) -> tuple:
    """The Pallas module's functions a program is built from, read at call time (a test may have replaced one)."""
    return (P.attn_fused, P.attn_o, P.attn_o_jvp, P.fused_forward, P.fused_backward, P.o_only_forward,
            P.o_only_backward, P.o_only_jvp, P._attn_fused_fwd, P._attn_fused_bwd, P._attn_o_fwd, P._attn_o_bwd,
            P._attn_o_jvp_rule)


def jax_side(cand: Candidate, op: str, device: str):
    """The JAX candidate's side on ``op``: tiles of ``TILE``, interpreted on the CPU.  Its program is reused only
    for the same Pallas functions (a replaced one, e.g. a planted bug, gets a program of its own)."""
    from jax_impl.kernels import pallas_attn as P

    name = cand.name(device)
    blocks = dict(block_q=TILE, block_k=TILE, interpret=device == "cpu")
    key = ("kernel", cand.kind, op, device) + _pallas_functions(P)
    if cand.kind == "fused":
        fn = partial(P.attn_fused, **blocks)
        side = _hand_side("jax", fn, cand.entry, key=key)
        return without_second_order(dataclasses.replace(
            side, autodiff_probe=None, candidate=name, jvp=None,
            jvp_missing=f"{name}: jax_impl.kernels.attn_fused is a jax.custom_vjp: no forward-mode rule"), "jax", fn)
    causal = op == "attn_o_causal"
    fn = partial(P.attn_o, causal=causal, **blocks)
    jvp_fn = partial(P.attn_o_jvp, causal=causal, **blocks)
    return o_only_side("jax", fn, jvp_fn, partial(P.attn_o_reference, causal=causal),
                       cand.entry + (" (causal)" if causal else ""), key=key, second_order=False, candidate=name)
