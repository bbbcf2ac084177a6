"""Every GPU check of the project in one command, with a verdict per check:

    python scripts/gpu_check.py              # from the repository root, on a machine with a GPU
    python scripts/gpu_check.py --dry-run    # only print what would run, and why a check would be skipped

1. ``python -m crosscheck --device cuda``: the hand-written gradients against torch.func and JAX autodiff, on the
   GPU, float32 matmuls pinned to IEEE (no TF32).  If only one framework has a GPU, ``--frameworks`` names it
   and the other is reported as not checked on the GPU.
2. ``python -m pytest tests/ -m "" -k cuda`` (case-insensitive; ``-m ""``: the
   compile tier's CUDA variant too): the CUDA variants of the OpInfo / opcheck / compile / autocast tests (they skip
   without a GPU), the fake-CUDA tests, and the Triton kernels compiled for the GPU: tests/kernels/test_triton.py
   (every test id names its device, ``cuda`` there) against the composite; step 5 times the kernels.
3. ``python -m pytest tests/impl/test_jax_impl.py tests/kernels/test_pallas.py``: the JAX tests and the Pallas kernels,
   which run on JAX's default backend -- the GPU when JAX has CUDA (``pip install -e ".[jax-cuda]"``), where the
   Pallas kernels are compiled by its Triton lowering instead of interpreted.
4. ``python -m benchmarks --quick --device cuda``: a quick CUDA benchmark; its report names the GPU, JAX's
   device and the float32 precision (written to benchmarks/scratch/quick/cuda/).
5. ``python -m benchmarks.gpu_kernels``: the kernel benchmark (docs/kernels.md, "Running on a GPU"): Triton
   fused and o-only against ATen unfused, ``torch.compile`` and SDPA flash, Pallas against ``jax.jit``, within
   its 450 s budget; writes benchmarks/scratch/gpu_kernels/gpu_kernels.{json,md}.  Without a JAX GPU its JAX
   contenders are reported not run.

Exit code: 0 every check ran and passed; 1 a check failed; 2 none failed but some could not run (no GPU in
torch or in JAX: the summary says which and why).  Written for torch 2.11 (CUDA 13) + JAX 0.11 machines; the
project's own machines have no GPU, so this has only been run there as far as finding that out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_CUDA_HINT = 'install JAX with CUDA: pip install -e ".[jax-cuda]"'


@dataclass
class Step:
    name: str
    argv: Optional[List[str]]     # None: skipped
    why_skipped: str = ""
    note: str = ""


def environment() -> dict:
    """What this machine's torch and JAX can do on a GPU (nothing is installed or changed)."""
    env = {"python": sys.version.split()[0]}
    try:
        import torch
        env["torch"] = torch.__version__
        env["torch_cuda_build"] = torch.version.cuda
        env["torch_gpu"] = bool(torch.cuda.is_available())
        env["gpu_name"] = torch.cuda.get_device_name(0) if env["torch_gpu"] else None
    except ImportError as exc:
        env.update(torch=None, torch_gpu=False, torch_why=str(exc))
    try:
        import jax
        env["jax"] = jax.__version__
        env["jax_backend"] = jax.default_backend()
        try:
            devices = jax.devices("gpu")
            env["jax_gpu"] = bool(devices)
            env["jax_gpu_name"] = devices[0].device_kind if devices else None
        except RuntimeError as exc:
            env["jax_gpu"], env["jax_why"] = False, str(exc).splitlines()[0]
    except ImportError as exc:
        env.update(jax=None, jax_gpu=False, jax_why=f"JAX not installed ({exc})")
    return env


