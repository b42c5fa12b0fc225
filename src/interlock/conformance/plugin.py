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

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from interlock.conformance.cases import RESTARTS_SUFFIX, Case
from interlock.conformance.report import (
    Record,
    Verdict,
    clip_message,
    summary_table,
    verdicts,
    write_report,
)
from interlock.output_files import write_text

#: how long one driver launch may take before its cases fail
DRIVER_TIMEOUT_S = 900
#: the key of xdist's worker input that carries the controller's work directory
SHARED_WORKDIR = "interlock_workdir"


def activate(config: pytest.Config) -> None:
    """Start a suite session (called when ``--interlock-strategy`` is given)."""
    config.stash[STATE] = SuiteState(config)


#: seconds between the lines that say which check a long launch is running
HEARTBEAT_S = 30.0


@dataclass(frozen=True, slots=True)
class Launch:
    """One driver launch's outcome: its records by (precision, check) and its times.

    Attributes:
        seconds: the driver's wall time, interpreter start to exit.
        launch_seconds: the main launch's (the rank checks), as the driver measured
            it; None when it wrote nothing.
    """

    records: dict[tuple[str, str], dict[str, Any]]
    seconds: float
    launch_seconds: float | None = None


def launch_cost(case: Case, precisions: int, capabilities: frozenset[str],
                dims: int) -> float:
    """A rough weight of a launch, to start the slowest first (a guess from what it
    runs: ranks, precisions, the restart, timeout and mesh checks); only the order
    uses it."""
    size = case.world_size or 1
    if case.group.endswith(RESTARTS_SUFFIX):  # five launches with a restart each
        return 15.0 * size
    cost = 2.0 * size + precisions
    if size >= 2:
        cost += 4.0 if "timeout" in capabilities else 0.0
        cost += 5.0 * dims if size == 2 else 0.0
    return cost


