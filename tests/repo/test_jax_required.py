"""Tests that need JAX skip where it does not import, unless TANH_ATTN_REQUIRE_JAX=1 (what CI exports), where
they fail in one line: a JAX that stops importing must turn CI red, not the crosscheck suite into skips.

One subprocess, where ``import jax`` fails, runs pytest on two generated test files once per setting of the
switch (unset, ``0``, ``1``), with ``tests.conftest`` loaded as a plugin (its ``require_jax``, its ``jax``
marker), and records each test's outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REQUIRE_JAX, ROOT

DRIVER = '''
import json, os, sys

sys.modules["jax"] = None                     # `import jax` (and of any submodule) raises ImportError
import pytest


class Record:
    def __init__(self):
        self.outcomes = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = [report.outcome, report.longreprtext]

    def pytest_collectreport(self, report):
        if report.outcome != "passed":
            self.outcomes[report.nodeid] = [report.outcome, report.longreprtext]


results = {}
for switch in ["unset", "0", "1"]:
    os.environ.pop("TANH_ATTN_REQUIRE_JAX", None)
    if switch != "unset":
        os.environ["TANH_ATTN_REQUIRE_JAX"] = switch
    for name in ("test_per_test", "test_module_level"):
        sys.modules.pop(name, None)               # each run imports the test files afresh
    record = Record()
    pytest.main(["-p", "tests.conftest", "-p", "no:cacheprovider", "--continue-on-collection-errors", "-q",
                 "test_per_test.py", "test_module_level.py"], plugins=[record])
    results[switch] = record.outcomes
print("RESULTS " + json.dumps(results))
'''

PER_TEST = '''
import pytest
from tests.conftest import require_jax


@pytest.mark.jax
def test_marked():
    pass


def test_helper():
    require_jax()


def test_submodule():
    require_jax("jax.numpy")


def test_without_jax():
    pass
'''

MODULE_LEVEL = '''
from tests.conftest import require_jax

jax = require_jax()


def test_in_a_module_that_needs_jax():
    pass
'''

NEEDS_JAX = ["test_per_test.py::test_marked", "test_per_test.py::test_helper", "test_per_test.py::test_submodule",
             "test_module_level.py"]                  # the module: skipped, or an error collecting it


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("jax_required")
    (d / "pytest.ini").write_text("[pytest]\n")                # not the repository's addopts (xdist, tiers)
    (d / "driver.py").write_text(DRIVER)
    (d / "test_per_test.py").write_text(textwrap.dedent(PER_TEST))
    (d / "test_module_level.py").write_text(textwrap.dedent(MODULE_LEVEL))
    env = {k: v for k, v in os.environ.items() if k not in (REQUIRE_JAX, "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(d), str(ROOT)])
    proc = subprocess.run([sys.executable, "driver.py"], cwd=d, env=env, capture_output=True, text=True,
                          timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert proc.returncode == 0 and line, proc.stdout + proc.stderr
    return json.loads(line[0][len("RESULTS "):])


@pytest.mark.parametrize("switch", ["unset", "0"])
def test_without_the_switch_tests_needing_jax_skip(results, switch):
    got = results[switch]
    assert {n: got.get(n, ["passed"])[0] for n in NEEDS_JAX} == dict.fromkeys(NEEDS_JAX, "skipped"), got
    assert got["test_per_test.py::test_without_jax"][0] == "passed", got


def test_with_the_switch_tests_needing_jax_fail_in_one_line(results):
    got = results["1"]
    assert {n: got.get(n, ["passed"])[0] for n in NEEDS_JAX} == dict.fromkeys(NEEDS_JAX, "failed"), got
    assert got["test_per_test.py::test_without_jax"][0] == "passed", got
    for nodeid in NEEDS_JAX:
        text = got[nodeid][1].strip()
        assert "\n" not in text and text.startswith(
            f"JAX is required here ({REQUIRE_JAX}=1) but does not import: "), (nodeid, text)
        assert "jax" in text[text.index("import: "):], (nodeid, text)          # the ImportError itself


def test_no_test_file_skips_on_jax_by_itself():
    """Every test needing JAX says so through require_jax or the ``jax`` marker, so the switch reaches it."""
    own = {"tests/repo/test_jax_required.py"}
    offenders = []
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        if p.relative_to(ROOT).as_posix() in own:
            continue
        lines = p.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines, 1):
            guarded = i >= 2 and lines[i - 2].strip() == "try:" and line.strip().startswith(("import jax", "from jax"))
            if 'importorskip("jax' in line or "importorskip('jax" in line or guarded or "jax is None, reason" in line:
                offenders.append(f"{p.relative_to(ROOT).as_posix()}:{i}")      # a try-import or skipif of its own would bypass the switch
    assert not offenders, offenders


def test_ci_exports_the_switch():
    """CI installs JAX in every venv (.ci/run, .ci/matrix), so there the switch is on."""
    for script in (".ci/run", ".ci/matrix"):
        lines = [line.split("#")[0].strip() for line in (ROOT / script).read_text().splitlines()]
        assert f"export {REQUIRE_JAX}=1" in lines, script
