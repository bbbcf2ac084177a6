"""Assemble PTX for one GPU architecture without a GPU and read what the hardware would meet.

``analyse_ptx(ptx, arch)`` runs the assembler triton itself would (``get_ptxas``): below sm_90 the bundled plain
``ptxas`` (CUDA 12.x) where it accepts the PTX, else ``ptxas-blackwell -arch=<arch> -v`` (CUDA 13.x: the only
bundled ptxas that accepts PTX 9.x), with triton's flags (``PTXAS_FLAGS``), then
``cuobjdump -res-usage`` and ``cuobjdump -sass`` on the cubin, and returns one dict per kernel entry (the first
entry's figures at top level; every entry under ``"entries"`` when the PTX has several).

Figures (all static, per thread where a register or a byte is concerned):

* ``registers``, ``spill_store_bytes``, ``spill_load_bytes``, ``stack_bytes`` (ptxas ``-v``);
* ``shared_static_bytes`` (cuobjdump ``SHARED``: the static part; a Triton kernel's dynamic shared memory is
  ``CompiledKernel.metadata.shared`` and is compared against :data:`SHARED_LIMIT` by the caller);
* ``local_bytes`` (cuobjdump ``LOCAL``);
* ``mma``: counts of SASS HGMMA (Hopper warpgroup MMA, ``wgmma``), HMMA (``mma.sync``), UTCMMA / UTCHMMA
  (Blackwell ``tcgen05``) instructions; ``mufu``: counts per MUFU op (``EX2``, ``RCP``, ``TANH``, ...);
  ``ffma``: FFMA count (a float32 kernel without tensor cores shows here);
* ``loop_mma`` / ``loop_mufu`` / ``loop_ffma``: the same counts inside loop bodies only (the address ranges a
  backward branch jumps over, merged), i.e. per iteration of the tile loop when a kernel has one loop;
* ``instructions``: the SASS instruction count.

The counts are static (instructions in the binary), not executed ones: a MUFU in the loop body runs once per
iteration per thread, so MUFU operations per score element = ``loop_mufu total × 32 × num_warps / (BLOCK_Q ×
BLOCK_K)`` for a loop over one (BLOCK_Q, BLOCK_K) tile (``mufu_per_element`` below computes it).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from typing import Dict, List, Tuple

__all__ = ["SHARED_LIMIT", "analyse_ptx", "analyse_cubin", "mufu_per_element", "tool", "ToolError", "PTXAS_FLAGS"]

#: What triton 3.9 passes its ptxas besides -v and the arch (``make_cubin``): the same code as a launch builds.
PTXAS_FLAGS = ("-lineinfo", "--regAllocOptLevel=2")

#: Per-block shared memory a kernel may opt into (bytes): A100 163 KiB, H100 / B200 227 KiB.
SHARED_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024, "sm_100a": 227 * 1024}


class ToolError(RuntimeError):
    """ptxas or cuobjdump failed; the message is the tool's first error line."""


@functools.lru_cache(maxsize=None)
def tool(name: str) -> str:
    """Path of a CUDA tool: triton's bundled binaries first, then ``PATH``."""
    try:
        import triton
        here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    except ImportError:                                   # pragma: no cover - triton is a requirement here
        here = ""
    candidates = {"ptxas": ["ptxas-blackwell", "ptxas"]}.get(name, [name])
    for cand in candidates:
        path = os.path.join(here, cand)
        if here and os.access(path, os.X_OK):
            return path
        found = shutil.which(cand)
        if found:
            return found
    raise ToolError(f"{name}: not found (looked for {', '.join(candidates)} in {here or 'triton'} and PATH)")


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower() or "fatal" in line.lower():
            return line.strip()
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[0] if lines else "no output"


def _run(args: List[str], timeout: float = 300) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ToolError(f"{os.path.basename(args[0])}: {_first_error(proc.stderr + proc.stdout)}")
    return proc.stdout + proc.stderr


_PTXAS_FUNC = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_RES_FUNC = re.compile(r"Function ([^:\s]+):\s*\n\s*(.*)")
_RES_KV = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")
_SASS_FUNC = re.compile(r"^\s*Function : (\S+)", re.M)
_SASS_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_x]+)*)\s*([^;]*);")


def _parse_ptxas(text: str) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _PTXAS_FUNC.search(line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        m = _PTXAS_STACK.search(line)
        if m:
            current.update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                           spill_load_bytes=int(m.group(3)))
        m = _PTXAS_REGS.search(line)
        if m:
            current["registers"] = int(m.group(1))
    return out


def _parse_res_usage(text: str) -> Dict[str, dict]:
    out = {}
    for m in _RES_FUNC.finditer(text):
        kv = dict((k, int(v)) for k, v in _RES_KV.findall(m.group(2)))
        out[m.group(1)] = {"shared_static_bytes": kv.get("SHARED", 0), "local_bytes": kv.get("LOCAL", 0),
                           "res_registers": kv.get("REG"), "res_stack": kv.get("STACK")}
    return out


