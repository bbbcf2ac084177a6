"""The docs quote the committed GPU-static table (benchmarks/results/gpu_static.json) as it is.

What this holds, for docs/kernels.md and docs/kernels-pallas.md (docs/gpu.md is scanned too and quotes none):

* every row of every Markdown table in them that has a ``registers`` and a ``spill B`` column names a row of the
  JSON (framework by the page: Triton for kernels.md, Pallas for kernels-pallas.md; arch and d = e from the
  table's header or the sentence just above it) and gives that row's tile configuration, registers, spill bytes
  (store + load), shared memory in KiB (rounded as gpu_static.md rounds it), MMA instruction counts and MUFU
  operations per score element (kernels-pallas.md also names the MUFU operations: TANH, EX2+RCP);
* kernels-pallas.md's ``--check`` table lists every Pallas row of the JSON, once each;
* the counts and extremes the prose quotes: the rows (all, per framework, per Triton arch), the largest shared
  memory per arch, the Pallas extremes and ``fused_dkdv``'s HMMA / HGMMA mix, the fp16-against-bf16 register
  spread, the run's wall time and workers (``meta``) and the per-row compile times and their sums;
* the full run's table (gpu_static_full.json): the row counts, compiled and with problems, per framework and arch,
  that kernels.md's full-run sentence quotes, and its wall time.

Pure text and JSON: no torch, triton or JAX import, so it runs in milliseconds wherever the repository is."""

from __future__ import annotations

import json
import pathlib
import re
from collections import Counter

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "benchmarks" / "results" / "gpu_static.json").read_text(encoding="utf-8"))
ROWS = TABLE["rows"]
FULL = json.loads((ROOT / "benchmarks" / "results" / "gpu_static_full.json").read_text(encoding="utf-8"))
PAGES = {"docs/kernels.md": "triton", "docs/kernels-pallas.md": "pallas", "docs/gpu.md": None}


