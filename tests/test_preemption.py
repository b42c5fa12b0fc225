"""PreemptionGuard: SIGTERM becomes a request, the grace period bounds it, and a
preempted rank is not reported as a failure. (Real launches: tests/cluster.)"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import interlock
from interlock.strategies.launchers.base import ERROR_FILE_ENV, report_failure
from interlock.strategies.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionGuard


def _wait_for(guard: PreemptionGuard, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not guard.requested and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread


def test_sigterm_inside_the_guard_is_a_request_and_the_handler_is_restored() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed from the main thread")
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionGuard(grace=None) as guard:
        assert not guard.requested
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(guard)
        assert guard.requested and guard.signum == signal.SIGTERM, "SIGTERM was not caught"
        strategy = interlock.resolve(accelerator="cpu", strategy="single_device")
        assert guard.should_stop(strategy), "one process that got SIGTERM must stop"
    assert signal.getsignal(signal.SIGTERM) == before, "the previous handler was not restored"


def test_stop_raises_a_system_exit_with_143_that_pickles() -> None:
    with PreemptionGuard(grace=None) as guard, pytest.raises(Preempted) as info:
        guard.stop()
    assert isinstance(info.value, SystemExit) and info.value.code == PREEMPTED_EXIT_CODE == 143
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, Preempted) and again.code == 143


@pytest.mark.parametrize("kwargs", [{"grace": 0.0}, {"grace": -1.0}, {"signals": ()}])
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"grace|signal"):
        PreemptionGuard(**kwargs)  # type: ignore[arg-type]


STUCK = """
import os, signal, time
from interlock.strategies.preemption import PreemptionGuard
with PreemptionGuard(grace=0.5):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # never polls: the grace period must end it
"""


@pytest.mark.timeout(60)
def test_a_process_that_never_polls_exits_143_after_the_grace_period() -> None:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True,
                          timeout=45, check=False)
    elapsed = time.monotonic() - started
    assert proc.returncode == 143, f"exit {proc.returncode}:\n{proc.stderr[-2000:]}"
    assert elapsed < 30, f"the 0.5 s grace period took {elapsed:.1f}s to end the process"


def test_a_preempted_rank_is_not_reported_as_failed(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "rank1.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(report))
    report_failure(Preempted())
    assert not report.exists(), "preemption was recorded as the rank's failure"
    report_failure(RuntimeError("boom"))
    assert report.exists(), "a real failure was not recorded"
