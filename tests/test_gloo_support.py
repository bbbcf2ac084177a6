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
def test_one_crash_is_launched_again_a_second_fails(monkeypatch, crashes, passes):
    calls = []

    def run_ranks(*args, **kwargs):
        calls.append(args)
        if len(calls) <= crashes:
            raise _crash()
    monkeypatch.setattr(gloo, "run_ranks", run_ranks)
    if passes:
        with pytest.warns(UserWarning, match="SIGABRT") if crashes else _no_warning():
            gloo.launch(lambda *a: None, 2, (), timeout_s=1)
        assert len(calls) == crashes + 1
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


class _no_warning:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)