def _loop_ranges(insns: List[Tuple[int, str, str, str]]) -> List[Tuple[int, int]]:
    """Merged [target, branch] address ranges of backward branches (loop bodies)."""
    ranges = []
    for addr, op, _, operands in insns:
        if op in ("BRA", "JMP", "BRX"):
            m = re.match(r"\s*(?:`?\(?)?(0x[0-9a-f]+)", operands)
            if m:
                target = int(m.group(1), 16)
                if target < addr:
                    ranges.append((target, addr))
    ranges.sort()
    merged: List[Tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _mix(insns) -> dict:
    mma, mufu, ffma = Counter(), Counter(), 0
    for _, op, mods, _ in insns:
        if op in ("HGMMA", "HMMA", "UTCMMA", "UTCHMMA", "UTCQMMA", "IMMA", "DMMA", "QGMMA", "IGMMA"):
            mma[op] += 1
        elif op == "MUFU":
            mufu[mods.split(".")[1] if mods else "?"] += 1
        elif op == "FFMA":
            ffma += 1
    return {"mma": dict(mma), "mufu": dict(mufu), "ffma": ffma}


def _parse_sass(text: str) -> Dict[str, dict]:
    out = {}
    funcs = list(_SASS_FUNC.finditer(text))
    for i, m in enumerate(funcs):
        body = text[m.end(): funcs[i + 1].start() if i + 1 < len(funcs) else len(text)]
        insns = [(int(a, 16), op, mods, operands) for a, _, op, mods, operands in _SASS_INSN.findall(body)]
        ranges = _loop_ranges(insns)
        loop = [ins for ins in insns if any(lo <= ins[0] <= hi for lo, hi in ranges)]
        whole, inner = _mix(insns), _mix(loop)
        out[m.group(1)] = {**whole, "loop_mma": inner["mma"], "loop_mufu": inner["mufu"],
                           "loop_ffma": inner["ffma"], "loops": len(ranges), "instructions": len(insns)}
    return out


def analyse_ptx(ptx: str, arch: str, *, keep: str = "", flags=PTXAS_FLAGS) -> dict:
    """Assemble ``ptx`` for ``arch`` ("sm_80", "sm_90a", "sm_100a", ...) and return its figures (see the module
    docstring).  Raises :class:`ToolError` with the tool's first error line when ptxas refuses the PTX.
    ``keep``: a directory to leave the cubin and SASS in (for reading by hand)."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"analyse_ptx: arch must look like 'sm_90a', got {arch!r}")
    with tempfile.TemporaryDirectory(prefix="gpu_static_") as tmp:
        src, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        log = None
        if int(re.sub(r"\D", "", arch)) < 90 and os.path.basename(tool("ptxas")) == "ptxas-blackwell":
            # as triton does (``get_ptxas``): the plain (CUDA 12) ptxas below sm_90, where it takes the PTX
            plain = os.path.join(os.path.dirname(tool("ptxas")), "ptxas")
            if os.access(plain, os.X_OK):
                try:
                    log = _run([plain, *flags, f"-arch={arch}", "-v", src, "-o", obj])
                except ToolError:
                    log = None
        if log is None:
            log = _run([tool("ptxas"), *flags, f"-arch={arch}", "-v", src, "-o", obj])
        with open(obj, "rb") as f:
            cubin = f.read()
    return analyse_cubin(cubin, arch, log, keep=keep)


def analyse_cubin(cubin: bytes, arch: str, ptxas_log: str, *, keep: str = "") -> dict:
    """The same figures from a cubin already built (e.g. ``CompiledKernel.asm["cubin"]``) and the ``-v`` log of
    the ptxas run that built it (triton prints it with ``knobs.nvidia.dump_ptxas_log``)."""
    ptxas = _parse_ptxas(ptxas_log)
    with tempfile.TemporaryDirectory(prefix="gpu_static_") as tmp:
        obj = os.path.join(tmp, "k.cubin")
        with open(obj, "wb") as f:
            f.write(cubin)
        res = _parse_res_usage(_run([tool("cuobjdump"), "-res-usage", obj]))
        sass_text = _run([tool("cuobjdump"), "-sass", obj])
        sass = _parse_sass(sass_text)
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(obj, os.path.join(keep, f"k.{arch}.cubin"))
            with open(os.path.join(keep, f"k.{arch}.sass"), "w") as f:
                f.write(sass_text)
    names = list(ptxas) or list(sass)
    entries = {}
    for name in names:
        e = {"registers": 0, "spill_store_bytes": 0, "spill_load_bytes": 0, "stack_bytes": 0}
        e.update(ptxas.get(name, {}))
        e.update({k: v for k, v in res.get(name, {}).items() if not k.startswith("res_")})
        e.setdefault("shared_static_bytes", 0)
        e.update(sass.get(name, {"mma": {}, "mufu": {}, "ffma": 0, "loop_mma": {}, "loop_mufu": {},
                                 "loop_ffma": 0, "loops": 0, "instructions": 0}))
        entries[name] = e
    if not entries:
        raise ToolError(f"ptxas: no entry function in the PTX for {arch}")
    first = dict(entries[names[0]])
    first.update(entry=names[0], arch=arch)
    if len(entries) > 1:
        first["entries"] = entries
    return first


def mufu_per_element(figures: dict, num_warps: int, tile_elements: int) -> float:
    """MUFU operations per tile element in the loop body: each static MUFU in the loop runs once per thread per
    iteration; ``tile_elements`` is the number of score elements one iteration handles (BLOCK_Q × BLOCK_K)."""
    return sum(figures.get("loop_mufu", {}).values()) * 32 * num_warps / tile_elements