class SuiteState:
    """What one test session of the suite knows: its options, the cases, driver results
    and records.

    Driver launches run in threads of this process, at most ``--interlock-workers`` at
    once, the costliest first (see :func:`launch_cost`); a test item waits for its
    launch. Under pytest-xdist (``pytest -n``), every worker shares the controller's
    work directory and the first worker to need a launch runs it, the others read its
    records: no launch ever runs twice.
    """

    def __init__(self, config: pytest.Config) -> None:
        from interlock.conformance.cases import select
        from interlock.conformance.options import PYTEST_OPTIONS, OptionError, validate

        self.config = config
        try:
            self.options = validate(**{name: config.getoption(option)
                                       for name, option in PYTEST_OPTIONS})
        except OptionError as error:
            raise pytest.UsageError(str(error)) from None
        self.selection = select(self.options)
        self.launches: dict[str, Launch] = {}
        self.records: list[Record] = []
        self.verdicts: list[Verdict] = []
        shared = getattr(config, "workerinput", {}).get(SHARED_WORKDIR)
        self.shared = shared is not None
        self.workdir = (Path(shared) if shared is not None
                        else Path(tempfile.mkdtemp(prefix="interlock-conformance-")))
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Launch]] = {}
        self._running: dict[str, float] = {}  # group -> monotonic start
        self._announced: set[str] = set()
        self._processes: set[subprocess.Popen[bytes]] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._stopping = False

    # -------------------------------------------------------------- scheduling

    def schedule(self, cases: list[Case]) -> None:
        """Start the launches that ``cases`` (the items collected and not skipped)
        need, costliest first, in a pool of ``--interlock-workers`` threads."""
        if self.shared or self._pool is not None:
            return  # an xdist worker runs a launch when an item asks for it
        from interlock.conformance.cases import precisions_for, resolve_strategies
        from interlock.conformance.table import CHECKS_BY_ID, InPytest

        first: dict[str, Case] = {}
        for case in cases:
            if (case.skip is None and not isinstance(CHECKS_BY_ID[case.check].runs, InPytest)
                    and _gated(case) is None):
                first.setdefault(case.group, case)
        if not first:
            return

        def cost(case: Case) -> float:
            spec = resolve_strategies([case.strategy])[0]
            count = len(precisions_for(spec, case.runner, self.options.precisions))
            return launch_cost(case, count, spec.capabilities, len(spec.parallel_dims))

        ordered = sorted(first.values(), key=cost, reverse=True)
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.options.workers),
                                        thread_name_prefix="interlock-launch")
        for case in ordered:
            self._futures[case.group] = self._pool.submit(self._timed, case)

    def result(self, case: Case) -> dict[str, Any]:
        """The driver's record for ``case``, waiting for (or running) its launch; a
        check the strategy's declarations or the world size rule out is skipped
        without one."""
        gated = _gated(case)
        if gated is not None:
            return {"status": "skipped", "message": gated}
        launch = self.launches.get(case.group)
        if launch is None:
            future = self._futures.get(case.group)
            if future is None:  # not scheduled (an xdist worker): run it here
                launch = self._claimed_or_run(case)
            else:
                launch = self._wait(future)
            self.launches[case.group] = launch
        found = launch.records.get((case.precision, case.check))
        if found is None:
            return {"status": "failed", "message": "the driver reported nothing for this check"}
        return found

    def _wait(self, future: Future[Launch]) -> Launch:
        """Wait for one launch, saying meanwhile which launches finished and which
        check a long one runs."""
        while True:
            try:
                launch = future.result(timeout=HEARTBEAT_S)
            except FutureTimeout:
                self._announce(heartbeat=True)
                continue
            self._announce(heartbeat=False)
            return launch

    def _timed(self, case: Case) -> Launch:
        with self._lock:
            self._running[case.group] = time.monotonic()
        try:
            return self._drive(case)
        finally:
            with self._lock:
                self._running.pop(case.group, None)

    def _claimed_or_run(self, case: Case) -> Launch:
        """Under xdist: run the launch if no other worker claimed it, else wait for
        the records of the worker that did."""
        workdir = self.workdir / case.group
        workdir.mkdir(parents=True, exist_ok=True)
        if not self.shared:
            return self._timed(case)
        try:
            os.close(os.open(workdir / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            done = workdir / "launch.json"
            deadline = time.monotonic() + DRIVER_TIMEOUT_S + 60
            while not done.exists():
                if time.monotonic() > deadline:
                    return Launch(_AllFailed(f"the worker that ran {case.group} wrote "
                                              "nothing"), 0.0)
                time.sleep(0.2)
            saved = json.loads(done.read_text())
            return Launch(_AllFailed(saved["failed"]) if saved.get("failed") else
                          {(r["precision"], r["check"]): r for r in saved["records"]},
                          saved["seconds"], saved.get("launch_seconds"))
        launch = self._timed(case)
        failed = launch.records.message if isinstance(launch.records, _AllFailed) else None
        saved_records = [] if failed else list(launch.records.values())
        write_text(workdir / "launch.json", json.dumps({
            "records": saved_records, "failed": failed, "seconds": launch.seconds,
            "launch_seconds": launch.launch_seconds}))
        return launch

    # ---------------------------------------------------------------- progress

    def _announce(self, heartbeat: bool) -> None:
        """One line per launch finished since the last call; with ``heartbeat``, one
        per launch still running: how long, and the check it is in."""
        lines = []
        for group, future in self._futures.items():
            if group in self._announced or not future.done() or future.cancelled():
                continue
            self._announced.add(group)
            error = future.exception()
            if error is None:
                lines.append(f"{group}: {_finished(future.result())}")
        if heartbeat:
            from interlock.conformance.driver import current_check

            with self._lock:
                running = dict(self._running)
            for group, began in sorted(running.items()):
                now = current_check(self.workdir / group / "work")
                what = "" if now is None else (
                    f", in {now[0]} for {max(0.0, time.time() - now[1]):.0f} s")
                lines.append(f"{group}: running for {time.monotonic() - began:.0f} s{what}")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or not lines:
            return
        # the item that waits runs under pytest's output capture: the lines go past it
        with (capture.global_and_fixture_disabled() if capture is not None
              else contextlib.nullcontext()):
            writer = getattr(reporter, "_tw", None)
            if getattr(writer, "width_of_current_line", 0):
                reporter.write("\n")  # after pytest's progress dots
            for line in lines:
                reporter.write_line(f"interlock: {line}")

    # --------------------------------------------------------------- one launch

    def _drive(self, case: Case) -> Launch:
        from interlock.conformance.cases import precisions_for, resolve_strategies
        from interlock.conformance.runners import RUNNERS
        from interlock.conformance.table import CHECKS

        began = time.monotonic()
        spec = resolve_strategies([case.strategy])[0]
        precisions = precisions_for(spec, case.runner, self.options.precisions)
        workdir = self.workdir / case.group
        out = workdir / "records.json"
        command = [sys.executable, "-m", "interlock.conformance.driver",
                   "--strategy", case.strategy, "--accelerator", RUNNERS[case.runner],
                   "--world-size", str(case.world_size), "--precisions", ",".join(precisions),
                   "--workdir", str(workdir / "work"), "--out", str(out)]
        for module in self.options.imports:
            command += ["--import", module]
        restarts = case.group.endswith(RESTARTS_SUFFIX)
        ids = [c.id for c in CHECKS if c.own_launch == restarts
               and (self.options.checks is None or c.id in self.options.checks)]
        command += ["--checks", ",".join(ids)]
        if restarts:
            command.append("--no-main-launch")
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir / "driver.log"
        with log.open("w") as output:
            with self._lock:
                if self._stopping:
                    return Launch(_AllFailed("the run was stopped"), 0.0)
                process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                           start_new_session=True, env=_driver_environ())
                self._processes.add(process)
            try:
                process.wait(timeout=DRIVER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            finally:
                _kill_group(process)
                with self._lock:
                    self._processes.discard(process)
        seconds = time.monotonic() - began
        if not out.exists():
            tail = log.read_text(errors="replace")[-3000:]
            message = (f"the conformance driver for {case.group} exited with "
                       f"{process.returncode} without results; its output ends:\n{tail}")
            return Launch(_AllFailed(message), seconds)
        written = json.loads(out.read_text())
        return Launch({(r["precision"], r["check"]): r for r in written["records"]},
                      seconds, written.get("launch_seconds"))

    def stop(self) -> None:
        """Stop every launch: none starts any more, the running ones are killed."""
        with self._lock:
            self._stopping = True
            running = list(self._processes)
        for process in running:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def cleanup(self) -> None:
        """Stop the launches; remove the work directory (drivers' logs and
        checkpoints) unless asked to keep it, or it is the xdist controller's."""
        self.stop()
        if self.options.keep_workdir or self.shared:
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


def _driver_environ() -> dict[str, str]:
    """A driver's environment: this one, unbuffered, and one intra-op thread per
    process unless ``OMP_NUM_THREADS`` says otherwise. The launchers already give their
    workers one; the driver also trains (the references, a rank 0 that runs in it), and
    with launches running side by side a full thread pool per process oversubscribes
    the cores: the same tiny training then took 20 to 60 times as long."""
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def _gated(case: Case) -> str | None:
    """Why the check does not apply to the case's strategy, precision and world size
    (the driver's own rule, :func:`~interlock.conformance.table.skip_reason`), or None."""
    from interlock.conformance.cases import resolve_strategies
    from interlock.conformance.table import CHECKS_BY_ID, skip_reason

    check = CHECKS_BY_ID[case.check]
    if case.world_size is None:
        return None
    spec = resolve_strategies([case.strategy])[0]
    return skip_reason(check, capabilities=spec.capabilities,
                       precision=case.precision if check.per_precision else None,
                       world_size=case.world_size, parallel_dims=spec.parallel_dims)


def _finished(launch: Launch) -> str:
    """``41.0 s, 45 checks; slowest survives_hang 11.5 s, collective_timeout 10.2 s``"""
    if isinstance(launch.records, _AllFailed):
        return f"{launch.seconds:.1f} s, no records: {launch.records.message.splitlines()[0]}"
    timed: dict[str, float] = {}
    for record in launch.records.values():
        timed[record["check"]] = timed.get(record["check"], 0.0) + record.get("seconds", 0.0)
    failed = sum(r["status"] in ("failed", "not run") for r in launch.records.values())
    slowest = sorted(timed.items(), key=lambda item: -item[1])[:3]
    return (f"{launch.seconds:.1f} s, {len(launch.records)} records"
            + (f", {failed} failed" if failed else "")
            + "; slowest " + ", ".join(f"{c} {t:.1f} s" for c, t in slowest if t >= 0.05))


class _AllFailed(dict[tuple[str, str], dict[str, Any]]):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def get(self, key: Any, default: Any = None) -> Any:
        return {"status": "failed", "message": self.message}


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def launch_times(launches: dict[str, Launch], selection: Any) -> list[dict[str, Any]]:
    """The report's ``launches``: each driver launch's wall time and its main
    launch's, by strategy, runner and world size."""
    by_group = {case.group: case for case in selection.cases}
    out = []
    for group, launch in sorted(launches.items()):
        case = by_group.get(group)
        if case is None:
            continue
        out.append({"strategy": case.strategy, "runner": case.runner,
                    "world_size": str(case.world_size), "seconds": round(launch.seconds, 3),
                    "launch_seconds": launch.launch_seconds})
    return out


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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the launches the collected items need (not under xdist: its workers
    start a launch when an item asks)."""
    state = suite_state(session.config)
    if (state is None or session.config.pluginmanager.hasplugin("dsession")
            or session.config.option.collectonly):
        return
    wanted = []
    for item in session.items:
        if not hasattr(item, "callspec") or "case" not in item.callspec.params:
            continue
        if item.get_closest_marker("skip") is None:
            wanted.append(item.callspec.params["case"])
    state.schedule(wanted)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller: every worker shares its work directory, where the
    first worker to need a launch claims it."""
    state = suite_state(node.config)
    if state is not None:
        node.workerinput[SHARED_WORKDIR] = str(state.workdir)


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
    seconds = props.get("interlock_seconds")
    config_state.records.append(Record(**case, status=status, message=message,
                                       seconds=seconds if isinstance(seconds, float) else None))


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
    if (state is None or hasattr(session.config, "workerinput")
            or session.config.option.collectonly):
        return  # nothing ran: no verdict to give
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
    if state is None or hasattr(config, "workerinput") or config.option.collectonly:
        return
    terminalreporter.write_sep("=", "interlock conformance")
    terminalreporter.write_line(summary_table(state.verdicts))
    for name, why in sorted(state.selection.not_here.items()):
        terminalreporter.write_line(f"not run here: {name}: {why}")
    bad = [v for v in state.verdicts if v.fails]
    for verdict in bad:
        terminalreporter.write_line(f"FAILED {verdict.strategy} on {verdict.runner}: "
                                    f"{verdict.verdict}: {verdict.reason}")
    if state.launches:
        slow = sorted(state.launches.items(), key=lambda item: -item[1].seconds)[:5]
        terminalreporter.write_line("slowest launches: " + ", ".join(
            f"{group} {launch.seconds:.1f} s" for group, launch in slow))
    if state.options.partial:
        terminalreporter.write_line("partial run (--checks): its report verifies no cell")
    if state.options.keep_workdir:
        terminalreporter.write_line(f"work directory kept: {state.workdir}")
    elif bad:
        # a rank that crashed in native code leaves its reason only in the log
        terminalreporter.write_line(
            "each launch's log (every rank's output) went with the work directory: run "
            "again with --keep-workdir (under pytest, --interlock-keep-workdir) to read it")
    path = state.options.report
    if path is not None and exitstatus == pytest.ExitCode.INTERRUPTED:
        # a partial run would verify cells on part of the evidence
        terminalreporter.write_line(f"the run was interrupted: no report written to {path}")
    elif path is not None:
        from interlock.conformance.cases import declarations

        try:
            write_report(path, state.records, state.verdicts, state.selection.runners,
                         options=state.options,
                         declared=declarations(state.selection, state.options),
                         launches=launch_times(state.launches, state.selection))
        except OSError as error:
            terminalreporter.write_line(f"the report could not be written to {path}: "
                                        f"{error.strerror or error}")
        else:
            terminalreporter.write_line(f"report: {path}")
