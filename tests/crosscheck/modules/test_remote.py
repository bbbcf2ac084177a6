"""``crosscheck.remote.process.run_child``: the entry is a function object, which the fresh interpreter imports by its
``__module__`` and ``__name__`` (no module or function named by a string in crosscheck); a failing or silent child
is a ``UsageError`` naming what ran."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from crosscheck.remote.process import run_child, run_job
from crosscheck.errors import UsageError
from tests.conftest import ROOT


def echo(word: str, payload_path: str, out_path: str) -> None:
    """A child: writes back what it was sent (``args``, then the payload), and where it ran."""
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    with open(out_path, "wb") as f:
        pickle.dump({"payload": payload, "module": __name__, "args": [word, *sys.argv[1:-2]]}, f)


def fail(payload_path: str, out_path: str) -> None:
    raise SystemExit("the child gave up")


def silent(payload_path: str, out_path: str) -> None:
    """Exits 0 and writes nothing."""


def test_the_child_imports_the_entry_by_its_module_and_runs_it():
    got = run_child(echo, ["x"], {"cases": (1, 2)}, "the echo child", timeout=120)
    assert got == {"payload": {"cases": (1, 2)}, "module": "tests.crosscheck.modules.test_remote", "args": ["x", "x"]}


@pytest.mark.parametrize("entry, said", [(fail, "the child gave up"), (silent, "")])
def test_a_failing_or_silent_child_is_a_usage_error_naming_what_ran(entry, said):
    with pytest.raises(UsageError) as err:
        run_child(entry, [], None, "the planted child", timeout=120)
    assert str(err.value).startswith("the planted child failed (exit ") and said in str(err.value)


def test_run_job_keeps_the_results_or_the_error():
    class Executor:
        def run(self, job):
            if job == "bad":
                raise ValueError("q: wrong shape\nmore")
            return ("results of", job)
    assert run_job(Executor(), "good").results == ("results of", "good")
    failed = run_job(Executor(), "bad")
    assert failed.results is None and failed.error.type == "ValueError" and failed.error.message == "q: wrong shape"


def test_an_entry_the_child_cannot_import_is_refused_before_it_starts():
    def nested(payload_path, out_path):
        pass
    for entry in (nested, lambda p, o: None):
        with pytest.raises(TypeError, match="module-level function"):
            run_child(entry, [], None, "a child", timeout=1)


def test_the_run_does_not_import_the_shards_children():
    """``--shards``' run side names its child by a light function of ``crosscheck.drivers``: run_layouts (its
    child stubbed) leaves the child modules, torch.distributed's DTensor and JAX unimported in the run's process."""
    code = (
        "import sys\n"
        "from crosscheck.shards import rows as R\n"
        "sent = []\n"
        "R.run_child = lambda entry, *rest: sent.append(entry) or {}\n"
        "for fw in ('torch', 'jax'):\n"
        "    R.run_layouts(fw, 2, 0, [])\n"
        "print([f'{e.__module__}.{e.__name__}' for e in sent])\n"
        "print(sorted(m for m in ('crosscheck.shards.torch_ranks', 'crosscheck.shards.jax_devices', 'jax',\n"
        "                         'torch.distributed.tensor') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    entries, imported = out.stdout.strip().splitlines()
    assert entries == "['crosscheck.drivers.torch_shards_child', 'crosscheck.drivers.jax_shards_child']"
    assert imported == "[]", imported
