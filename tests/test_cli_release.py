"""The release-facing commands as a user runs them: the suite's refusal without its
extra, this version's lock written and diffed, and report comparison wired to the
command line (the diff and the comparison themselves: test_matrix_diff.py and
conformance/test_compare.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from interlock.cli import main

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "conformance-report.json"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_suite_without_pytest_names_the_install_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pytest" else real(name, *args)

    # what a base install (no extra) looks like to the command: pytest cannot be found
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code, out, err = run(capsys, "conformance", "--strategy", "single_device")
    assert code == 2 and out == ""
    assert err == ("error: the conformance suite runs on pytest, which is not installed "
                   "here: pip install 'interlock[conformance]'\n")


def test_the_suite_needs_a_strategy_or_two_reports(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "conformance")
    assert code == 2 and "--strategy NAME is required" in err and "--compare" in err
    code, _, err = run(capsys, "conformance", "--compare", str(REPORT), str(REPORT),
                       "--strategy", "ddp")
    assert code == 2 and "--compare reads two reports and runs nothing: --strategy" in err
    assert "Traceback" not in err


def test_compare_prints_the_scorecards_and_needs_no_suite_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "conformance", "--compare", str(REPORT), str(REPORT))
    assert code == 0, err
    assert "ddp_fork" in out and "no regression" in out
    code, out, err = run(capsys, "conformance", "--compare", str(REPORT),
                         str(ROOT / "no-such-report.json"))
    assert code == 2 and out == "" and err.startswith("error: ")
    assert "no-such-report.json" in err and err.count("\n") == 1


def test_matrix_options_that_do_not_go_together_are_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    lock = str(ROOT / "matrix.lock")
    for argv, says in (
        (("matrix", "--format", "text"), "--format text is the form of --diff"),
        (("matrix", "--diff", lock, "--format", "md"), "--diff writes text or json, not md"),
        (("matrix", "--diff", lock, lock, lock), "at most one NEW_LOCK; got 3 paths"),
        (("matrix", "--diff", lock, "--profile", "cpu"), "--profile and --profiles do not"),
        (("matrix", "--format", "lock", "--profile", "cpu"), "a lock holds every profile"),
        (("matrix", "--diff", str(ROOT / "missing.lock")), "missing.lock"),
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", argv
        assert says in err and err.count("\n") == 1, (argv, err)


@pytest.mark.timeout(120)
def test_this_versions_lock_is_the_committed_one_and_diffs_clean(tmp_path: Path) -> None:
    # as a user runs it (in a process of its own, so the 756,000 cells are evaluated at
    # full speed rather than under the test run's type-checking import hook)
    written = tmp_path / "interlock.lock"
    done = subprocess.run([sys.executable, "-m", "interlock.cli", "matrix", "--format", "lock",
                           "--output", str(written)], capture_output=True, text=True,
                          timeout=100, check=False)
    assert done.returncode == 0, done.stderr
    assert written.read_text() == (ROOT / "matrix.lock").read_text(), (
        "interlock matrix --format lock differs from the committed matrix.lock")
    done = subprocess.run([sys.executable, "-m", "interlock.cli", "matrix", "--diff",
                           str(written)], capture_output=True, text=True, timeout=100,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no cell changed" in done.stdout
