"""examples/train.py under real launchers: torchrun (two simulated nodes), srun, sbatch,
mpirun, and interlock's own. Each must be detected, train with parity to one process,
and refuse a --devices that disagrees with the job before any collective."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from cluster_harness import (
    PARITY_ARGS,
    PYTHON,
    SCRIPT,
    assert_same_params,
    load_params,
    start,
)
from cluster_launchers import STYLES, Style

pytestmark = pytest.mark.cluster


def slurm_env(slurm: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **slurm}

ALL = list(STYLES)
EXTERNAL = [name for name, s in STYLES.items() if s.launcher == "external"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("style", ALL, indirect=True)
def test_detected_and_trains_with_parity(style: Style, tmp_path: Path,
                                         baseline: dict[str, torch.Tensor]) -> None:
    out, checkpoint = tmp_path / "params.pt", tmp_path / "ckpt" / "last.pt"
    job = style.start("parity", [*PARITY_ARGS, "--output", str(out), "--checkpoint",
                                 str(checkpoint), "--checkpoint-every", "6"], tmp_path)
    try:
        codes = job.wait(timeout=150)
        assert all(code == 0 for code in codes), (
            f"{style.name} exited with {codes}\n{job.output_tail()}")
        summary = job.summary()
        seen = {k: summary[k] for k in ("cluster", "launcher", "world_size")}
        expected = {"cluster": style.cluster, "launcher": style.launcher,
                    "world_size": style.world_size}
        assert seen == expected, f"{style.name}: interlock saw {seen}, expected {expected}"
        assert_same_params(load_params(out), baseline, f"{style.name} vs one process")
        files = sorted(p.name for p in checkpoint.parent.iterdir())
        assert files == ["last.pt"], f"{style.name}: the checkpoint folder holds {files}"
        assert torch.load(checkpoint, weights_only=True)["step"] == 12
        assert job.survivors() == [], f"{style.name}: processes outlived the job"
    finally:
        job.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("style", EXTERNAL, indirect=True)
def test_a_devices_flag_that_disagrees_fails_fast_on_every_rank(style: Style,
                                                                 tmp_path: Path) -> None:
    wrong = style.per_node + 1 if style.name != "torchrun" else 4
    job = style.start("mismatch", PARITY_ARGS, tmp_path, devices=wrong)
    try:
        codes = job.wait(timeout=90)
        output = job.output()
        assert all(code != 0 for code in codes), f"{style.name} exited with {codes}"
        refusals = output.count("error: [cluster-mismatch]")
        assert refusals == style.world_size, (
            f"{style.name}: {refusals} of {style.world_size} ranks refused the mismatch\n"
            + job.output_tail())
        says = f"starts {style.per_node} processes per node"
        assert says in output and f"places {wrong} per node" in output, (
            f"{style.name}: the refusal does not name both numbers ({style.per_node} "
            f"and {wrong})\n" + job.output_tail())
        assert 'train.py", line' not in output, (
            f"{style.name}: a rank printed a traceback instead of the error\n"
            + job.output_tail())
        assert job.survivors() == []
    finally:
        job.kill()


BATCH = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --output={directory}/slurm-%j.out
srun {python} {script} --devices 2 {args} --output {directory}/params.pt
"""


@pytest.mark.timeout(180)
def test_an_sbatch_job_trains_with_parity(slurm: dict[str, str], tmp_path: Path,
                                          baseline: dict[str, torch.Tensor]) -> None:
    batch = tmp_path / "job.sh"
    batch.write_text(BATCH.format(name=f"interlock-{tmp_path.name}", directory=tmp_path,
                                  python=PYTHON, script=SCRIPT, args=" ".join(PARITY_ARGS)))
    job = start("sbatch", [["sbatch", "--wait", str(batch)]], tmp_path, env=slurm)
    try:
        codes = job.wait(timeout=150)
        outputs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
        assert codes == [0], f"sbatch --wait exited {codes}\n{job.output_tail()}\n{outputs}"
        assert '"cluster": "slurm"' in outputs, f"not detected as SLURM:\n{outputs}"
        assert_same_params(load_params(tmp_path / "params.pt"), baseline, "sbatch vs one process")
        assert job.survivors() == []
    finally:
        job.kill()
        subprocess.run(["scancel", "--name", f"interlock-{tmp_path.name}"], env=slurm_env(slurm),
                       capture_output=True, timeout=30, check=False)
