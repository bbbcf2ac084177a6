"""The GPU-static check (benchmarks/gpu_static): its PTX/cubin reader on a kernel compiled here for sm_80 and
sm_90a, its regression rules, the launch variants it captures from the launchers, its exit status, and the
committed table against the launch table it proves (``triton_attn.CONFIGS``).

Compiling needs triton with its bundled ``ptxas-blackwell`` and ``cuobjdump`` (the wheel's); no GPU.  The
launch capture runs in a child without ``TRITON_INTERPRET`` (this process has it: the kernels' tanh mode
depends on it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")

from benchmarks.gpu_static import ROW_KEYS, cubin  # noqa: E402
from benchmarks.gpu_static import __main__ as gs_main  # noqa: E402
from benchmarks.gpu_static import triton_side  # noqa: E402
from tests.conftest import ROOT, require_jax  # noqa: E402
from tests.support.gpu_static import launcher_variants  # noqa: E402

try:
    cubin.tool("ptxas"), cubin.tool("cuobjdump")
except cubin.ToolError as exc:                                    # pragma: no cover - a wheel without them
    pytest.skip(str(exc), allow_module_level=True)

TABLE = ROOT / "benchmarks" / "results" / "gpu_static.json"

_PROBE = """if True:
    import json, pathlib, sys
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from benchmarks.gpu_static import cubin

    @triton.jit
    def probe(X, Y, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            acc += tl.exp(tl.load(X + start + offs))
        tl.store(Y + offs, acc)

    out = {}
    for arch, cap in (("sm_80", 80), ("sm_90a", 90)):
        src = ASTSource(fn=probe, signature={"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 128})
        c = triton.compile(src, target=GPUTarget("cuda", cap, 32), options={"num_warps": 4, "num_stages": 2})
        fig = cubin.analyse_ptx(c.asm["ptx"], arch)
        log = (f"ptxas info : Compiling entry function 'probe' for '{arch}'\\n"
               f"ptxas info : Used {fig['registers']} registers")
        again = cubin.analyse_cubin(c.asm["cubin"], arch, log)
        try:
            cubin.analyse_ptx(c.asm["ptx"], "sm_80" if cap == 90 else "sm_90a")
            wrong = None
        except cubin.ToolError as exc:
            wrong = str(exc)
        out[arch] = dict(fig=fig, again=again, wrong=wrong)
    print(json.dumps(out))
"""


def _child(code: str) -> str:
    """Run ``code`` in a child without TRITON_INTERPRET (this process has it; compiling for a GPU target needs
    triton's compiler, not its interpreter), return its last stdout line."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:              # triton.jit reads its function's source file
        path = os.path.join(tmp, "child.py")
        with open(path, "w") as f:
            f.write(code)
        done = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def probe_figures():
    return json.loads(_child(_PROBE))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_analyse_ptx_reads_registers_spills_and_the_instruction_mix(probe_figures, arch):
    fig = probe_figures[arch]["fig"]
    assert fig["entry"] == "probe" and fig["arch"] == arch
    assert 0 < fig["registers"] <= 255
    assert fig["spill_store_bytes"] == fig["spill_load_bytes"] == 0
    assert fig["loops"] >= 1
    assert fig["mufu"].get("EX2", 0) >= 1 and fig["loop_mufu"].get("EX2", 0) >= 1      # tl.exp: MUFU.EX2
    assert fig["mma"] == {}
    again = probe_figures[arch]["again"]      # the cubin triton built, with a ptxas log: the same figures
    assert again["registers"] == fig["registers"] and again["mufu"] == fig["mufu"]


def test_analyse_ptx_reports_the_assemblers_first_error(probe_figures):
    wrong = probe_figures["sm_90a"]["wrong"]            # sm_90a PTX (wgmma's arch) does not assemble for sm_80
    assert wrong is not None and "ptxas" in wrong and ("error" in wrong.lower() or "fatal" in wrong.lower())
    with pytest.raises(ValueError, match="arch must look like"):
        cubin.analyse_ptx("", "hopper")


def test_ptxas_log_parsing():
    log = ("ptxas info    : Compiling entry function '_dkdv_kernel' for 'sm_90a'\n"
           "ptxas info    : Function properties for _dkdv_kernel\n"
           "    16 bytes stack frame, 44 bytes spill stores, 68 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers\n")
    assert cubin._parse_ptxas(log) == {"_dkdv_kernel": {"stack_bytes": 16, "spill_store_bytes": 44,
                                                        "spill_load_bytes": 68, "registers": 255}}


def _row(**kw):
    row = dict(framework="triton", entry="o_only_forward", kernel="_forward_kernel", variant="o_forward",
               flags={}, dtype="bf16", d=128, e=128, causal=False,
               config=dict(block_q=64, block_k=64, num_warps=4, num_stages=2), default=True, arch="sm_90a",
               in_check=True, compiled=True, error=None, registers=200, spill_store_bytes=0, spill_load_bytes=0,
               stack_bytes=0, shared_bytes=100 * 1024, shared_limit=227 * 1024, mma={"HGMMA": 12},
               mufu={"TANH": 32}, ffma=0, mufu_per_element=1.0, problems=[], seconds=1.0, known=None)
    row.update(kw)
    return row


def test_regression_rules():
    assert triton_side.problems(_row()) == []
    assert triton_side.problems(_row(spill_store_bytes=4, spill_load_bytes=4)) == [
        "spills 4 B stored / 4 B loaded per thread"]
    assert triton_side.problems(_row(shared_bytes=240 * 1024)) == ["shared memory 240 KiB > 227 KiB"]
    assert triton_side.problems(_row(mma={"HMMA": 64})) == ["no HGMMA (wgmma) on sm_90a"]
    assert triton_side.problems(_row(mma={"HMMA": 64}, arch="sm_80", shared_limit=163 * 1024)) == []
    assert triton_side.problems(_row(mma={}, dtype="fp32")) == []           # exact float32: FFMA by design
    assert triton_side.problems(_row(mufu_per_element=2.0)) == [
        "2 MUFU operations per score element (target 1)"]
    assert triton_side.problems(_row(compiled=False, error="CompilationError: x")) == [
        "does not compile: CompilationError: x"]
    assert set(_row()) == set(ROW_KEYS)


def test_check_exits_nonzero_on_a_regression(monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    bad = _row(spill_store_bytes=8, spill_load_bytes=8)
    bad["problems"] = triton_side.problems(bad)
    monkeypatch.setattr(triton_side, "rows", lambda *args, **kwargs: [_row(), bad])
    assert gs_main.main(["--check", "--no-pallas"]) == 1
    assert "spills 8 B stored" in capsys.readouterr().out
    monkeypatch.setattr(triton_side, "rows", lambda *args, **kwargs: [_row()])
    assert gs_main.main(["--check", "--no-pallas"]) == 0


_CAPTURE = """if True:
    import json
    from benchmarks.gpu_static import triton_side as S
    launches = S.capture("sm_90a", [(64, 64)])
    print(json.dumps(sorted({(l.dtype, S._variant(l), l.constexprs["TANH"]) for l in launches})))
"""


def test_capture_takes_every_flag_set_from_the_launchers():
    found = {tuple(x) for x in json.loads(_child(_CAPTURE))}
    per_dtype = {}
    for dtype, variant, tanh in found:
        per_dtype.setdefault(dtype, set()).add(variant)
        assert tanh == ("exact" if dtype in ("fp32", "tf32") else "approx"), (dtype, tanh)
    assert set(per_dtype) == {"fp16", "bf16", "fp32", "tf32"}
    want = launcher_variants()
    assert all(v == want for v in per_dtype.values()), {d: v ^ want for d, v in per_dtype.items()}


def test_the_committed_table_proves_every_default_launch_config():
    """Every default configuration of ``triton_attn.CONFIGS`` for fp16 / bf16 / tf32 at d = e = 64 and 128 on
    sm_80 and sm_90a appears in the committed table, every flag set of it clean (regenerate with ``python -m
    benchmarks.gpu_static`` after changing a kernel or the table)."""
    from torch_impl.kernels import triton_attn as T
    rows = json.loads(TABLE.read_text())["rows"]
    triton_rows = [r for r in rows if r["framework"] == "triton"]
    for arch in T.ARCHS:
        for key in ("fp16", "bf16", "tf32"):
            for width in (64, 128):
                for kernel in T.KERNELS:
                    mine = [r for r in triton_rows if (r["arch"], r["dtype"], r["d"], r["e"]) ==
                            (arch, key, width, width) and r["default"]
                            and r["variant"].split()[0] == kernel]
                    if not T.launch_configs(arch, key, kernel, width):     # no proven config: ATen, not compiled
                        assert not mine and not T.proven(arch, key, width)
                        continue
                    default = T.launch_config(arch, key, kernel, width)
                    assert mine, (arch, key, kernel, width)
                    for r in mine:
                        c = r["config"]
                        assert (c["block_q"], c["block_k"], c["num_warps"], c["num_stages"]) == (
                            default.block_q, default.block_k, default.num_warps, default.num_stages), r["variant"]
                        # loosened for the rows triton_side.KNOWN_PROBLEMS lists, each with its measured reason
                        assert r["problems"] == [] or r["known"], (arch, key, width, r["variant"], r["problems"])
    listed = {triton_side._known_key(r) for r in triton_rows if r["problems"]}
    assert set(triton_side.KNOWN_PROBLEMS) <= listed, set(triton_side.KNOWN_PROBLEMS) - listed   # none stale


def test_the_committed_table_proves_every_default_pallas_config():
    """The Pallas side likewise: every kernel of ``pallas_attn.KERNELS`` in bf16, fp16 and fp32 at the table's
    d = e = 128 on sm_90a has a clean row (causal or not), compiled with ``launch_config``' configuration
    (changing a default without regenerating the table fails here)."""
    require_jax()
    import jax.numpy as jnp
    import numpy as np
    import importlib
    try:
        importlib.import_module("jax_impl.kernels")    # refuses a JAX older than its MIN_JAX, in one line
    except ImportError as exc:                          # only that refusal skips (as in tests/kernels/test_pallas.py)
        if "needs JAX >=" not in str(exc):
            raise
        pytest.skip(f"the Pallas kernels cannot be imported here: {exc}")
    from jax_impl.kernels import pallas_attn as P
    rows = [r for r in json.loads(TABLE.read_text())["rows"] if r["framework"] == "pallas"]
    dtypes = {"bf16": jnp.bfloat16, "fp16": np.float16, "fp32": np.float32}
    for kernel in P.KERNELS:
        for key, dtype in dtypes.items():
            mine = [r for r in rows if r["variant"].split()[0] == kernel and r["dtype"] == key]
            assert mine, (kernel, key)
            for r in mine:
                want = P.launch_config(kernel, dtype, r["d"], r["e"])
                c = r["config"]
                assert (c["block_q"], c["block_k"], c["num_warps"], c["num_stages"]) == tuple(want), r["variant"]
                assert r["default"] and r["compiled"] and r["problems"] == [], (r["variant"], key, r["problems"])
