"""The README and docs/ say what the code does: section order, length, equation ranges, links and paths, commands
and their flags, and the performance table against the committed benchmark results; and they stay a reference,
not a diary (no dates, commit hashes or issue numbers in their prose)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
DERIVATION = (ROOT / "derivation.md").read_text(encoding="utf-8")

# docs/ pages this file checks.
OWN_DOCS = ("docs/performance.md", "docs/operators.md", "docs/gpu.md", "docs/distributed.md", "docs/distributed-jax.md",
            "docs/crosscheck.md", "docs/kernels.md", "docs/kernels-pallas.md")


def _pages(upstream: bool = False) -> dict[str, str]:
    """README.md, derivation.md and the docs/ pages checked here (with ``upstream``, upstream/README.md too: it
    names its base commit, so it is left out of the diary check)."""
    pages = {"README.md": README, "derivation.md": DERIVATION}
    pages.update({p: (ROOT / p).read_text(encoding="utf-8") for p in OWN_DOCS})
    if upstream:
        pages["upstream/README.md"] = (ROOT / "upstream/README.md").read_text(encoding="utf-8")
    return pages


def _headings(text: str) -> list[str]:
    return re.findall(r"^##+ (.+)$", text, flags=re.M)


# ------------------------------------------------------------------------------------------------- shape
def test_readme_is_short_and_in_reading_order():
    # 200 + the tools' internals the private-API section lists + Sharded + targets + Fused kernels
    assert len(README.splitlines()) <= 265
    sections = [h for h in re.findall(r"^## (.+)$", README, flags=re.M)]
    assert sections == ["Set-up", "Check your own solution", "Reading path", "Use", "Operators",
                        "Fused kernels and the o-only entry", "Sharded: DTensor and JAX sharding", "Supported versions", "Private APIs used", "Limitations",
                        "Performance", "Upstream: the lab's PR stack"], sections


def test_reading_path_goes_derivation_function_formulas_performance_ops():
    steps = re.findall(r"^\d+\. \[([^\]]+)\]", _reading_path(), flags=re.M)
    assert steps == ["derivation.md", "`torch_impl/function.py`", "`torch_impl/formulas.py`",
                     "`torch_impl/performance.py`", "`torch_impl/ops.py`"]


def _reading_path():
    return README.split("\n## Reading path\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("large", [False, True], ids=["one-shot", "blocked"])
def test_reading_path_names_every_file_backward_passes_through(large, monkeypatch):
    """Profile a backward of torch_impl.attn (the one-shot schedule and the blocked one (31)) and collect the
    torch_impl files whose code runs: each must be named in the README's reading path."""
    import sys
    import threading

    import torch
    import torch_impl
    from torch_impl import performance
    if large:
        monkeypatch.setattr(performance, "BLOCKED_FROM_BYTES", 0)
        monkeypatch.setattr(performance, "IN_PLACE_FROM_BYTES", 0)    # blocks are an in-place schedule
        monkeypatch.setattr(performance, "SCRATCH_BLOCK_BYTES", 64)
    q, k, v = (torch.rand(8, 3, requires_grad=True) for _ in range(3))
    o, a = torch_impl.attn(q, k, v)
    files = set()

    def profile(frame, event, arg):
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if event == "call" and "/torch_impl/" in path:
            files.add("torch_impl/" + path.rsplit("/torch_impl/", 1)[1])

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        torch.autograd.grad((o.sum(), a.sum()), (q, k, v))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert {"torch_impl/function.py", "torch_impl/performance.py", "torch_impl/formulas.py"} <= files, files
    missing = [f for f in sorted(files) if f"`{f}`" not in _reading_path()]
    assert not missing, missing


