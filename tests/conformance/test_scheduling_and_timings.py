"""How the suite spends its time: each launch runs once (with its own workers or under
pytest-xdist), says how long it took, and a run of a subset of checks verifies nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from interlock.conformance import timings
from interlock.conformance.cases import Case
from interlock.conformance.launch_checks import (
    MIN_TIMEOUT_S,
    TIMEOUT_S,
    LaunchContext,
    suite_timeout,
)
from interlock.conformance.plugin import launch_cost
from interlock.matrix.reports import read_report

HERE = Path(__file__).resolve().parent
#: two world sizes of a strategy that needs no other process: two launches, cheap
CHEAP = ["--interlock-strategy", "single_device", "--interlock-world-sizes", "1",
         "--interlock-precisions", "32-true,bf16-mixed", "--interlock-runner", "cpu"]


def _suite(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path,
                                                 list[str]]:
    """Run the suite under pytest with ``extra``; return the run, its report and the
    pids of the driver launches it made."""
    report, launches = tmp_path / "report.json", tmp_path / "launches.txt"
    env = {**os.environ, "INTERLOCK_TEST_LAUNCHES": str(launches),
           "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [
               os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "interlock.conformance", "-q",
         "-p", "no:cacheprovider", "-o", "addopts=", *CHEAP, "--interlock-import",
         "count_launches", "--interlock-report", str(report), *extra],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    pids = launches.read_text().split() if launches.exists() else []
    return done, report, pids


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [["--interlock-workers", "2"], ["-n", "2"]],
                         ids=["own-workers", "xdist"])
def test_every_launch_runs_once_however_the_items_are_spread(
        tmp_path: Path, workers: list[str]) -> None:
    """pytest-xdist spreads one launch's items over its workers (its grouping is not
    honoured by every pytest): the first worker to need a launch runs it, the others
    read its records."""
    done, report, pids = _suite(tmp_path, *workers)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert len(pids) == 1, f"one launch (world size 1) ran {len(pids)} times: {output}"
    written = json.loads(report.read_text())
    passed = [r for r in written["records"] if r["status"] == "passed"]
    assert len(passed) > 10, written["records"]


@pytest.mark.timeout(300)
def test_the_report_times_every_check_and_launch_and_the_run_says_so(
        tmp_path: Path) -> None:
    done, report, _ = _suite(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    written = json.loads(report.read_text())
    ran = [r for r in written["records"] if r["status"] == "passed" and r["world_size"] != "*"]
    assert ran and all(isinstance(r["seconds"], float) and r["seconds"] >= 0 for r in ran)
    [launch] = written["launches"]
    assert launch["strategy"] == "single_device" and launch["world_size"] == "1"
    assert 0 < launch["launch_seconds"] <= launch["seconds"]
    # the launch's line as it finishes, and the slowest launches at the end
    assert "interlock: single_device-cpu-w1: " in output, output
    assert "slowest launches: single_device-cpu-w1 " in output, output
    assert written["partial"] is False
    text = timings.render(written)
    assert "| single_device | 1 | " in text and "| training_parity | 2 | " in text, text


@pytest.mark.timeout(300)
def test_a_run_of_some_checks_is_partial_and_verifies_nothing(tmp_path: Path) -> None:
    done, report, _ = _suite(tmp_path, "--interlock-checks", "training_parity,collectives")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "partial run (--checks): its report verifies no cell" in output
    written = json.loads(report.read_text())
    assert {r["check"] for r in written["records"]} == {"training_parity", "collectives"}
    assert all(r["status"] == "passed" for r in written["records"]), written["records"]
    assert written["partial"] is True
    assert written["options"]["checks"] == ["training_parity", "collectives"]
    assert read_report(report).verified == {}
    # the same records in a report that does not say partial verify both precisions
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({**written, "partial": False}))
    assert len(read_report(whole).verified) == 2


def test_an_unknown_check_is_a_one_line_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    from interlock.cli import main

    assert main(["conformance", "--strategy", "ddp", "--checks", "training_parityy"]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "unknown check 'training_parityy'" in err, err
    assert "did you mean 'training_parity'?" in err


def _context(setup: float | None) -> LaunchContext:
    return LaunchContext(strategy=None, spec=None, world_size=2,  # type: ignore[arg-type]
                         workdir=Path("."), resolve=lambda p, d: None,
                         resolve_layout=lambda p, d, layout: None, environ_before={},
                         passed=None, passed_before={},  # type: ignore[arg-type]
                         setup_seconds=setup)


def test_the_timeout_checks_wait_a_timeout_sized_to_how_fast_ranks_start() -> None:
    assert suite_timeout(_context(None)) == TIMEOUT_S  # nothing measured: the longest
    assert suite_timeout(_context(0.3)) == MIN_TIMEOUT_S  # forked ranks
    assert suite_timeout(_context(2.0)) == 6.0
    assert suite_timeout(_context(30.0)) == TIMEOUT_S  # never longer
    # the restarts driver has no main launch: a whole reference launch sizes it, and
    # the main launch's measurement wins where there is one
    assert suite_timeout(_context(None), measured=1.0) == MIN_TIMEOUT_S
    assert suite_timeout(_context(None), measured=3.0) == 9.0
    assert suite_timeout(_context(2.0), measured=0.1) == 6.0


def test_the_costliest_launches_start_first() -> None:
    def case(size: int, check: str = "lifecycle") -> Case:
        return Case("s", "cpu", size, "*", check)

    none: frozenset[str] = frozenset()
    restarts = launch_cost(case(2, "survives_kill"), 1, none, 0)
    assert case(2, "survives_kill").group == "s-cpu-w2-restarts"
    assert restarts > launch_cost(case(2), 7, frozenset({"timeout"}), 1)
    assert launch_cost(case(2), 1, none, 0) > launch_cost(case(1), 1, none, 0)
    assert launch_cost(case(2), 1, none, 2) > launch_cost(case(2), 1, none, 0)


def test_the_restart_checks_run_beside_the_main_launch_and_only_they() -> None:
    """They resolve their own strategies; every other launch check reads the main
    launch (its strategy, its result, the environment around it) and stays in it."""
    from interlock.conformance.table import CHECKS

    beside = {c.id for c in CHECKS if c.own_launch}
    assert beside == {"survives_kill", "survives_raise_in_backward", "survives_hang",
                      "survives_kill_during_save", "recipe_resume"}
    assert {Case("s", "cpu", 2, "*", c).group for c in beside} == {"s-cpu-w2-restarts"}
    assert Case("s", "cpu", 2, "*", "collective_timeout").group == "s-cpu-w2"


def test_a_report_without_times_says_so() -> None:
    legacy: dict[str, Any] = json.loads((HERE / "legacy-report.json").read_text())
    assert timings.render(legacy) == "this report has no timings (it predates them)\n"


@pytest.mark.timeout(120)
def test_collecting_only_launches_nothing_and_gives_no_verdict(tmp_path: Path) -> None:
    done, report, pids = _suite(tmp_path, "--collect-only")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert pids == [], f"--collect-only started {len(pids)} launches"
    assert "tests collected" in output and "nothing checked" not in output, output
    assert not report.exists()


@pytest.mark.parametrize("content, args, says", [
    (None, [], "not a readable report"),
    ("not json", [], "not a readable report"),
    ("[1, 2]", [], "not a conformance report"),
    ('{"launches": [{"seconds": "x"}]}', [], "are not a conformance report's"),
    ("{}", ["--top", "0"], "--top 0: expected a positive number"),
])
def test_the_timings_command_refuses_junk_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
        args: list[str], says: str) -> None:
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    assert timings.main([str(path), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err


def test_drivers_run_one_intra_op_thread_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Launches run side by side: a full thread pool in each driver oversubscribes the
    cores (the same tiny training took 20 to 60 times as long). A user's own
    OMP_NUM_THREADS is kept."""
    from interlock.conformance.plugin import _driver_environ

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    environ = _driver_environ()
    assert environ["OMP_NUM_THREADS"] == "1" and environ["PYTHONUNBUFFERED"] == "1"
    assert "OMP_NUM_THREADS" not in os.environ  # this process's own is left alone
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _driver_environ()["OMP_NUM_THREADS"] == "3"
