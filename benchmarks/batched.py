"""Batched cases: attention as it is really run, over a batch (or heads) of examples.

    python -m benchmarks --batched 8x1024,32x256      # the default of a full run; ``--batched none`` skips

A batched case ``B x n`` has inputs ``q, k: (B, n, 64)``, ``v: (B, n, 64)`` (float32) and is timed with the
same machinery as the 2-D cases (``run.run_case``: interleaved, paired ratios to ``reference``, memory
probes), with these contenders under the 2-D names, so the tables and plots read the same way:

    attn          ``torch.vmap(torch_impl.attn)``          (AttnFunction's vmap rule: the Function on the stack)
    reference     the 3-D reference ``a = tanh(q @ k.mT); o = a @ v``, eager autograd
    compiled      ``torch.compile`` of that 3-D reference
    op            ``torch.vmap(torch.ops.attn_lab.attn)``  (its vmap rule: the formulas' aten ops)
    loop          a Python loop of ``torch_impl.attn`` over the batch, stacked
    jax_attn      ``jax.jit`` of the VJP of ``jax.vmap(jax_impl.attn)`` (custom_vjp)
    jax_reference ``jax.jit`` of the VJP of ``jax.vmap(jax_impl.attn_reference)`` (autodiff)

A "new n×n buffer" in the memory columns of a batched case is an allocation of at least B·n² elements, a
``(B, n, n)`` stack: one n×n buffer per example (``measure.step_memory``).
"""

from __future__ import annotations

from typing import List

import torch

import torch_impl

from . import contenders as C
from . import harness as H

DEFAULT = "8x1024,32x256"
D = E = 64
TARGETS_TITLE = "Targets: torch.compile and batched (vmap) attention"


def parse(text: str):
    """``BxN[,BxN...]`` (d=e=64) -> [(B, N), ...]; ``none`` or empty -> []."""
    if text is None or text.strip().lower() in ("", "none"):
        return []
    out = []
    for item in text.split(","):
        parts = [int(p) for p in item.strip().lower().split("x")]
        if len(parts) != 2:
            raise ValueError(f"--batched: '{item}' is not BxN")
        out.append(tuple(parts))
    return out


def loop_attn(q, k, v):
    outs = [torch_impl.attn(*x) for x in zip(q, k, v)]
    return torch.stack([o for o, _ in outs]), torch.stack([a for _, a in outs])


def torch_contenders(skip_compile: bool = False) -> List[C.Contender]:
    out = [
        C.Contender("attn", "torch.vmap(torch_impl.attn)", "torch", fn=torch.vmap(torch_impl.attn)),
        C.Contender("reference", "3-D reference eager (autograd)", "torch", fn=C.composite),
    ]
    out += C.compiled_contenders({"compiled": ("torch.compile(3-D reference)", C.composite)}, skip_compile)
    op, why = C._explicit_op()
    out.append(C.Contender("op", "torch.vmap(torch.ops.attn_lab.attn)", "torch", available=op is not None,
                           reason=why, fn=torch.vmap(op) if op is not None else None))
    out.append(C.Contender("loop", "Python loop of torch_impl.attn over the batch", "torch", fn=loop_attn))
    return C.eager_builds(out)


def jax_contenders(skip: bool = False, device: str = "cpu") -> List[C.Contender]:
    """The 2-D JAX contenders with ``jax.vmap`` around the function (``C.jax_step`` jits the VJP)."""
    out = []
    for c in C.jax_contenders(skip=skip, device=device):
        if c.available:
            import jax
            c.fn = jax.vmap(c.fn)
            c.label = c.label.replace("jax.vjp(jax_impl.", "jax.vjp(jax.vmap(jax_impl.").replace(")) ", "))) ")
        out.append(c)
    return out


def run(run_case, args, print_case) -> dict:
    """Run every batched case with ``run_case`` (``run.run_case``); returns ``{"contenders", "cases"}``."""
    contenders = (torch_contenders(skip_compile=args.no_compile)
                  + jax_contenders(skip=args.no_jax, device=args.device))
    labels = C.described(contenders)
    cases = []
    for batch, n in args.batched:
        case = C.Case(n, D, E, "float32", device=args.device, batch=batch)
        res = run_case(case, contenders, args)
        res["batch"] = batch
        cases.append(res)
        print_case(res, labels)
    return {"contenders": labels, "cases": cases}


def _find(results, batch, n):
    for c in results.get("batched", {}).get("cases", []):
        if (c["batch"], c["n"]) == (batch, n):
            return c
    return None


