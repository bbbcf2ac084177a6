"""The repository keeps its promises: CI runs the README's test command, and the declared torch range is sane."""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    return [line.strip() for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("    pip install")]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    readme = _readme_commands()
    test_cmds = [c for c in readme if "pytest tests/" in c]
    assert len(test_cmds) == 1, readme
    assert test_cmds[0] in ci_lines


def _gpu_section_commands():
    section = (ROOT / "README.md").read_text().split("## On a GPU machine", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    pip install")]


def test_readme_installs_cpu_torch_before_the_package():
    gpu = _gpu_section_commands()        # the GPU section keeps the machine's CUDA torch: tested below
    for cmd in _readme_commands():
        if cmd not in gpu:
            assert re.match(r"pip install (-q )?torch==2\.13\.0 && ", cmd), cmd


def test_readme_gpu_install_keeps_the_machines_cuda_torch():
    gpu = _gpu_section_commands()
    assert gpu and all("torch" not in cmd.split("#")[0] for cmd in gpu), gpu
    assert all("jax-cuda" in cmd for cmd in gpu), gpu


def test_pyproject_declares_a_torch_range_not_a_pin():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = [d for d in meta["dependencies"] if d.startswith("torch")]
    assert torch_req == ["torch>=2.5"], torch_req
    assert meta["requires-python"] == ">=3.10"