@pytest.mark.parametrize("page", ["README.md", "derivation.md", *OWN_DOCS])
def test_no_diary(page):
    """No dates, commit hashes or project issue numbers: git log and the benchmark report carry those."""
    text = _pages()[page]
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", text)
    assert not re.findall(r"\bissues? \d+|\bissue-\d+", text, flags=re.I)
    assert "reviewer measured" not in text
    # narrated history
    assert not re.findall(r"at the time of writing|\bwent from\b|\bnow\b|\btried and dropped\b", text, flags=re.I)


# ------------------------------------------------------------------------------------------- equations
def _tags() -> list[int]:
    return [int(n) for n in re.findall(r"\\tag\{(\d+)\}", DERIVATION)]


def test_derivation_states_its_equations_once_each_in_order():
    tags = _tags()
    assert tags == list(range(1, len(tags) + 1)), tags


def test_readme_equation_range_is_derivations():
    ranges = re.findall(r"equations numbered \((\d+)\)–\((\d+)\)", README)
    assert ranges == [("1", str(len(_tags())))], ranges


def test_derivation_index_lists_every_equation():
    index = DERIVATION.split("## 0. Equation index", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for first, last in re.findall(r"^\| \((\d+)\)(?:–\((\d+)\))? \|", index, flags=re.M):
        listed.update(range(int(first), int(last or first) + 1))
    assert listed == set(range(1, len(_tags()) + 1))


# -------------------------------------------------------------------------------------- links and paths
def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "derivation.md", *OWN_DOCS, "upstream/README.md"])
def test_local_links_resolve(page):
    base = (ROOT / page).parent
    for target in re.findall(r"\]\(([^)\s]+)\)", _pages(upstream=True)[page]):
        if re.match(r"[a-z]+://", target) or not re.search(r"[./#]", target):
            continue
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else ROOT / page
        rel = file.relative_to(ROOT).as_posix()
        assert file.exists(), (page, target, rel)
        if anchor and file.suffix == ".md":
            slugs = {_slug(h) for h in _headings(file.read_text(encoding="utf-8"))}
            assert anchor in slugs, (page, target, sorted(slugs))


def test_readme_paths_exist():
    named = set(re.findall(r"`((?:torch_impl|jax_impl|crosscheck|benchmarks|upstream|tests|docs|scripts)/[\w./-]*)`",
                           README))
    assert not {p for p in named if not (ROOT / p).exists()}


# -------------------------------------------------------------------------------------------- commands
def _commands() -> dict[str, list[str]]:
    """``python -m MODULE ...`` invocations named in README.md and the docs, by module."""
    found: dict[str, list[str]] = {}
    for text in _pages(upstream=True).values():
        for module, rest in re.findall(r"python -m ([\w.]+)([^`\n#]*)", text):
            found.setdefault(module, []).append(rest)
    return found


def test_documented_modules_exist():
    """Looked up in a child process: in this one, ``find_spec("pip")`` reaches setuptools' distutils hack
    (``_distutils_hack``'s ``spec_for_pip``), which then hands out the stdlib distutils for the rest of the process,
    and a later torch.compile that builds C++ fails (tests/benchmarks/test_run.py's inductor test did, after this)."""
    modules = sorted(_commands())
    done = subprocess.run([sys.executable, "-c", "import importlib.util, sys\n"
                           "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))",
                           *modules], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pip" in modules and done.stdout.split() == [], done.stdout


@pytest.mark.parametrize("module", ["crosscheck", "benchmarks", "upstream.make_patches"])
def test_documented_flags_exist(module):
    flags = {f for rest in _commands().get(module, []) for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)}
    assert flags, f"no documented flags for {module}?"
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    missing = {f for f in flags if f not in done.stdout}
    assert not missing, missing


# ----------------------------------------------------------------------------------------- performance
def performance_rows() -> list[str]:
    """The README's targets table as the committed ``benchmarks/results/results.json`` gives it."""
    results = json.loads((ROOT / "benchmarks/results/results.json").read_text(encoding="utf-8"))
    rows = []
    for t in results["targets"] + results.get("targets_compile_batched", []):
        if t["met"] is None:                  # information only
            continue
        value = t["value"]
        if isinstance(value, float):
            shown = f"{value:.3f}"
        elif "bytes" in t["target"]:
            shown = f"{value / 2**20:.1f} MiB"
        else:
            shown = str(value)
        rows.append(f"| {t['target']} | {'met' if t['met'] else '**not met**'} | {shown} |")
    return rows


