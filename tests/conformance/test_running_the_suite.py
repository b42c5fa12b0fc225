"""Running the suite: inert unless asked, the CLI, skip and xfail files, applicability."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from interlock.conformance.cases import cases_for, resolve_strategies
from interlock.connector.registry import strategy_specs

CHEAP = ["--strategy", "single_device", "--world-sizes", "1", "--precisions", "32-true"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock.cli", "conformance", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


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
    single = strategy_specs()["single_device"]
    cases = cases_for(single, "cpu", [1, 2])
    w2 = {c.skip for c in cases if c.world_size == 2}
    assert w2 == {"single_device runs on 1 device(s) at most"}
    assert all(c.skip is None for c in cases if c.world_size == 1)
    deepspeed = cases_for(strategy_specs()["deepspeed"], "cpu", [2])
    assert {c.skip for c in deepspeed if c.world_size == 2} == {
        "deepspeed runs on cuda, not on the cpu runner's cpu"}
    ids = [c.id for c in cases_for(strategy_specs()["ddp"], "cpu", [2])]
    assert "ddp-cpu-any-*-declaration" in ids and "ddp-cpu-w2-16-mixed-scaler_skip" in ids
    assert "ddp-cpu-w2-*-relaunch" in ids
    names = [s.name for s in resolve_strategies(["all"])]
    assert "ddp_find_unused_parameters_true" not in names, "presets are not run by 'all'"
    assert {"single_device", "ddp", "fsdp", "model_parallel"} <= set(names)
