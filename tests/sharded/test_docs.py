"""docs/distributed.md's torch snippet ("torch: the code") runs as written: the test reads the code block from the
doc and runs it on 2 gloo ranks, as ``torchrun --nproc-per-node 2`` would (the environment variables torchrun sets,
the ranks from a forkserver that imported torch once), so the doc cannot drift from the code."""

from __future__ import annotations

import os
import re
import runpy

import pytest

pytest.importorskip("torch")
from tests.support import gloo  # noqa: E402

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                   "distributed.md")
WORLD = 2                                  # the snippet's mesh: init_device_mesh("cpu", (2,))
TIMEOUT_S = 120


def snippet(section: str) -> str:
    """The first ```python block after the heading ``section`` in docs/distributed.md."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    start = text.index(f"\n{section}\n")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m, f"no python block after {section!r}"
    return m.group(1)


def _rank(rank: int, world: int, port: int, path: str) -> None:
    """One rank of the snippet, with what torchrun sets (init_device_mesh starts the gloo group from it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    runpy.run_path(path, run_name="__main__")


def test_the_torch_snippet_runs_on_two_gloo_ranks(tmp_path):
    code = snippet("## torch: the code")
    assert f"init_device_mesh(\"cpu\", ({WORLD},))" in code and f"--nproc-per-node {WORLD}" in code
    path = tmp_path / "snippet.py"
    path.write_text(code)
    gloo.launch(_rank, WORLD, (str(path),), timeout_s=TIMEOUT_S, failed="a rank of the snippet failed")
