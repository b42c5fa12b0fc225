"""Session-wide guards of the test run itself.

- A process forked by a test (a launcher's rank) that returns into pytest instead of
  exiting would run further tests and report them a second time; pytest-xdist then
  aborts the whole run with an INTERNALERROR that names no test. Such a child is
  ended at once, and the test it escaped from is reported as a failure of the run.
- A failing test is named the moment its report arrives, so that a run which ends
  early (an internal error, a CI time limit) still says what failed.

The folder the escaped children write to is removed when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

ESCAPES_ENV = "INTERLOCK_TEST_ESCAPES"
_OWNER = os.getpid()
_CONFIG: list[pytest.Config] = []
#: the escapes folder this process made (and so removes at the end)
_MADE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and ESCAPES_ENV not in os.environ:
        # workers start after this and inherit the variable
        os.environ[ESCAPES_ENV] = tempfile.mkdtemp(prefix="interlock-test-escapes-")
        _MADE.append(os.environ[ESCAPES_ENV])
    _CONFIG.append(config)


def _end_if_escaped(item: pytest.Item, phase: str) -> None:
    if os.getpid() == _OWNER:
        return
    folder = os.environ.get(ESCAPES_ENV)
    if folder:
        Path(folder, f"{os.getpid()}.txt").write_text(f"{item.nodeid} ({phase})\n")
    os._exit(70)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _end_if_escaped(item, "setup")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _end_if_escaped(item, "call")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _end_if_escaped(item, "teardown")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _CONFIG or hasattr(_CONFIG[0], "workerinput"):
        return  # the controller names it (a worker's line would come twice)
    reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter")
    if report.failed and os.getpid() == _OWNER and reporter is not None:
        reporter.write_line(f"\nFAILED {report.nodeid} ({report.when})")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    folder = os.environ.get(ESCAPES_ENV)
    if hasattr(session.config, "workerinput") or not folder or not Path(folder).is_dir():
        return
    escapes = sorted(Path(folder).glob("*.txt"))
    if escapes:
        names = "".join(p.read_text() for p in escapes)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("a forked child returned into pytest from:\n" + names)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    for path in escapes:
        path.unlink()
    if folder in _MADE:
        with contextlib.suppress(OSError):  # a late escape's file: left for a person to read
            os.rmdir(folder)