def _page(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _flat(text: str) -> str:
    """Prose with its line breaks folded to spaces (sentences wrap anywhere)."""
    return re.sub(r"\s+", " ", text)


def _cells(line: str) -> list:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(text: str):
    """``(context, header, rows)`` of every Markdown table: ``context`` is the paragraph just above it."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if (lines[i].startswith("|") and i + 1 < len(lines)
                and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())):
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            para = []
            while j >= 0 and lines[j].strip() and not lines[j].startswith("|"):
                para.insert(0, lines[j])
                j -= 1
            header, body, k = _cells(lines[i]), [], i + 2
            while k < len(lines) and lines[k].startswith("|"):
                body.append(_cells(lines[k]))
                k += 1
            out.append((" ".join(para), header, body))
            i = k
        else:
            i += 1
    return out


def _static_tables(path: str):
    """The tables of ``path`` that quote gpu_static rows (a registers and a spill column), as dicts by header."""
    found = []
    for context, header, body in _tables(_page(path)):
        if "registers" not in header or "spill B" not in header:
            continue
        found.append((context, header, [dict(zip(header, row)) for row in body]))
    return found


def _index():
    out = {}
    for r in ROWS:
        key = (r["framework"], r["arch"], r["dtype"], r["d"], r["e"], r["variant"])
        assert key not in out, key
        out[key] = r
    return out


INDEX = _index()


def _config(c: dict, pallas: bool) -> str:
    if pallas:
        return f"{c['block_q']}×{c['block_k']} · {c['num_warps']} · {c['num_stages']}"
    return f"{c['block_q']}×{c['block_k']} w{c['num_warps']} s{c['num_stages']}"


def _mma(m: dict, pallas: bool) -> str:
    if pallas:       # "HGMMA 4, HMMA 32" / "none (FFMA)"
        return ", ".join(f"{k} {v}" for k, v in sorted(m.items())) or "none (FFMA)"
    return " ".join(f"{k}×{v}" for k, v in sorted(m.items())) or "–"


def _kib(b: int) -> str:
    return f"{b / 1024:.0f}"


def _mufu_cell(r: dict, pallas: bool) -> str:
    mpe = r["mufu_per_element"]
    if not pallas:
        return "–" if mpe is None else f"{mpe:g}"
    ops = "+".join(sorted(r["mufu"], key=lambda k: (k != "TANH", k)))
    return f"{mpe:g} ({ops or 'reads a'})"


def _lookup(path: str, context: str, header: list, cells: dict):
    """The JSON row a docs table row names, and the doc's cells by meaning."""
    framework = PAGES[path]
    pallas = framework == "pallas"
    scope = " ".join(header) + " " + context
    dims = re.search(r"d = e = (\d+)", scope)
    assert dims, (path, header, "no d = e = N in the table's header or the sentence above it")
    d = int(dims.group(1))
    if "arch" in cells:
        arch = cells["arch"]
    else:
        archs = re.findall(r"\bsm_\d+a?\b", context)
        assert len(set(archs)) == 1, (path, header, archs)
        arch = archs[0]
    if pallas:
        variant = cells["launch"].strip("`") + (" causal" if cells["causal"] == "yes" else "")
    else:
        variant = next(v for k, v in cells.items() if k.startswith("kernel"))
    key = (framework, arch, cells["dtype"], d, d, variant)
    assert key in INDEX, (path, key, "not a row of benchmarks/results/gpu_static.json")
    return INDEX[key], pallas


def _doc_rows():
    out = []
    for path, framework in PAGES.items():
        for context, header, rows in _static_tables(path):
            assert framework, (path, "quotes a gpu_static table: give it a framework in PAGES")
            for cells in rows:
                out.append(pytest.param(path, context, header, cells, id=f"{path}:{'|'.join(cells.values())[:60]}"))
    return out


DOC_ROWS = _doc_rows()


def test_the_docs_quote_rows_of_the_table():
    pages = Counter(p.values[0] for p in DOC_ROWS)
    assert pages["docs/kernels.md"] >= 20 and pages["docs/kernels-pallas.md"] == 33, pages


@pytest.mark.parametrize("path, context, header, cells", DOC_ROWS)
def test_docs_table_row_is_the_committed_row(path, context, header, cells):
    r, pallas = _lookup(path, context, header, cells)
    config_col = next(h for h in header if h.startswith("config") or h.startswith("tiles"))
    mufu_col = next(h for h in header if h.startswith("MUFU"))
    want = {config_col: _config(r["config"], pallas), "registers": str(r["registers"]),
            "spill B": str(r["spill_store_bytes"] + r["spill_load_bytes"]), "shared KiB": _kib(r["shared_bytes"]),
            "MMA": _mma(r["mma"], pallas), mufu_col: _mufu_cell(r, pallas)}
    got = {k: cells[k] for k in want}
    assert got == want, (path, r["arch"], r["dtype"], r["variant"])


def test_pallas_check_table_lists_every_pallas_row_once():
    listed = Counter()
    for context, header, rows in _static_tables("docs/kernels-pallas.md"):
        for cells in rows:
            r, _ = _lookup("docs/kernels-pallas.md", context, header, cells)
            listed[(r["arch"], r["dtype"], r["d"], r["variant"])] += 1
    committed = Counter((r["arch"], r["dtype"], r["d"], r["variant"]) for r in ROWS if r["framework"] == "pallas")
    assert listed == committed


# --------------------------------------------------------------------------------------------------- prose
def _count(framework=None, arch=None) -> int:
    return sum(1 for r in ROWS if (framework is None or r["framework"] == framework)
               and (arch is None or r["arch"] == arch))


def _max_shared_kib(framework: str, arch: str) -> str:
    return _kib(max(r["shared_bytes"] for r in ROWS if r["framework"] == framework and r["arch"] == arch))


def test_kernels_md_row_counts():
    text = _flat(_page("docs/kernels.md"))
    total = re.search(r"The committed run \(`--check` scope\) has \*\*(\d+) rows, all compiled, none with a "
                      r"problem\*\*: (\d+) Triton rows \(sm_90a (\d+), sm_80 (\d+)\) and (\d+) Pallas rows \(sm_90a "
                      r"only", text)
    assert total, "the count sentence of 'The GPU-static check' is gone or reworded: update this test with it"
    assert [int(x) for x in total.groups()] == [
        len(ROWS), _count("triton"), _count("triton", "sm_90a"), _count("triton", "sm_80"), _count("pallas")]
    assert all(r["compiled"] and not r["problems"] for r in ROWS)
    assert {_count("pallas")} == {_count("pallas", "sm_90a")}
    for arch in ("sm_90a", "sm_80"):
        said = re.findall(rf"\*\*Triton {arch}, (\d+) rows\*\*", text)
        assert said == [str(_count("triton", arch))], (arch, said)
    # every "N rows" / "N compiles" of the page is one of the two tables' counts
    counts = {len(ROWS), _count("triton"), _count("pallas"), _count("triton", "sm_90a"), _count("triton", "sm_80")}
    counts |= {n for *_, n in _full_counts()} | {len(FULL["rows"])}
    quoted = {int(n) for n in re.findall(r"(?<![~\w.])(\d+) (?:rows|compiles)\b", text)}
    assert quoted <= counts, quoted - counts


def test_kernels_md_extremes_and_spreads():
    text = _flat(_page("docs/kernels.md"))
    assert f"(at most {_max_shared_kib('triton', 'sm_90a')} KiB, TF32 dQ)" in text
    assert f"shared memory at most {_max_shared_kib('triton', 'sm_80')} KiB (limit 163 KiB)" in text
    limits = {r["arch"]: _kib(r["shared_limit"]) for r in ROWS}
    assert f"({limits['sm_80']} KiB sm_80, {limits['sm_90a']} KiB sm_90a)" in text
    # HGMMA in every sm_90a Triton kernel; 1 MUFU per score element where a 16-bit kernel computes tanh
    assert all(r["mma"].get("HGMMA") for r in ROWS if r["framework"] == "triton" and r["arch"] == "sm_90a")
    assert all(r["mufu_per_element"] == 1 for r in ROWS if r["dtype"] in ("fp16", "bf16") and "TANH" in r["mufu"])
    # fp16 against bf16 at d = e = 128
    spread = 0
    for (fw, arch, dt, d, e, variant), r in INDEX.items():
        if fw == "triton" and dt == "fp16" and d == e == 128:
            b = INDEX[(fw, arch, "bf16", d, e, variant)]
            assert (r["config"], r["shared_bytes"], r["mma"]) == (b["config"], b["shared_bytes"], b["mma"]), variant
            spread = max(spread, abs(r["registers"] - b["registers"]))
    assert f"registers within {spread} of it" in text


def test_kernels_md_times_say_what_the_json_says():
    text = _flat(_page("docs/kernels.md"))
    meta = TABLE["meta"]
    assert f"took {meta['seconds']:.0f} s of wall time on {meta['workers']} workers (`meta.seconds`" in text
    triton_s = [r["seconds"] for r in ROWS if r["framework"] == "triton"]
    pallas_s = [r["seconds"] for r in ROWS if r["framework"] == "pallas"]
    assert f"one Triton row of the committed run took {min(triton_s):.1f}–{max(triton_s):.1f} s" in text
    assert f"add up to {sum(triton_s):.0f} s for the Triton rows" in text
    assert f"and {sum(pallas_s):.0f} s for the Pallas rows" in text
    assert f"{_count('triton')} compiles (both archs)" in text and f"{_count('pallas')} compiles" in text


def test_kernels_pallas_md_prose():
    text = _flat(_page("docs/kernels-pallas.md"))
    pallas = [r for r in ROWS if r["framework"] == "pallas"]
    assert {(r["arch"], r["d"], r["e"]) for r in pallas} == {("sm_90a", 128, 128)}
    assert f"holds the Pallas side's {len(pallas)} kernel rows at d = e = 128 on sm_90a" in text
    top_regs = max(pallas, key=lambda r: r["registers"])
    top_shared = max(pallas, key=lambda r: r["shared_bytes"])
    assert (f"at most {top_regs['registers']} registers (`{top_regs['variant'].split()[0]}`, 16-bit) and "
            f"{_kib(top_shared['shared_bytes'])} KiB of shared memory (`{top_shared['variant'].split()[0]}`, 16-bit; "
            f"limit {_kib(top_shared['shared_limit'])} KiB)") in text
    sixteen = [r for r in pallas if r["dtype"] in ("fp16", "bf16")]
    assert all(r["mma"].get("HGMMA") for r in sixteen)
    mixed = {r["variant"] for r in sixteen if set(r["mma"]) != {"HGMMA"}}
    assert mixed == {"fused_dkdv"}, mixed
    dkdv = {json.dumps(r["mma"], sort_keys=True) for r in sixteen if r["variant"] == "fused_dkdv"}
    assert len(dkdv) == 1
    mma = json.loads(dkdv.pop())
    assert mma["HMMA"] > mma["HGMMA"]
    assert f"HMMA×{mma['HMMA']} against HGMMA×{mma['HGMMA']}" in text
    assert "all on HGMMA" not in text
    # the sweep note quotes the o_dkdv default's registers
    regs = {r["causal"]: r["registers"] for r in sixteen if r["variant"].startswith("o_dkdv")}
    assert f"{regs[False]} registers ({regs[True]} causal), no spill, HGMMA only" in text


def _full_counts():
    """(framework, arch, what, count) of the full run: its rows, and those with problems, per framework and arch."""
    out = []
    for fw in ("triton", "pallas"):
        rows = [r for r in FULL["rows"] if r["framework"] == fw]
        out.append((fw, None, "rows", len(rows)))
        for arch in sorted({r["arch"] for r in rows}):
            mine = [r for r in rows if r["arch"] == arch]
            out += [(fw, arch, "rows", len(mine)), (fw, arch, "problems", sum(bool(r["problems"]) for r in mine))]
    return out


def test_kernels_md_quotes_the_full_run():
    text = _flat(_page("docs/kernels.md"))
    found = re.search(r"The committed full run \(`gpu_static_full\.json`, (\d+) s on (\d+) workers\) has \*\*(\d+) "
                      r"rows, (\d+) compiled\*\*", text)
    assert found, "the full run's sentence in 'The GPU-static check' is gone or reworded: update this test with it"
    meta = FULL["meta"]
    assert [int(x) for x in found.groups()] == [round(meta["seconds"]), meta["workers"], len(FULL["rows"]),
                                               sum(r["compiled"] for r in FULL["rows"])]
    assert meta["check"] is False
    counts = {(fw, arch, what): n for fw, arch, what, n in _full_counts()}
    for fw, arch, what in counts:
        if arch is None or what != "rows":
            continue
        name = "Triton" if fw == "triton" else "Pallas"
        said = re.findall(rf"{name} {arch}: (\d+) rows, (\d+) with problems", text)
        assert said == [(str(counts[fw, arch, "rows"]), str(counts[fw, arch, "problems"]))], (fw, arch, said)
