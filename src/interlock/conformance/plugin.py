"""The conformance suite's pytest hooks.

The ``pytest11`` entry point is a separate, import-free module
(``_interlock_conformance_pytest``): it adds the options and registers this module only
when ``--interlock-strategy`` is given, so installing interlock never changes anyone's
test runs, and never imports interlock before typeguard's import hook is in place.
With it, ``pytest --pyargs
interlock.conformance --interlock-strategy NAME`` collects one test item per
(strategy, runner, world size, precision, check), runs one driver launch per
(strategy, runner, world size) the first time one of its items runs, and writes the
JSON report at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest

from interlock.conformance.cases import Case
from interlock.conformance.report import (
    Record,
    Verdict,
    clip_message,
    summary_table,
    verdicts,
    write_report,
)

#: how long one driver launch may take before its cases fail
DRIVER_TIMEOUT_S = 900


def activate(config: pytest.Config) -> None:
    """Start a suite session (called when ``--interlock-strategy`` is given)."""
    config.stash[STATE] = SuiteState(config)


class SuiteState:
    """What one test session of the suite knows: its options, the cases, driver results
    and records."""

    def __init__(self, config: pytest.Config) -> None:
        from interlock.conformance.cases import select
        from interlock.conformance.options import OptionError, validate

        self.config = config
        try:
            self.options = validate(
                strategies=config.getoption("--interlock-strategy"),
                runner=config.getoption("--interlock-runner"),
                world_sizes=config.getoption("--interlock-world-sizes"),
                precisions=config.getoption("--interlock-precisions"),
                imports=config.getoption("--interlock-import"),
                skips_file=config.getoption("--interlock-skips-file"),
                xfails_file=config.getoption("--interlock-xfails-file"),
                report=config.getoption("--interlock-report"),
                allow_missing=config.getoption("--interlock-allow-missing-runner"),
                keep_workdir=config.getoption("--interlock-keep-workdir"),
            )
        except OptionError as error:
            raise pytest.UsageError(str(error)) from None
        self.selection = select(self.options)
        self.results: dict[str, dict[tuple[str, str], dict[str, str]]] = {}
        self.records: list[Record] = []
        self.verdicts: list[Verdict] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="interlock-conformance-"))

    @property
    def imports(self) -> tuple[str, ...]:
        return self.options.imports

    def result(self, case: Case) -> dict[str, str]:
        """The driver's record for ``case``, launching its group's driver if needed."""
        if case.group not in self.results:
            self.results[case.group] = self._drive(case)
        found = self.results[case.group].get((case.precision, case.check))
        if found is None:
            return {"status": "failed", "message": "the driver reported nothing for this check"}
        return found

    def _drive(self, case: Case) -> dict[tuple[str, str], dict[str, str]]:
        from interlock.conformance.cases import precisions_for, resolve_strategies
        from interlock.conformance.runners import RUNNERS

        spec = resolve_strategies([case.strategy])[0]
        precisions = precisions_for(spec, case.runner, self.options.precisions)
        workdir = self.workdir / case.group
        out = workdir / "records.json"
        command = [sys.executable, "-m", "interlock.conformance.driver",
                   "--strategy", case.strategy, "--accelerator", RUNNERS[case.runner],
                   "--world-size", str(case.world_size), "--precisions", ",".join(precisions),
                   "--workdir", str(workdir / "work"), "--out", str(out)]
        for module in self.imports:
            command += ["--import", module]
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / "driver.log"
        with log.open("w") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                process.wait(timeout=DRIVER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            finally:
                _kill_group(process)
        if not out.exists():
            tail = log.read_text(errors="replace")[-3000:]
            message = (f"the conformance driver for {case.group} exited with "
                       f"{process.returncode} without results; its output ends:\n{tail}")
            return _all_failed(message)
        records = json.loads(out.read_text())
        return {(r["precision"], r["check"]): r for r in records}

    def cleanup(self) -> None:
        """Remove the work directory (drivers' logs and checkpoints) unless asked to
        keep it."""
        if self.options.keep_workdir:
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


class _AllFailed(dict[tuple[str, str], dict[str, str]]):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def get(self, key: Any, default: Any = None) -> Any:
        return {"status": "failed", "message": self.message}


def _all_failed(message: str) -> dict[tuple[str, str], dict[str, str]]:
    return _AllFailed(message)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


STATE = pytest.StashKey[SuiteState]()


def suite_state(config: pytest.Config) -> SuiteState | None:
    return config.stash.get(STATE, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = suite_state(config)
    if state is None:
        return
    ids = [item.callspec.id for item in items if hasattr(item, "callspec")]
    skips, xfails = state.options.skips, state.options.xfails
    for entry, kind in [(e, "skips") for e in skips] + [(e, "xfails") for e in xfails]:
        if not any(i.startswith(entry) for i in ids):
            warnings.warn(f"interlock {kind} file: {entry!r} matches no test id",
                          stacklevel=1)
    for item in items:
        if not hasattr(item, "callspec") or "case" not in item.callspec.params:
            continue
        case: Case = item.callspec.params["case"]
        item.user_properties.append(("interlock_case", {
            "strategy": case.strategy, "runner": case.runner,
            "world_size": "*" if case.world_size is None else str(case.world_size),
            "precision": case.precision, "check": case.check,
        }))
        case_id = item.callspec.id
        if any(case_id.startswith(e) for e in skips):
            item.add_marker(pytest.mark.skip(reason="listed in the skips file"))
        elif any(case_id.startswith(e) for e in xfails):
            item.add_marker(pytest.mark.xfail(reason="listed in the xfails file", strict=True))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    if "interlock_case" not in props:
        return
    # one record per item: its call, or the setup that skipped it
    if not (report.when == "call" or (report.when == "setup" and report.skipped)):
        return
    config_state = _STATE_FOR_REPORTS.get("state")
    if config_state is None:
        return
    case: dict[str, str] = props["interlock_case"]  # type: ignore[assignment]
    if report.skipped and hasattr(report, "wasxfail"):
        status = "xfailed"
    elif report.skipped:
        status = "skipped"
    elif report.passed:
        status = "passed"
    else:
        status = "failed"
    message = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        message = clip_message(str(report.longrepr))
    config_state.records.append(Record(**case, status=status, message=message))


#: the state the report hooks write to (set per session; hooks get no config)
_STATE_FOR_REPORTS: dict[str, SuiteState] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    state = suite_state(session.config)
    if state is not None:
        _STATE_FOR_REPORTS["state"] = state


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run whose verdicts are not all good fails, even when no item failed: a
    strategy or a requested runner with nothing checked (unless allowed)."""
    state = suite_state(session.config)
    if state is None or hasattr(session.config, "workerinput"):
        return
    state.verdicts = verdicts(state.records, state.selection, state.options.allow_missing)
    if session.exitstatus == 0 and any(v.fails for v in state.verdicts):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    state = suite_state(config)
    if state is not None:
        state.cleanup()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    state = suite_state(config)
    if state is None or hasattr(config, "workerinput"):
        return
    terminalreporter.write_sep("=", "interlock conformance")
    terminalreporter.write_line(summary_table(state.verdicts))
    for name, why in sorted(state.selection.not_here.items()):
        terminalreporter.write_line(f"not run here: {name}: {why}")
    bad = [v for v in state.verdicts if v.fails]
    for verdict in bad:
        terminalreporter.write_line(f"FAILED {verdict.strategy} on {verdict.runner}: "
                                    f"{verdict.verdict}: {verdict.reason}")
    if state.options.keep_workdir:
        terminalreporter.write_line(f"work directory kept: {state.workdir}")
    path = state.options.report
    if path is not None and exitstatus == pytest.ExitCode.INTERRUPTED:
        # a partial run would verify cells on part of the evidence
        terminalreporter.write_line(f"the run was interrupted: no report written to {path}")
    elif path is not None:
        from interlock.conformance.cases import declarations

        try:
            write_report(path, state.records, state.verdicts, state.selection.runners,
                         options=state.options,
                         declared=declarations(state.selection, state.options))
        except OSError as error:
            terminalreporter.write_line(f"the report could not be written to {path}: "
                                        f"{error.strerror or error}")
        else:
            terminalreporter.write_line(f"report: {path}")
