"""The committed full GPU-static run (``benchmarks/results/gpu_static_full.json``, written by ``python -m
benchmarks.gpu_static --update-results``): it holds every launch variant the launchers make at every shape, arch
and configuration of ``triton_attn.CONFIGS`` and every Pallas entry at every shape, and its rows in the
``--check`` scope are the committed ``--check`` table's (the same compiler on the same code gives the same
figures; a table left behind by a change of a kernel or of the launch table fails here).  Reads the JSON only:
no compiler runs."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install triton)")   # triton_attn imports it

from benchmarks.gpu_static import ROW_KEYS, triton_side  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.support.gpu_static import launcher_variants  # noqa: E402
from torch_impl.kernels import triton_attn as T  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FULL = json.loads((RESULTS / "gpu_static_full.json").read_text(encoding="utf-8"))
CHECK = json.loads((RESULTS / "gpu_static.json").read_text(encoding="utf-8"))
TRITON = [r for r in FULL["rows"] if r["framework"] == "triton"]
PALLAS = [r for r in FULL["rows"] if r["framework"] == "pallas"]
FIGURES = ("compiled", "registers", "spill_store_bytes", "spill_load_bytes", "shared_bytes", "shared_limit", "mma",
           "mufu", "ffma", "mufu_per_element", "problems")


def _config(r: dict):
    c = r["config"]
    return None if c is None else (c["block_q"], c["block_k"], c["num_warps"], c["num_stages"])


def _key(r: dict) -> tuple:
    return r["framework"], r["arch"], r["dtype"], r["d"], r["e"], r["variant"], _config(r)


def _table_arch(arch: str) -> str:
    return arch if arch in T.ARCHS else "sm_90a"       # sm_100a: the H100 table's configurations (triton_side.jobs)


def test_it_is_a_full_run_with_the_row_schema():
    assert FULL["meta"]["check"] is False
    assert all(set(r) == set(ROW_KEYS) for r in FULL["rows"])
    assert {r["arch"] for r in TRITON} == set(triton_side.ARCH_CAPS)
    assert len({_key(r) for r in FULL["rows"]}) == len(FULL["rows"])            # one row per variant and config


def test_every_launch_variant_at_every_shape_dtype_and_arch():
    """A variant is compiled wherever its table entry holds a configuration (an empty entry runs ATen), the dK/dV
    kernels asked for only G_K or G_V included."""
    for arch in triton_side.ARCH_CAPS:
        for key in T.DTYPE_KEYS:
            for d, e in triton_side.SHAPES:
                width = T.width_of(d, e)
                want = {v for v in launcher_variants()
                        if T.launch_configs(_table_arch(arch), key, v.split()[0], width)}
                got = {r["variant"] for r in TRITON if (r["arch"], r["dtype"], r["d"], r["e"]) == (arch, key, d, e)}
                assert got == want, (arch, key, d, e, sorted(got ^ want))


def test_every_configuration_of_each_autotune_list_and_one_default():
    groups: dict = defaultdict(dict)
    for r in TRITON:
        groups[r["arch"], r["dtype"], r["d"], r["e"], r["variant"]][_config(r)] = r["default"]
    assert groups
    for (arch, key, d, e, variant), configs in groups.items():
        want = [(c.block_q, c.block_k, c.num_warps, c.num_stages)
                for c in T.launch_configs(_table_arch(arch), key, variant.split()[0], T.width_of(d, e))]
        assert set(configs) == set(want), (arch, key, d, e, variant)
        assert [c for c, default in configs.items() if default] == want[:1], (arch, key, d, e, variant)


def test_every_pallas_entry_lowers_at_every_shape():
    from benchmarks.gpu_static import pallas_side as P
    lowered = {(r["entry"], r["dtype"], r["d"], r["e"]) for r in PALLAS if r["kernel"] is not None}
    failed = [r for r in PALLAS if r["kernel"] is None]
    assert not failed, [(r["entry"], r["dtype"], r["d"], r["e"], r["error"]) for r in failed]
    assert lowered == {(entry, dtype, d, e) for entry in P.ENTRIES for dtype in P.DTYPES for d, e in P.FULL_SHAPES}
    assert {r["arch"] for r in PALLAS} == set(P.FULL_ARCHS)


def test_the_check_tables_rows_are_the_full_runs():
    """Every row of the committed ``--check`` table is in the full run, marked in its scope, with the same figures;
    and the full run marks nothing else as in the check's scope."""
    full = {_key(r): r for r in FULL["rows"]}
    for r in CHECK["rows"]:
        assert _key(r) in full, _key(r)
        other = full[_key(r)]
        assert other["in_check"] and other["default"], _key(r)
        assert {f: other[f] for f in FIGURES} == {f: r[f] for f in FIGURES}, _key(r)
    assert sum(r["in_check"] for r in FULL["rows"]) == len(CHECK["rows"])
