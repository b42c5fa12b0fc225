"""The fault-injection checks (survives_*): they pass for a strategy that restarts and
resumes exactly, fail one whose load loses the optimizer state, and are skipped, with
the reason, for a strategy that does not declare "elastic"."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from suite_runs import run_suite

from interlock.conformance import faults

SURVIVES = ("survives_kill", "survives_raise_in_backward", "survives_hang",
            "survives_kill_during_save")

#: strategies whose restart changes what the recipe computes -> what recipe_resume says
RESUME_BUGS: dict[str, str] = {
    # dropout masks differ after the load; the data order does not
    "broken_forgets_random_state": "params['",
    "broken_reshuffles_on_restart": "read other batches than the undisturbed run",
    "broken_unties_on_load": "params['",
}


def _ours(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (the forked ranks keep the
    driver's command line, which names its work directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in command:
            found.append(f"{proc.name}: {command[:200]}")
    return found


#: the tests that read the suite's fault run are in the slow tier (``nox -s slow``, which
#: CI runs): restarts under real launchers, about two minutes of both cores; the rest of
#: this file stays in the default tier
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One suite run: ddp_fork, a strategy whose load drops the optimizer state (it
    declares elastic), and one that does not declare elastic; only the checks these
    tests read (``--interlock-checks``), which halves the run."""
    workdir = tmp_path_factory.mktemp("faults")
    before = os.environ.get("TMPDIR")
    # the drivers' work directories, and so their ranks' command lines, land here
    os.environ["TMPDIR"] = str(workdir)
    try:
        run = run_suite(workdir, "broken_strategies",
                        ["ddp_fork", "broken_loses_optimizer_state_on_load",
                         "correct_ddp_subclass", *RESUME_BUGS],
                        "--interlock-workers", "2", "--interlock-checks",
                        ",".join((*SURVIVES, "recipe_resume", "recipe_parity",
                                  "training_parity")))
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
    run["left"] = _ours(str(workdir))
    return run


def _records(run: dict[str, Any], strategy: str) -> dict[str, dict[str, str]]:
    return {r["check"]: r for r in run["report"]["records"]
            if r["strategy"] == strategy and r["check"] in SURVIVES}


@slow
@pytest.mark.timeout(900)
def test_the_fault_checks_pass_for_ddp_fork(fault_run: dict[str, Any]) -> None:
    records = _records(fault_run, "ddp_fork")
    assert set(records) == set(SURVIVES), records
    w2 = {r["check"]: r for r in fault_run["report"]["records"]
          if r["strategy"] == "ddp_fork" and r["world_size"] == "2" and r["check"] in SURVIVES}
    failed = {k: v["message"][:600] for k, v in w2.items() if v["status"] != "passed"}
    assert not failed, failed
    assert not fault_run["left"], f"processes left behind: {fault_run['left']}"


@slow
@pytest.mark.timeout(900)
def test_a_load_that_loses_the_optimizer_state_fails(fault_run: dict[str, Any]) -> None:
    record = _records(fault_run, "broken_loses_optimizer_state_on_load")["survives_kill"]
    assert record["status"] == "failed", record
    assert "differ from the uninterrupted run" in record["message"], record
    assert "['optimizer']['state']" in record["message"], record
    assert not fault_run["left"], f"processes left behind: {fault_run['left']}"


@slow
@pytest.mark.timeout(900)
def test_a_strategy_not_declaring_elastic_is_skipped(fault_run: dict[str, Any]) -> None:
    records = _records(fault_run, "correct_ddp_subclass")
    assert set(records) == set(SURVIVES)
    for record in records.values():
        assert record["status"] == "skipped", record
        assert record["message"] == "the strategy does not declare 'elastic'", record


# ------------------------------------------------------------------ no processes


def test_faults_are_validated_and_know_where_training_resumes() -> None:
    with pytest.raises(ValueError, match="fault kind"):
        faults.Fault(kind="explode", rank=0, step=1)
    with pytest.raises(ValueError, match="fault step"):
        faults.Fault(kind="kill", rank=0, step=faults.STEPS)
    assert faults.Fault(kind="kill", rank=1, step=5).resumes_from() == 4
    assert faults.Fault(kind="kill", rank=1, step=4).resumes_from() == 4
    # the save after step 3 is the checkpoint of step 4: the one before it survives
    assert faults.Fault(kind="kill_during_save", rank=1, step=3).resumes_from() == 2
    assert faults.Fault(kind="kill_during_save", rank=0, step=4).resumes_from() == 4


def test_differences_are_bit_for_bit() -> None:
    a = {"params": {"w": torch.ones(2)}, "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                                                      "param_groups": [{"lr": 0.01}]}}
    same = {"params": {"w": torch.ones(2)},
            "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                          "param_groups": [{"lr": 0.01}]}}
    assert faults.differences(same, a) == []
    nudged = {**same, "params": {"w": torch.ones(2).nextafter(torch.full((2,), 2.0))}}
    assert faults.differences(nudged, a) == [
        "['params']['w']: differs (torch.float32[2] vs torch.float32[2], max |difference| "
        "1.19e-07)"]
    emptied = {**same, "optimizer": {"state": {}, "param_groups": [{"lr": 0.01}]}}
    assert faults.differences(emptied, a) == ["['optimizer']['state'][0]: missing"]
    assert faults.differences({**same, "params": {"w": torch.ones(2, dtype=torch.float64)}},
                              a)


def _record(run: dict[str, Any], strategy: str, check: str) -> dict[str, str]:
    found = [r for r in run["report"]["records"] if r["strategy"] == strategy
             and r["check"] == check and r["world_size"] == "2"]
    assert len(found) == 1, found
    record: dict[str, str] = found[0]
    return record


@slow
@pytest.mark.timeout(900)
def test_the_recipe_checks_pass_for_ddp_fork(fault_run: dict[str, Any]) -> None:
    for check in ("recipe_parity", "recipe_resume"):
        record = _record(fault_run, "ddp_fork", check)
        assert record["status"] == "passed", record


@slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", list(RESUME_BUGS))
def test_a_restart_that_changes_the_recipe_fails_recipe_resume(
        fault_run: dict[str, Any], strategy: str) -> None:
    """Each bug passes every check that trains without a restart (recipe_parity
    included) and fails recipe_resume, saying what differed."""
    record = _record(fault_run, strategy, "recipe_resume")
    assert record["status"] == "failed", record
    assert RESUME_BUGS[strategy] in record["message"], record["message"]
    assert _record(fault_run, strategy, "recipe_parity")["status"] == "passed"
    assert _record(fault_run, strategy, "training_parity")["status"] == "passed"