def evaluate_targets(results) -> list:
    """The compile and batched targets, in ``report.evaluate_targets``' format (the 2-D ones are
    ``report.evaluate_targets``')."""
    from .report import TARGET_CASE, _find as find_2d, _fmt_s, _paired, fresh_buffer_note

    out = []

    def ratio(name, case, num, den, limit, mode="both", note=""):
        r = None if case is None else _paired(case, mode, num, den)
        if r is None:
            out.append({"target": name, "met": None, "value": None, "limit": limit,
                        "detail": ("not measured" if case is None else f"n/a ({num} or {den} not available)") + note})
            return
        tn, td = case["time"][mode][num], case["time"][mode][den]
        out.append({"target": name, "met": r["median"] <= limit, "value": r["median"], "limit": limit,
                    "detail": f"median {r['median']:.3f} (IQR {r['q1']:.3f}–{r['q3']:.3f}); medians {num} "
                              f"{_fmt_s(tn['median'])}, {den} {_fmt_s(td['median'])}" + note})

    big = find_2d(results, *TARGET_CASE)
    ratio("n=4096 d=e=64 float32: torch.compile(attn) / torch.compile(attn_reference) ≤ 1.0", big,
          "compiled_attn", "compiled", 1.0, note=inductor_note(results, "compiled_attn"))
    ratio("n=4096 d=e=64 float32: torch.compile(attn_lab.attn) / torch.compile(attn_reference) ≤ 1.0", big,
          "compiled_op", "compiled", 1.0, note=inductor_note(results, "compiled_op"))
    for (batch, n), limit in (((8, 1024), 0.80), ((32, 256), 1.05)):
        case = _find(results, batch, n)
        where = f"{batch}×n={n} d=e=64 float32"
        ratio(f"{where}: vmap(attn) / 3-D reference eager ≤ {limit}", case, "attn", "reference", limit,
              note=fresh_buffer_note(case))
        ratio(f"{where}: jit(vmap(custom_vjp)) / jit(vmap(autodiff)) ≤ 1.05", case, "jax_attn", "jax_reference", 1.05)
        if case is not None and "attn" in case["memory"]:
            count = case["memory"]["attn"].get("both", {}).get("nxn_allocs_backward")
            ops = case["memory"]["attn"].get("both", {}).get("nxn_ops_backward")
            ref = case["memory"].get("reference", {}).get("both", {}).get("nxn_allocs_backward")
            out.append({"target": f"{where}: vmap(attn) backward allocates ≤ 1 new n×n buffer per example",
                        "met": None if count is None else count <= 1, "value": count, "limit": 1,
                        "detail": f"{count} (B, n, n) stack(s) {ops} (3-D reference: {ref})"})
    return out


def inductor_note(results, name) -> str:
    """What the generated code says about a compiled contender against ``compile(reference)``
    (``inductor_code.survey``): the evidence that their timed ratio is a tie."""
    from .inductor_code import describe, same_as

    survey = results.get("inductor_kernels") or {}
    ours, ref = survey.get(name), survey.get("compiled")
    if ours is None or ref is None:
        return ""
    if "error" in ours or "error" in ref:
        return f"; inductor code not read: {ours.get('error') or ref.get('error')}"
    if same_as(ours, ref):
        return f"; inductor code (n=16): the same kernels as for the reference, {describe(ours)}"
    return f"; inductor code (n=16) differs: {describe(ours)} against the reference's {describe(ref)}"


def markdown(results) -> str:
    """A report.md section: the batched cases' table (median ratio to the 3-D reference, IQR) and targets."""
    from .report import _fmt_s

    b = results.get("batched", {})
    lines = ["", "## Batched cases", "",
             "Ratios to the 3-D reference eager in the same repetition (median, IQR); fwd+bwd, float32, d=e=64.", ""]
    cases = b.get("cases", [])
    if cases:
        names = [n for n in b["contenders"] if any(n in c["time"].get("both", {}) for c in cases)]
        lines.append("| contender | " + " | ".join(f"{c['batch']}×n={c['n']} ({m})" for c in cases
                                                   for m in ("both",)) + " |")
        lines.append("|---|" + "---|" * len(cases))
        for name in names:
            row = [b["contenders"][name]["label"]]
            for c in cases:
                t, r = c["time"]["both"].get(name), c["ratio_to_reference"]["both"].get(name)
                row.append("—" if t is None else
                           f"{r['median']:.3f} ({r['q1']:.3f}–{r['q3']:.3f}); {_fmt_s(t['median'])}")
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", "Compile / jit seconds (first call minus a warm one): " + "; ".join(
            f"{c['batch']}×n={c['n']} " + ", ".join(f"{k} {max(v for v in d.values() if v is not None):.1f}"
                                                   for k, d in c["compile_seconds"].items())
            for c in cases)]
    lines += ["", f"### {TARGETS_TITLE}", ""] + H.targets_table(results.get("targets_compile_batched", []), "met")
    return "\n".join(lines) + "\n"
