"""Machine snapshots, probing, and plan()'s promise to touch nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from interlock import Machine, plan


def test_import_and_plan_do_not_import_torch() -> None:
    code = (
        "import sys, interlock\n"
        "p = interlock.plan(devices=2, strategy='ddp', machine=interlock.Machine())\n"
        "assert p.world_size == 2\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'tabulate') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"plan() imported {proc.stdout.strip()}"


def test_plan_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "1")
    before = dict(os.environ)
    plan(machine=Machine.probe())
    plan(devices=2, machine=Machine(environ={"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2",
                                             "SLURM_NNODES": "1"}))
    assert dict(os.environ) == before


def test_probe_reads_this_machine_without_initialising_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("INTERLOCK_UNRELATED", "x")
    machine = Machine.probe()
    assert machine.environ.get("WORLD_SIZE") == "3"
    assert "INTERLOCK_UNRELATED" not in machine.environ
    assert machine.cuda_devices == torch.cuda.device_count()
    assert not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    assert set(machine.start_methods) <= {"fork", "spawn", "forkserver"}


def test_probe_sees_an_interactive_session() -> None:
    code = "import interlock; print(interlock.Machine.probe().interactive)"
    proc = subprocess.run([sys.executable, "-i", "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, input="")
    assert proc.stdout.strip().startswith("True"), proc.stderr


def test_plan_without_a_machine_probes() -> None:
    result = plan(accelerator="cpu", devices=2)
    assert result.machine == Machine.probe()
    assert result.world_size == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("cuda_devices", -1), ("cuda_devices", True), ("xla_devices", 1.5),
     ("mps_available", 1), ("start_methods", ("fork", "thread")),
     ("packages", frozenset({"apex"}))],
)
def test_machine_validates_its_fields(field: str, value: Any) -> None:
    from typeguard import suppress_type_checks

    with suppress_type_checks(), pytest.raises(ValueError, match=f"Machine.{field}"):
        Machine(**{field: value})


def test_machine_is_frozen_hashable_and_copies_environ() -> None:
    env = {"WORLD_SIZE": "2"}
    machine = Machine(environ=env)
    env["WORLD_SIZE"] = "3"
    assert machine.environ["WORLD_SIZE"] == "2"
    assert hash(machine) == hash(Machine(environ={"WORLD_SIZE": "2"}))
    with pytest.raises(AttributeError):
        machine.cuda_devices = 2  # type: ignore[misc]