def plan(env: dict) -> List[Step]:
    torch_gpu, jax_gpu = env.get("torch_gpu", False), env.get("jax_gpu", False)
    no_torch = f"torch {env.get('torch')} has no usable CUDA (torch.cuda.is_available() is False)"
    no_jax = f"JAX {env.get('jax')} has no GPU backend ({env.get('jax_why', '?')}); {JAX_CUDA_HINT}"
    py = sys.executable
    steps = []
    cross = [py, "-m", "crosscheck", "--device", "cuda"]
    if torch_gpu and jax_gpu:
        steps.append(Step("crosscheck on cuda (torch and JAX)", cross))
    elif torch_gpu:
        steps.append(Step("crosscheck on cuda (torch only)", cross + ["--frameworks", "torch"],
                          note=f"JAX not checked on the GPU: {no_jax}"))
    elif jax_gpu:
        steps.append(Step("crosscheck on cuda (JAX only)", cross + ["--frameworks", "jax"],
                          note=f"torch not checked on the GPU: {no_torch}"))
    else:
        steps.append(Step("crosscheck on cuda", None, f"{no_torch}; {no_jax}"))
    # the kernel tests are among the -k cuda ones (timing is step 5's, the kernel benchmark)
    steps.append(Step("CUDA tests (pytest -k cuda)", [py, "-m", "pytest", "tests/", "-m", "", "-q", "-rs", "-k",
                                                      "cuda"]
                      if torch_gpu else None, no_torch))
    steps.append(Step("JAX + Pallas tests on the GPU backend",
                      [py, "-m", "pytest", "tests/impl/test_jax_impl.py", "tests/kernels/test_pallas.py", "-q"]
                      if jax_gpu else None, no_jax))
    steps.append(Step("quick CUDA benchmark", [py, "-m", "benchmarks", "--quick", "--device", "cuda"]
                      if torch_gpu else None, no_torch,
                      note="" if jax_gpu else "its JAX contenders are left out (the report says why)"))
    steps.append(Step("kernel benchmark (Triton, Pallas)", [py, "-m", "benchmarks.gpu_kernels"]
                      if torch_gpu else None, no_torch,
                      note="" if jax_gpu else "its Pallas / jax.jit contenders are reported not run"))
    return steps


def describe(env: dict) -> str:
    torch_part = (f"torch {env.get('torch')} (CUDA build {env.get('torch_cuda_build')}) on "
                  f"{env.get('gpu_name') or 'no GPU'}")
    jax_part = (f"JAX {env.get('jax')} (default backend {env.get('jax_backend')}) on "
                f"{env.get('jax_gpu_name') or 'no GPU'}")
    return f"Python {env['python']}; {torch_part}; {jax_part}"


def run_steps(steps: List[Step], dry_run: bool) -> List[tuple]:
    results = []
    for step in steps:
        if step.argv is None:
            results.append((step, "SKIP", step.why_skipped, 0.0))
            continue
        shown = " ".join(a if " " not in a else repr(a) for a in ["python"] + step.argv[1:])
        if dry_run:
            results.append((step, "WOULD RUN", shown, 0.0))
            continue
        print(f"\n=== {step.name}: {shown}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.run(step.argv, cwd=REPO).returncode
        seconds = time.perf_counter() - t0
        verdict = "PASS" if code == 0 else "FAIL"
        detail = shown if code == 0 else f"{shown}: exit {code}" + (" (no tests selected)" if code == 5 else "")
        results.append((step, verdict, detail, seconds))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="print the checks and skips, run nothing")
    args = p.parse_args(argv)
    env = environment()
    print(describe(env), flush=True)
    results = run_steps(plan(env), args.dry_run)
    print("\nGPU check summary — " + describe(env))
    for step, verdict, detail, seconds in results:
        print(f"  {verdict:<9} {step.name:<38} {detail}" + (f"  ({seconds:.0f} s)" if seconds else ""))
        if step.note and step.argv is not None:
            print(f"  {'':<9} {'':<38} note: {step.note}")
    verdicts = [v for _, v, _, _ in results]
    if "FAIL" in verdicts:
        return 1
    return 2 if "SKIP" in verdicts else 0


if __name__ == "__main__":
    raise SystemExit(main())
