"""examples/parallelism.py as a user runs it: a layout chosen by a flag trains to one
plain process's parameters (``--check``), a bad layout is refused before any process
starts, and a 3-D mesh on 8 ranks works (slow tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "parallelism.py"


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.timeout(240)
def test_a_pipeline_with_data_parallel_matches_one_process(tmp_path: Path) -> None:
    done = run("--devices", "4", "--parallelism", "pp=2,dp_shard=2", "--steps", "6",
               "--checkpoint", str(tmp_path / "ckpt"), "--check", timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "largest difference from one plain process" in done.stdout
    # the checkpoint of the pipeline resumes under another layout
    done = run("--devices", "2", "--parallelism", "tp=2,dp_shard=1", "--steps", "8",
               "--checkpoint", str(tmp_path / "ckpt"), "--resume", timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "resumed at step 6" in done.stdout


@pytest.mark.parametrize(("args", "says"), [
    (("--parallelism", "tp=3"), "Choices: tp=2, tp=4"),
    (("--parallelism", "tp=2,tp=4"), "'tp' is given twice"),
    (("--parallelism", "pp=2,dp_shard=2", "--microbatches", "0"),
     "pipeline_microbatches=0): expected an int >= 1"),
    (("--checkpoint", "/proc/no/such/dir/ckpt"), "cannot create its directory"),
])
def test_bad_input_is_refused_before_any_process(args: tuple[str, ...], says: str) -> None:
    done = run("--devices", "4", *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and done.stderr.startswith("error: ")
    assert "Traceback" not in done.stderr and "step" not in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_3d_mesh_on_8_ranks_matches_one_process() -> None:
    done = run("--devices", "8", "--parallelism", "pp=2,dp_shard=2,tp=2", "--steps", "4",
               "--check", timeout=380)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "largest difference from one plain process" in done.stdout