def test_readme_performance_table_is_the_committed_run():
    section = README.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| target |")]
    expected = performance_rows()
    assert table == expected, "the README's targets table should read:\n" + "\n".join(expected)
    assert "![benchmark plot](benchmarks/results/results.png)" in section


def test_committed_benchmark_run_measured_the_code_as_it_is():
    """The README's figures are those of the code in this tree: nothing the figures depend on
    (``benchmarks.run.MEASURED``) changed since the commit the committed full run recorded, and that tree was clean.
    So a code change and the run that measures it land in two commits: the change first, then the results."""
    from benchmarks.run import MEASURED
    meta = json.loads((ROOT / "benchmarks/results/results.json").read_text(encoding="utf-8"))["meta"]
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)   # noqa: E731
    if git("cat-file", "-e", f"{meta['git_commit']}^{{commit}}").returncode != 0:
        pytest.skip(f"not a git checkout holding the measured commit {meta['git_commit']} (a shallow clone?)")
    assert not meta["git_dirty"], "the committed run measured a tree with uncommitted changes"
    diff = git("diff", "--stat", meta["git_commit"], "--", *MEASURED)
    untracked = git("ls-files", "--others", "--exclude-standard", "--", *MEASURED)
    assert diff.returncode == 0 and untracked.returncode == 0, diff.stderr + untracked.stderr
    changed = diff.stdout + untracked.stdout
    assert not changed, f"changed since the committed run measured {meta['git_commit']}:\n{changed}"


# ------------------------------------------------------------------------------------------------- the real session
def _session_rows(text: str) -> list[str]:
    """The rows of the README's "Check your own solution" session: its code block after the -q command."""
    section = text.split("\n## Check your own solution\n", 1)[1].split("\n## ", 1)[0]
    block = section.split(" -q` exits 1", 1)[1].split(":\n\n", 1)[1].split("\n\n", 1)[0]
    return [row[4:] for row in block.splitlines()]


def _masked(row: str) -> str:
    return re.sub(r"device cpu; \d+(\.\d+)? s\)", "device cpu; _ s)", row)


@pytest.mark.slow
def test_readme_session_is_what_crosscheck_prints(tmp_path, monkeypatch):
    """Every line the README shows of its `-q` session is a line crosscheck prints, in the same order (a row "…"
    stands for lines left out, and must leave some out); it starts with the skipped: block every run prints
    first.  The solution is the README's backward (tests/support/first_hour.py: ReadmeSession) in my_attn.py."""
    import contextlib
    import inspect
    import io

    from crosscheck.cli import main
    from tests.support import first_hour
    source = inspect.getsource(first_hour.ReadmeSession).replace("class ReadmeSession(", "class MyAttn(")
    (tmp_path / "my_attn.py").write_text("import torch\n\n\n" + source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--torch-impl", "my_attn.py:MyAttn", "-q"]) == 1
    from tests.support.console import logical_lines          # -q's wrapped lines joined back
    printed = [_masked(line) for line in logical_lines(out.getvalue())]
    shown = [_masked(line) for line in logical_lines("\n".join(_session_rows(README)))]
    assert max(len(row) for row in out.getvalue().splitlines()) <= 120
    assert shown[0] == "skipped:" == printed[0]
    at = 0
    for i, row in enumerate(shown):
        if row.strip() == "…":
            continue
        assert row in printed[at:], (row, printed)
        found = printed.index(row, at)
        assert i == 0 or shown[i - 1].strip() == "…" or found == at, (row, "rows left out without a …")
        assert i == 0 or shown[i - 1].strip() != "…" or found > at, (row, "a … that leaves nothing out")
        at = found + 1
