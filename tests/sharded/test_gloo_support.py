"""tests/support/gloo.py's ``launch``: a rank killed by a signal is launched once more (with a warning), a second
crash fails; a rank that raised fails at once."""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp

from tests.support import gloo


def _crash(signal_name="SIGABRT"):
    return mp.ProcessExitedException(f"process 0 terminated with signal {signal_name}", error_index=0, error_pid=1,
                                     exit_code=-6, signal_name=signal_name)


@pytest.mark.parametrize("crashes, passes", [(0, True), (1, True), (2, False)])
def test_one_crash_is_launched_again_a_second_fails(monkeypatch, recwarn, crashes, passes):
    calls = []

    def run_ranks(*args, **kwargs):
        calls.append(args)
        if len(calls) <= crashes:
            raise _crash()
    monkeypatch.setattr(gloo, "run_ranks", run_ranks)
    if passes:
        gloo.launch(lambda *a: None, 2, (), timeout_s=1)
        assert len(calls) == crashes + 1
        assert [str(w.message) for w in recwarn if "SIGABRT" in str(w.message)] == (
            ["a rank failed: process 0 terminated with signal SIGABRT (a crash, not an exception): launched once more"]
            if crashes else [])
    else:
        with pytest.warns(UserWarning), pytest.raises(pytest.fail.Exception, match="SIGABRT"):
            gloo.launch(lambda *a: None, 2, (), timeout_s=1)
        assert len(calls) == 2


def test_an_exit_code_or_a_raised_exception_fails_at_once(monkeypatch):
    for exc in (mp.ProcessExitedException("process 0 terminated with exit code 1", error_index=0, error_pid=1,
                                          exit_code=1),
                mp.ProcessRaisedException("rank 0: ValueError", error_index=0, error_pid=1)):
        calls = []

        def run_ranks(*args, exc=exc, **kwargs):
            calls.append(args)
            raise exc
        monkeypatch.setattr(gloo, "run_ranks", run_ranks)
        with pytest.raises(pytest.fail.Exception):
            gloo.launch(lambda *a: None, 2, (), timeout_s=1)
        assert len(calls) == 1

