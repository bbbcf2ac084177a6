"""The repository keeps its promises: CI runs the README's set-up, every documented install keeps the right torch,
and the declared torch range is sane."""

from __future__ import annotations

import re
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
        'pip install torch==2.13.0 && pip install -e ".[jax,test]"',
        "python -m pytest tests/",
    ]


def test_ci_runs_the_readme_setup():
    """.ci/run runs each command of the README's Set-up, verbatim (it works in a fresh clone already)."""
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    missing = [c for c in setup_commands() if c not in ci_lines]
    assert not missing, f".ci/run lacks these README Set-up lines: {missing}"


def _docs() -> dict[str, str]:
    """README.md and the docs/ pages, by path."""
    pages = {"README.md": README}
    pages.update({f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))})
    return pages


def test_cpu_installs_put_the_cpu_torch_first():
    """Every documented install but the GPU page's installs torch==2.13.0 (the CPU wheel) before the package."""
    for path, text in _docs().items():
        if path == "docs/gpu.md":
            continue
        for cmd in _commands(text):
            if cmd.startswith("pip install"):
                assert re.match(r"pip install (-q )?torch==2\.13\.0 && ", cmd), (path, cmd)


def test_gpu_install_keeps_the_machines_cuda_torch():
    installs = [c for c in _commands((ROOT / "docs" / "gpu.md").read_text(encoding="utf-8"))
                if c.startswith("pip install")]
    assert installs and all("torch" not in c for c in installs), installs
    assert all("jax-cuda" in c for c in installs), installs


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
