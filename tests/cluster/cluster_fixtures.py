"""Fixtures of the cluster tests: the launch styles, a running single-host SLURM, the
single-process baseline. Selected with ``-m cluster`` (``nox -s cluster``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cluster_harness import PARITY_ARGS, PYTHON, SCRIPT, SERVICES, load_params, start, tool_missing
from cluster_launchers import SLURM_ENV, STYLES, Style


def _services(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SERVICES), command], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="session")
def slurm() -> Iterator[dict[str, str]]:
    """A single-host SLURM cluster (started here unless already running, and then
    stopped here); its client variables. Skips, saying why, where it cannot run."""
    missing = tool_missing("slurmctld", "slurmd", "munged", "srun", "sbatch", "sinfo")
    if missing:
        pytest.skip(missing)
    if os.geteuid() != 0:
        pytest.skip("starting munged, slurmctld and slurmd for the test cluster needs root")
    env = dict(line.split("=", 1) for line in _services("env", 30).stdout.split())
    state = Path(env["SLURM_CONF"]).parent
    already = all(_alive(state / f"{d}.pid") for d in ("slurmctld", "slurmd"))
    started = _services("start", 180)
    if started.returncode != 0:
        pytest.skip(f"the test SLURM cluster did not start here:\n{started.stderr[-2000:]}")
    SLURM_ENV.update(env)
    try:
        yield env
    finally:
        SLURM_ENV.clear()
        if not already:
            _services("stop", 90)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture
def style(request: pytest.FixtureRequest) -> Style:
    """The launch style named by the test's parameter, usable here (or a skip)."""
    chosen = STYLES[request.param]
    missing = tool_missing(*chosen.tools)
    if missing:
        pytest.skip(missing)
    if chosen.name == "srun":
        request.getfixturevalue("slurm")
    return chosen


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Rank 0's final parameters of the parity run in a single process."""
    directory = tmp_path_factory.mktemp("baseline")
    out = directory / "single.pt"
    command = [PYTHON, str(SCRIPT), "--devices", "1", "--strategy", "single_device",
               *PARITY_ARGS, "--output", str(out)]
    job = start("single", [command], directory)
    try:
        codes = job.wait(timeout=120)
        assert codes == [0], f"the single-process baseline failed\n{job.output_tail()}"
    finally:
        job.kill()
    return load_params(out)
