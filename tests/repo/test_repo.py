"""The repository keeps its promises: CI runs the README's set-up, every documented install keeps the right torch,
and the declared torch range is sane."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _commands(text: str) -> list[str]:
    """The shell lines of a Markdown text's indented code blocks, comments dropped."""
    return [line.split("  #")[0].strip() for line in text.splitlines() if line.startswith("    ") and line.strip()]


def setup_commands() -> list[str]:
    """What the README's Set-up tells a newcomer to run after cloning and entering the repository."""
    return [c for c in _commands(_section(README, "Set-up")) if not c.startswith("git clone")]


def test_readme_setup_starts_from_a_clone_in_a_virtual_environment():
    block = _commands(_section(README, "Set-up"))
    assert block[0].startswith("git clone ") and " && cd " in block[0], block
    assert setup_commands() == [
        "python -m venv .venv && . .venv/bin/activate",
        'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e ".[jax,test]"',
        "python -m pytest tests/",
    ]


def test_ci_runs_the_readme_setup():
    """.ci/run runs each command of the README's Set-up, verbatim (it works in a fresh clone already)."""
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    missing = [c for c in setup_commands() if c not in ci_lines]
    assert not missing, f".ci/run lacks these README Set-up lines: {missing}"


def test_ci_runs_the_tiers_the_readme_command_leaves_out():
    """pyproject's addopts deselect the marked tiers from `python -m pytest tests/`; .ci/run must then run every
    one of them, and the matrix every test, so no tier goes unrun."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    tiers = [m.split(":")[0] for m in ini["markers"]]
    assert all(f"not {tier}" in ini["addopts"] for tier in tiers), (tiers, ini["addopts"])
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    after = ci[ci.index("python -m pytest tests/") + 1:]
    extra = [line for line in after if line.startswith("python -m pytest tests/ -m ")]
    assert extra and all(any(tier in line for line in extra) for tier in tiers), extra
    assert '-m ""' in (ROOT / ".ci" / "matrix").read_text()


def _docs() -> dict[str, str]:
    """README.md and the docs/ pages, by path."""
    pages = {"README.md": README}
    pages.update({f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))})
    return pages


CPU_INDEX = "https://download.pytorch.org/whl/cpu"       # PyTorch's CPU wheel index (its install selector's)


def test_cpu_installs_put_the_cpu_torch_first():
    """Every documented install but the GPU page's installs torch==2.13.0 from PyTorch's CPU wheel index before
    the package: on Linux x86-64 the default index gives a CUDA build (GBs).  Where that index is out of reach (this
    project's machines), pip takes the same CPU wheel from its configured local links."""
    for path, text in _docs().items():
        if path == "docs/gpu.md":
            continue
        for cmd in _commands(text):
            if cmd.startswith("pip install"):
                assert re.match(rf"pip install (-q )?torch==2\.13\.0 --index-url {re.escape(CPU_INDEX)} && ", cmd), \
                    (path, cmd)


def test_gpu_install_keeps_the_machines_cuda_torch():
    installs = [c for c in _commands((ROOT / "docs" / "gpu.md").read_text(encoding="utf-8"))
                if c.startswith("pip install")]
    assert installs and all("torch" not in c for c in installs), installs
    assert installs[0] == JAX_CUDA_INSTALL, installs              # JAX with CUDA, then the test and bench extras


def test_pyproject_declares_a_torch_range_not_a_pin():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = [d for d in meta["dependencies"] if d.startswith("torch")]
    assert len(torch_req) == 1 and torch_req[0].startswith("torch>="), torch_req


def _version(text):
    return tuple(int(p) for p in text.split("."))


def test_declared_floors_are_the_oldest_releases_ci_runs():
    """pyproject's torch and JAX floors are exactly the oldest entries of .ci/matrix, and the README's
    Supported versions table names every entry: a claimed version is a tested one."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    entries = re.findall(r'"torch==([\d.]+),jax==([\d.]+)[,"]', (ROOT / ".ci" / "matrix").read_text())
    assert entries
    torch_floor = min((v for v, _ in entries), key=_version)
    jax_floor = min((v for _, v in entries), key=_version)
    assert f"torch>={torch_floor}" in meta["dependencies"]
    assert f"jax>={jax_floor}" in meta["optional-dependencies"]["jax"]
    table = _section(README, "Supported versions")
    for torch_v, jax_v in entries + [("2.13.0", None)]:
        assert f"torch {torch_v}" in table, torch_v
        assert jax_v is None or f"JAX {jax_v}" in table, jax_v
    assert meta["requires-python"] == ">=3.10"


# A stand-in interpreter for .ci/matrix's mechanics: `-m venv DIR` makes DIR/bin/{pip,python}, whose python
# answers `-m pytest` with one summary line; nothing is installed and nothing heavy runs.
_FAKE_PY = """#!/usr/bin/env bash
if [ "$1" = -V ]; then echo "Python 3.99"; exit 0; fi
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/usr/bin/env bash\\nexit 0\\n' > "$3/bin/pip"
  printf '#!/usr/bin/env bash\\n[ "$1 $2" = "-m pytest" ] && echo "== 3 passed in 0.1s ==" && exit ${FAKE_PYTEST_RC:-0}; true\\n' > "$3/bin/python"
  chmod +x "$3/bin/pip" "$3/bin/python"
fi
"""


def _run_matrix(tmp_path, entries=("torch==9.9,jax==9.9,fakepy",), **env):
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "matrix", tmp_path / ".ci" / "matrix")
    fake = tmp_path / "bin" / "fakepy"
    fake.parent.mkdir()
    fake.write_text(_FAKE_PY)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    run_env = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}", **env)
    return subprocess.run(["bash", str(tmp_path / ".ci" / "matrix"), *entries],
                          cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=60)


def test_matrix_removes_each_entry_venv_and_keeps_its_log(tmp_path):
    """An entry's venv is a 5-6 GiB CUDA build of torch: CI on a shared disk removes it after its run (a full disk
    once failed CI), keeps its pytest log, and MATRIX_KEEP=1 keeps the venv for reruns."""
    done = _run_matrix(tmp_path)
    assert done.returncode == 0, done.stderr
    venv = tmp_path / ".venv-matrix" / "9.9-9.9-fakepy"
    assert not venv.exists()
    assert "3 passed" in (tmp_path / ".venv-matrix" / "9.9-9.9-fakepy.log").read_text()
    assert "3 passed" in done.stdout.split("=== matrix summary ===")[1]
    shutil.rmtree(tmp_path / ".ci"), shutil.rmtree(tmp_path / "bin")
    assert _run_matrix(tmp_path, MATRIX_KEEP="1").returncode == 0
    assert (venv / "bin" / "python").exists()


def test_matrix_refuses_an_entry_without_disk_room_before_installing(tmp_path):
    done = _run_matrix(tmp_path, MATRIX_MIN_FREE_GIB="1000000000")
    assert done.returncode == 1
    assert "GiB free on" in done.stderr and "this entry needs 1000000000 GiB" in done.stderr
    assert not (tmp_path / ".venv-matrix" / "9.9-9.9-fakepy").exists()


def test_a_failing_matrix_entry_fails_the_matrix_after_the_others_ran(tmp_path):
    """pytest failing in one entry: the next entry still runs, both venvs are removed, the summary is printed, and
    the matrix exits 1."""
    done = _run_matrix(tmp_path, ("torch==9.9,jax==9.9,fakepy", "torch==9.8,jax==9.8,fakepy"), FAKE_PYTEST_RC="1")
    assert done.returncode == 1, done.stderr
    assert "=== matrix entry: torch==9.8" in done.stdout and "=== matrix summary ===" in done.stdout
    assert sorted(p.name for p in (tmp_path / ".venv-matrix").iterdir()) == ["9.8-9.8-fakepy.log",
                                                                             "9.9-9.9-fakepy.log"]


JAX_CUDA_INSTALL = 'pip install -e ".[jax-cuda]"'


def test_one_jax_with_cuda_install_everywhere():
    """crosscheck, scripts/gpu_check.py, the benchmarks and docs/gpu.md name the same JAX-with-CUDA install (three
    different ones before: jax[cuda12] / jax[cuda13] by hand, '.[jax-cuda]', '.[jax-cuda,test,bench]')."""
    sources = {path: (ROOT / path).read_text(encoding="utf-8") for path in
               ("crosscheck/frameworks.py", "scripts/gpu_check.py", "benchmarks/contenders.py", "docs/gpu.md")}
    for path, text in sources.items():
        said = [m for m in re.findall(r"pip install[^`\n]*", text.replace('\\"', '"')) if "cuda" in m]
        assert said and all(m.startswith(JAX_CUDA_INSTALL) for m in said), (path, said)
    gpu_installs = [c for c in _commands(sources["docs/gpu.md"]) if c.startswith("pip install")]
    assert JAX_CUDA_INSTALL in gpu_installs, gpu_installs


def test_gpu_page_lists_every_step_of_gpu_check():
    """docs/gpu.md and gpu_check's docstring list each step scripts/gpu_check.py runs, by its command, in order
    (the page had 4 of the 5)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    steps = gpu_check.plan({"torch_gpu": True, "jax_gpu": True})
    commands = [" ".join(["python"] + [a if a else '""' for a in s.argv[1:]]) for s in steps]
    page = " ".join((ROOT / "docs" / "gpu.md").read_text(encoding="utf-8").split())
    doc = " ".join(gpu_check.__doc__.split())
    for i, command in enumerate(commands, 1):
        words = [w for w in command.split() if w not in ("-q", "-rs")]       # the page adds pytest's -q -rs
        listed = re.search(rf"\n\s*{i}\. `([^`]*)`", (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8"))
        assert listed and listed.group(1).split()[:len(words[:3])] == words[:3], (i, command)
        assert all(w in listed.group(1).split() for w in words), (i, command, listed.group(1))
        assert f"{i}. ``" in gpu_check.__doc__ and words[2] in doc, (i, command)
    assert not re.search(rf"\n\s*{len(commands) + 1}\. `", (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8"))
    assert "gpu_check.py" in page
