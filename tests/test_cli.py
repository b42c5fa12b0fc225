"""`interlock plan` as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from typeguard import suppress_type_checks

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


def test_plan_takes_the_degrees_of_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--simulate", "cuda=8", "--strategy", "fsdp",
                       "--parallelism", "dp_replicate=2,dp_shard=4", "--json")
    assert code == 0
    data = json.loads(out)["plan"]
    assert data["parallelism"] == {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 1}
    assert data["mesh"]["shape"] == [1, 2, 4, 1, 1]
    code, out, err = run(capsys, "plan", "--simulate", "cuda=8", "--strategy", "ddp",
                         "--parallelism", "tp=2")
    assert code == 2 and out == "" and "[unsupported-parallelism]" in err
    assert "Traceback" not in err


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


# --------------------------------------------------------------------------- output files


def _unwritable_outputs(tmp_path: Any) -> list[tuple[str, str]]:
    cases = [(str(tmp_path), "is a directory; give a file path"),
             ("", "is empty; give a file path")]
    if os.path.isdir("/proc"):
        cases += [("/proc/x.md", "cannot be written (/proc is not a writable directory)"),
                  ("/proc/nope/deeper/x.md", "cannot be written (/proc is not")]
    return cases


@pytest.mark.parametrize("fmt", ["md", "csv"])
def test_matrix_refuses_an_unwritable_output_before_the_work(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
        fmt: str) -> None:
    from interlock import matrix
    from interlock.matrix import compat

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the matrix was computed before the output was checked")

    monkeypatch.setattr(compat, "render_markdown", no_work)
    monkeypatch.setattr(matrix, "evaluate", no_work)
    profile = ["--profile", "cpu-laptop"] if fmt == "csv" else []
    for output, says in _unwritable_outputs(tmp_path):
        code, out, err = run(capsys, "matrix", "--format", fmt, *profile, "--output", output)
        assert code == 2 and out == "", (output, err)
        assert err.startswith(f"error: --output {output!r}: {says}"), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == [], "a refused output left files behind"


@suppress_type_checks  # three whole pages: 0.3 s each as shipped, seconds under typeguard
def test_matrix_output_is_written_whole_or_not_at_all(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any) -> None:
    target = tmp_path / "nested" / "compat.md"
    code, _, err = run(capsys, "matrix", "--output", str(target))
    assert code == 0 and err == f"wrote {target}\n", err
    page = target.read_text()
    assert page.startswith("# Compatibility")
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask()), "mode of a new file"
    target.chmod(0o640)

    def disk_full(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    code, out, err = run(capsys, "matrix", "--format", "html", "--output", str(target))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err == (f"error: --output {str(target)!r}: cannot be written: "
                   "No space left on device\n"), err
    assert target.read_text() == page, "the old file was changed by a failed write"
    assert sorted(p.name for p in target.parent.iterdir()) == ["compat.md"], (
        "a failed write left its temporary file behind")
    monkeypatch.undo()
    code, _, _ = run(capsys, "matrix", "--format", "html", "--output", str(target))
    assert code == 0 and target.read_text().lstrip().startswith("<")
    assert target.stat().st_mode & 0o777 == 0o640, "replacing a file changed its mode"


@pytest.mark.skipif(os.name != "posix", reason="needs the POSIX character device "
                    "/dev/null (Windows' NUL is not a file one could replace)")
def test_matrix_output_to_a_device_writes_in_place(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = os.stat(os.devnull)
    code, _, err = run(capsys, "matrix", "--output", os.devnull)
    after = os.stat(os.devnull)
    assert code == 0, err
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev), (
        "/dev/null was replaced by a regular file")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_conformance_report_is_checked_before_the_suite_runs(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any) -> None:
    def no_run(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("pytest ran before --report was checked")

    monkeypatch.setattr(pytest, "main", no_run)
    # an empty --report means no report, so that case is left out
    for report, says in [case for case in _unwritable_outputs(tmp_path) if case[0]]:
        code, out, err = run(capsys, "conformance", "--strategy", "ddp", "--report", report)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"error: --report {report!r}: {says}"), err


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(("argv", "says"), [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--bogus", "plan"], "unrecognized arguments: --bogus"),
    (["plan", "--bogus"], "unrecognized arguments: --bogus"),
    (["matrix", "--bogus", "--also"], "unrecognized arguments: --bogus --also"),
    (["bogus"], "argument command: invalid choice: 'bogus'"),
    ([], "the following arguments are required: command (one of plan, matrix, doctor, "
         "conformance, env)"),
])
def test_bad_arguments_are_named(capsys: pytest.CaptureFixture[str], argv: list[str],
                                 says: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    _, err = capsys.readouterr()
    assert info.value.code == 2, err
    assert f"interlock: error: {says}" in err, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- env


def test_env_report_is_markdown_with_secrets_left_out() -> None:
    from interlock import Machine
    from interlock.envreport import ELIDED, env_report

    environ = {
        "SLURM_JOB_ID": "42", "NCCL_SOCKET_IFNAME": "eth0", "MASTER_PORT": "29500",
        "TORCHELASTIC_AUTH_TOKEN": "hunter2", "SLURM_SECRET_KEY": "hunter3",
        "NCCL_PASSWORD": "hunter4", "KUBERNETES_CREDENTIALS": "hunter5",
        "MASTER_ADDR": "https://alice:hunter6@head-node:8000/x",
        "HF_TOKEN": "hunter7", "HOME": "/root",
    }
    report = env_report(Machine(cuda_devices=2, packages=frozenset({"deepspeed"})),
                        environ)
    assert "hunter" not in report, report
    assert "alice" not in report, report
    for name in ("TORCHELASTIC_AUTH_TOKEN", "SLURM_SECRET_KEY", "NCCL_PASSWORD",
                 "KUBERNETES_CREDENTIALS"):
        assert f"{name}={ELIDED}\n" in report, report
    assert f"MASTER_ADDR=https://{ELIDED}@head-node:8000/x" in report
    assert "SLURM_JOB_ID=42" in report and "NCCL_SOCKET_IFNAME=eth0" in report
    assert "HF_TOKEN" not in report and "HOME" not in report, "not a cluster variable"
    for heading in ("## interlock env", "### Versions", "### Machine", "### Plan of the "
                    "default flags", "### Cluster variables"):
        assert heading in report, report
    for row in ("| interlock |", "| torch |", "| Python |", "| platform |",
                "| deepspeed |", "| torch_xla |", "| transformer_engine |",
                "| bitsandbytes |", "| CUDA devices | 2 |",
                "| optional packages | deepspeed |"):
        assert row in report, report
    assert "Plan: ddp on 2 x cuda" in report


def test_env_report_shows_the_refusal_of_the_default_flags() -> None:
    from interlock import Machine
    from interlock.envreport import env_report

    machine = Machine(environ={"TORCHELASTIC_RUN_ID": "1", "WORLD_SIZE": "4",
                               "LOCAL_WORLD_SIZE": "2"})
    report = env_report(machine, {})
    assert "refused: [cluster-mismatch]" in report, report
    assert "### Cluster variables\n\nnone set\n" in report


def test_secret_looking_names() -> None:
    from interlock.envreport import is_secret

    for name in ("HF_TOKEN", "aws_secret_access_key", "DB_PASSWORD", "API_KEY",
                 "GOOGLE_APPLICATION_CREDENTIALS", "NCCL_AUTH", "SSH_PRIVATE"):
        assert is_secret(name), name
    for name in ("SLURM_JOB_ID", "MASTER_ADDR", "WORLD_SIZE", "PWD"):
        assert not is_secret(name), name


def test_env_command(capsys: pytest.CaptureFixture[str],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_TOKEN", "hunter8")
    code, out, err = run(capsys, "env")
    assert code == 0 and err == "", err
    assert out.startswith("## interlock env\n") and "hunter8" not in out
    assert "SLURM_JOB_TOKEN=<elided>" in out
