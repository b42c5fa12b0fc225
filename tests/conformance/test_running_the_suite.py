"""Running the suite: inert unless asked, the CLI, skip and xfail files, applicability."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interlock import StrategySpec, registered
from interlock.conformance.cases import cases_for, resolve_strategies

CHEAP = ["--strategy", "single_device", "--world-sizes", "1", "--precisions", "32-true"]


def run_cli(*args: str, cwd: Path,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock.cli", "conformance", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
                          env=env)


@pytest.mark.timeout(120)
def test_installing_interlock_changes_no_one_elses_test_run(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_ok():\n    assert True\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=100,
                          check=False)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    assert "interlock" not in done.stdout.lower()


@pytest.mark.timeout(300)
def test_skip_and_strict_xfail_files_and_unknown_entries(tmp_path: Path) -> None:
    (tmp_path / "skips.txt").write_text(
        "# comments and blank lines are ignored\n\n"
        "single_device-cpu-w1-32-true-training_parity   # skip one item\n"
        "no_such_strategy-cpu                           # matches nothing: warned\n"
    )
    (tmp_path / "xfails.txt").write_text("single_device-cpu-w1-*-lifecycle\n")
    report = tmp_path / "report.json"
    done = run_cli(*CHEAP, "--skips-file", "skips.txt", "--xfails-file", "xfails.txt",
                   "--report", str(report), cwd=tmp_path)
    output = done.stdout + done.stderr
    assert "'no_such_strategy-cpu' matches no test id" in output, output
    # lifecycle passes, so its strict xfail turns into a failure of the run
    assert done.returncode == 1, output
    assert "XPASS(strict)" in output, output
    # the launch's log went with the work directory: the summary says how to keep it
    assert "run again with --keep-workdir" in output, output
    records = {(r["precision"], r["check"]): r for r in
               json.loads(report.read_text())["records"]}
    assert records[("32-true", "training_parity")]["status"] == "skipped"
    assert records[("32-true", "training_parity")]["message"] == "listed in the skips file"
    assert records[("*", "collectives")]["status"] == "passed"


@pytest.mark.timeout(120)
def test_an_unknown_strategy_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cli("--strategy", "no_such_strategy", cwd=tmp_path)
    assert done.returncode != 0
    assert "unknown strategy 'no_such_strategy'" in done.stdout + done.stderr


def test_cases_say_why_they_do_not_apply() -> None:
    single = registered(StrategySpec)["single_device"]
    cases = cases_for(single, "cpu", [1, 2])
    w2 = {c.skip for c in cases if c.world_size == 2}
    assert w2 == {"single_device runs on 1 device(s) at most"}
    assert all(c.skip is None for c in cases if c.world_size == 1)
    xla = cases_for(registered(StrategySpec)["xla"], "cpu", [2])
    assert {c.skip for c in xla if c.world_size == 2} == {
        "xla runs on xla, not on the cpu runner's cpu"}
    ids = [c.id for c in cases_for(registered(StrategySpec)["ddp"], "cpu", [2])]
    assert "ddp-cpu-any-*-declaration" in ids and "ddp-cpu-w2-16-mixed-scaler_skip" in ids
    assert "ddp-cpu-w2-*-relaunch" in ids
    names = [s.name for s in resolve_strategies(["all"])]
    assert "ddp_find_unused_parameters_true" not in names, "presets are not run by 'all'"
    assert {"single_device", "ddp", "fsdp", "model_parallel"} <= set(names)


@pytest.mark.parametrize(("args", "says"), [
    (["--strategy", "ddp", "--precisions", "nope"], "--precisions: unknown precision 'nope'"),
    (["--strategy", "ddp", "--precisions", "32-tru"], "did you mean '32-true'"),
    (["--strategy", "ddp", "--world-sizes", "0"], "--world-sizes '0': 0 is not a world size"),
    (["--strategy", "ddp", "--world-sizes", "1,x"], "--world-sizes '1,x': expected"),
    (["--strategy", "ddp", "--world-sizes", "9" * 5000], "expected comma-separated"),
    (["--strategy", "ddp", "--import", "no_such_module"],
     "--import 'no_such_module': importing it failed with ModuleNotFoundError"),
    (["--strategy", "ddp", "--skips-file", "/no/such/file"], "--skips-file '/no/such/file'"),
    (["--strategy", "ddp", "--xfails-file", "/no/such/file"], "--xfails-file"),
    (["--strategy", "nope"], "--strategy: unknown strategy 'nope'"),
    (["--strategy", "dpp"], "did you mean 'ddp'"),
    (["--strategy", "ddp", "--workers", "-1"], "--workers -1: expected 0"),
    (["--strategy", "ddp", "--report", "/"], "--report '/': is a directory"),
    (["--strategy", "ddp", "--report", "/proc/nope/report.json"], "cannot be written"),
])
def test_bad_options_are_one_line_usage_errors_before_anything_runs(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from interlock.cli import main

    assert main(["conformance", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert says in err, err


@pytest.mark.timeout(200)
def test_a_run_that_checked_nothing_fails_with_the_reason(tmp_path: Path) -> None:
    missing = run_cli("--strategy", "ddp", "--runner", "cuda", "--world-sizes", "1",
                      "--precisions", "32-true", cwd=tmp_path)
    output = missing.stdout + missing.stderr
    assert missing.returncode == 1, output
    assert "FAILED ddp on cuda: nothing checked: this machine has no CUDA devices" in output
    allowed = run_cli("--strategy", "ddp", "--runner", "cuda", "--world-sizes", "1",
                      "--precisions", "32-true", "--allow-missing-runner", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "nothing checked" in allowed.stdout
    undeclared = run_cli("--strategy", "fsdp", "--world-sizes", "1", "--precisions",
                         "64-true", cwd=tmp_path)
    output = undeclared.stdout + undeclared.stderr
    assert undeclared.returncode == 1, output
    assert "fsdp declares none of the precisions asked for (64-true)" in output


@pytest.mark.timeout(300)
def test_the_suite_runs_under_its_own_settings_and_cleans_up(tmp_path: Path) -> None:
    """Started inside a project whose pytest configuration would break it (a 1 s
    timeout, typeguard over interlock, stop at the first failure), the suite ignores
    that configuration, says nothing about it, leaves no work directory behind, and
    writes a report with its date, where each runner ran and the verdicts."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\ntimeout = 1\n"
        "addopts = \"--typeguard-packages=interlock -x -p no:xdist\"\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    report = tmp_path / "report.json"
    env = {**os.environ, "TMPDIR": str(temp), "PYTEST_ADDOPTS": "--timeout=1"}
    done = run_cli(*CHEAP, "--workers", "1", "--report", str(report), cwd=project, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "already imported" not in output and "Timeout" not in output, output
    # torch's compiler cache may appear there; nothing of interlock's may stay
    left = [p.name for p in temp.iterdir() if p.name.startswith("interlock")]
    assert left == [], f"the run left {left} behind"
    written = json.loads(report.read_text())
    assert written["runners"] == {"cpu": "cpu"}
    assert len(written["date"]) == 10 and written["date"][4] == "-"
    assert written["verdicts"] == [{"strategy": "single_device", "runner": "cpu",
                                    "verdict": "passed", "reason": ""}]
    kept = run_cli(*CHEAP, "--keep-workdir", cwd=project, env=env)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "work directory kept: " in kept.stdout
    assert "run again with --keep-workdir" not in output + kept.stdout  # nothing failed
    kept_dirs = [p.name for p in temp.iterdir() if p.name.startswith("interlock")]
    assert len(kept_dirs) == 1 and kept_dirs[0].startswith("interlock-conformance-")


def test_long_failure_messages_keep_their_head_and_their_end() -> None:
    from interlock.conformance.report import clip_message

    text = "training_parity (ddp on cpu, rank 1): first problem " + "x" * 10_000 + " END"
    clipped = clip_message(text)
    assert clipped.startswith("training_parity (ddp on cpu, rank 1): first problem")
    assert clipped.endswith(" END") and "characters cut" in clipped
    assert len(clipped) < 4100
    assert clip_message("short") == "short"


def test_verdicts_fail_a_run_that_checked_nothing_or_failed() -> None:
    from interlock.conformance.cases import Case, Selection
    from interlock.conformance.report import Record, verdicts

    def record(strategy: str, runner: str, check: str, status: str,
               message: str = "") -> Record:
        world = "*" if check == "declaration" else "1"
        return Record(strategy=strategy, runner=runner, world_size=world, precision="*",
                      check=check, status=status, message=message)

    records = [
        record("a", "cpu", "declaration", "passed"), record("a", "cpu", "lifecycle", "passed"),
        record("b", "cpu", "declaration", "passed"),
        record("b", "cpu", "lifecycle", "skipped", "no devices"),
        record("c", "cpu", "lifecycle", "not run", "a rank crashed"),
        record("a", "cuda", "declaration", "skipped", "no runner"),
        record("a", "cuda", "lifecycle", "skipped", "a runs on cpu"),
    ]
    cases = [Case(s, r, 1, "*", "lifecycle") for s, r in
             (("a", "cpu"), ("b", "cpu"), ("c", "cpu"), ("a", "cuda"))]
    auto = Selection(cases, ["cpu", "cuda"], declared=frozenset({("a", "cpu"), ("b", "cpu"),
                                                                 ("c", "cpu")}))
    got = {(v.strategy, v.runner): (v.verdict, v.fails) for v in verdicts(records, auto)}
    assert got == {
        ("a", "cpu"): ("passed", False),
        ("a", "cuda"): ("not applicable", False),  # auto runner, a passed elsewhere
        ("b", "cpu"): ("nothing checked", True),
        ("c", "cpu"): ("failed", True),
    }
    allowed = {(v.strategy, v.runner): v.fails for v in verdicts(records, auto, True)}
    assert allowed[("b", "cpu")] is False and allowed[("c", "cpu")] is True
    explicit = Selection(cases, ["cuda"], explicit_runner=True)
    named = {(v.strategy, v.runner): v.verdict for v in verdicts(records, explicit)}
    assert named[("a", "cuda")] == "nothing checked", "a runner asked for is not optional"


def test_a_rerun_rank_reaching_the_drivers_end_writes_no_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the driver writes --out: a rank the script launcher started by running the
    driver again must never replace the driver's records with its own view."""
    from interlock.conformance import driver
    from interlock.strategies.launchers import history
    from interlock.strategies.launchers.base import RENDEZVOUS_ENV

    monkeypatch.setattr(driver, "drive", lambda args: [{"check": "x", "status": "passed"}])
    argv = ["--strategy", "ddp", "--accelerator", "cpu", "--world-size", "2",
            "--precisions", "32-true", "--workdir", str(tmp_path / "work")]
    assert driver.main([*argv, "--out", str(tmp_path / "driver.json")]) == 0
    assert json.loads((tmp_path / "driver.json").read_text())["records"][0]["check"] == "x"

    monkeypatch.setenv(history.LAUNCH_INDEX_ENV, "0")
    monkeypatch.setenv(RENDEZVOUS_ENV, "127.0.0.1:1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert driver.main([*argv, "--out", str(tmp_path / "rerun.json")]) == 1
    assert not (tmp_path / "rerun.json").exists()
    assert not (tmp_path / "rerun.json.tmp").exists()
