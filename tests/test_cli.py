"""`interlock plan` as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from interlock.cli import UsageError, main, parse_simulate


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_the_explanation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--simulate", "cuda=8", "--devices", "-1",
                       "--strategy", "fsdp", "--precision", "bf16-mixed")
    assert code == 0
    assert "Plan: fsdp on 8 x cuda x 1 node (world size 8), precision bf16-mixed" in out
    assert "strategy/explicit" in out and "Machine: 8 CUDA devices" in out


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--simulate", "cpu", "--devices", "2", "--precision",
                       "16", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["plan"]["strategy"] == "ddp" and data["plan"]["precision"] == "16-mixed"
    assert data["plan"]["notes"] and data["machine"]["cuda_devices"] == 0


def test_refusal_goes_to_stderr_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "--simulate", "cuda=2", "--devices", "4")
    assert code == 2 and out == ""
    assert "[devices-unavailable]" in err and "Choices: auto, -1, 1, 2" in err
    assert "Traceback" not in err


def test_refusal_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--simulate", "cpu", "--strategy", "dp", "--json")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "unknown-strategy"


def test_env_simulates_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--simulate", "cuda=4", "--devices", "4",
                       "--num-nodes", "2", "--env", "TORCHELASTIC_RUN_ID=1",
                       "--env", "WORLD_SIZE=4", "--env", "LOCAL_WORLD_SIZE=2")
    assert code == 2 and "[cluster-mismatch]" in err and "LOCAL_WORLD_SIZE=2" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "--simulate", "gpu=2"),
        ("plan", "--simulate", "cuda=two"),
        ("plan", "--simulate", "pkg=apex"),
        ("plan", "--simulate", "cpu", "--env", "NOEQUALS"),
    ],
)
def test_bad_command_line_values(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error: --") and "Traceback" not in err


def test_simulate_tokens() -> None:
    machine = parse_simulate("cuda=8,mps,xla=4,interactive,nofork,pkg=deepspeed")
    assert (machine.cuda_devices, machine.mps_available, machine.xla_devices) == (8, True, 4)
    assert machine.interactive and "fork" not in machine.start_methods
    assert machine.packages == {"torch_xla", "deepspeed"}
    with pytest.raises(UsageError):
        parse_simulate("tpu")


def test_console_script_exits_2_without_traceback() -> None:
    exe = shutil.which("interlock", path=os.path.dirname(sys.executable))
    assert exe is not None, "the interlock console script is not installed next to python"
    proc = subprocess.run(
        [exe, "plan", "--simulate", "cpu", "--strategy", "fsdb"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Did you mean 'fsdp'?" in proc.stderr and "Traceback" not in proc.stderr


def test_matrix_profiles_and_cells(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    code, out, _ = run(capsys, "matrix", "--profiles")
    assert code == 0 and "cpu-laptop" in out and "torchrun-2x8" in out
    target = tmp_path / "cells.csv"
    code, _, err = run(capsys, "matrix", "--profile", "cpu-laptop", "--format", "csv",
                       "--output", str(target))
    lines = target.read_text().splitlines()
    assert code == 0 and lines[0].endswith(",outcome") and len(lines) > 1000, err
    assert "cpu-laptop,cpu,2,ddp,16-mixed,1,ok ddp subprocess local 2 16-mixed" in lines
    code, _, err = run(capsys, "matrix", "--profile", "nope", "--format", "json")
    assert code == 2 and "no machine profile named 'nope'" in err


def test_doctor_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doctor")
    assert code == 0 and "Machine:" in out and "cpu" in out
