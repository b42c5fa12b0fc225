"""The same examples/train.py survives a fault under interlock's own launchers, torchrun
and SLURM, and ends with exactly the parameters of a run that was never interrupted.

- interlock's launchers restart every rank themselves (``--max-restarts 1``, passed to
  ``strategy.launch``);
- torchrun restarts its workers (torchrun's own ``--max-restarts 1``);
- a SLURM batch job submitted with ``--requeue`` requeues itself: ``--requeue-on USR1``
  makes the ranks stop at an agreed step and save, then rank 0 runs ``scontrol
  requeue``, and the batch script's ``srun ... --resume`` continues from the checkpoint.

In each case the restarted run resumes from the last checkpoint; the fault flags fire
in the first run only. The final parameters are compared with an uninterrupted run
under the same launcher: bit for bit (``torch.equal``) for the two-rank jobs, within
the cluster tests' usual tolerance for torchrun's four ranks (see
:func:`test_torchrun_restarts_its_workers_and_the_run_resumes`).
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from cluster_harness import (
    PARITY_ARGS,
    PYTHON,
    SCRIPT,
    Job,
    assert_same_params,
    load_params,
    start,
)
from cluster_launchers import STYLES, Style, job_name

pytestmark = pytest.mark.cluster

#: rank 1 raises before step 7; checkpoints every 2 steps, so step 6's is the last one
FAULT = ("--fail-at-step", "7", "--fail-rank", "1")
EVERY = 2
RESUME_STEP = 6
STEPS = int(PARITY_ARGS[PARITY_ARGS.index("--steps") + 1])

#: torchrun shares its rendezvous TCPStore with the workers by default, and keeps it
#: (and the keys the first workers wrote) across restarts: a restarted rank can read a
#: dead rank's address and fail to connect (pytorch/pytorch#135712). With sharing off,
#: every rendezvous round gets a fresh store.
TORCHRUN_RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def assert_identical_params(actual: dict[str, torch.Tensor],
                            expected: dict[str, torch.Tensor], what: str) -> None:
    """Bit for bit: same names, dtypes, shapes and values."""
    assert actual.keys() == expected.keys(), f"{what}: parameter names differ"
    for key in expected:
        a, e = actual[key], expected[key]
        assert a.dtype == e.dtype and a.shape == e.shape, (
            f"{what}, {key}: {a.dtype}{tuple(a.shape)} vs {e.dtype}{tuple(e.shape)}")
        assert torch.equal(a, e), (
            f"{what}, {key}: differs by up to {(a - e).abs().max().item():.3g}")


def resumed_steps(output: str) -> list[int]:
    """The steps rank 0 resumed from, in order (train.py says so on every resume)."""
    return [int(step) for step in re.findall(r"resumed from \S+ at step (\d+)", output)]


def finished(job: Job, timeout: float, what: str) -> str:
    """Wait for ``job``; it must exit 0 and leave no process behind. Its output."""
    codes = job.wait(timeout=timeout)
    assert all(code == 0 for code in codes), (
        f"{what} exited with {codes}\n{job.output_tail()}")
    assert job.survivors() == [], f"{what}: processes outlived the job"
    return job.output()


def straight_run(name: str, commands: list[list[str]], directory: Path,
                 env: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The parameters of an uninterrupted run (``commands`` write them to
    ``directory/params.pt``)."""
    job = start(name, commands, directory, env)
    try:
        finished(job, 150, f"the uninterrupted {name} run")
    finally:
        job.kill()
    return load_params(directory / "params.pt")


def elastic_args(directory: Path, *extra: str) -> list[str]:
    return [*PARITY_ARGS, *FAULT, "--resume", "--checkpoint", str(directory / "ckpt" / "last.pt"),
            "--checkpoint-every", str(EVERY), "--output", str(directory / "params.pt"), *extra]


def assert_failed_once_and_resumed(output: str, what: str) -> None:
    # one failure, however often the launcher repeats its message: one time stamp
    failures = len(set(re.findall(r"deliberate failure at step 7 on rank 1 \(time ([\d.]+)\)",
                                  output)))
    assert failures == 1, (
        f"{what}: the fault fired {failures} times; it must fire in the first run only\n"
        + output[-4000:])
    resumed = resumed_steps(output)
    assert resumed == [RESUME_STEP], (
        f"{what}: rank 0 resumed from steps {resumed}, expected [{RESUME_STEP}] "
        f"(the last checkpoint before the fault)\n" + output[-4000:])


# ----------------------------------------------------------------- interlock's launchers


@pytest.mark.timeout(300)
@pytest.mark.parametrize("style", ["interlock-ddp", "interlock-spawn"], indirect=True)
def test_interlock_restarts_every_rank_and_the_run_resumes(
    style: Style, tmp_path: Path, baseline: dict[str, torch.Tensor]
) -> None:
    straight_dir = tmp_path / "straight"
    straight = straight_run(f"{style.name}-straight", style.commands(
        [*PARITY_ARGS, "--output", str(straight_dir / "params.pt")]), straight_dir)

    directory = tmp_path / "restarted"
    job = style.start("restart", elastic_args(directory, "--max-restarts", "1"), directory)
    try:
        output = finished(job, 150, f"{style.name} with --max-restarts 1")
    finally:
        job.kill()
    assert re.search(r"interlock: attempt 0 failed \(rank 1: RuntimeError: deliberate failure "
                     r"at step 7 .*\); restarting every rank", output), (
        f"{style.name}: no restart was announced\n" + job.output_tail())
    assert_failed_once_and_resumed(output, style.name)
    assert job.summary()["steps"] == STEPS
    params = load_params(directory / "params.pt")
    assert_identical_params(params, straight, f"{style.name} restarted vs uninterrupted")
    assert_same_params(params, baseline, f"{style.name} restarted vs one process")
    assert torch.load(directory / "ckpt" / "last.pt", weights_only=True)["step"] == STEPS


# ----------------------------------------------------------------- torchrun


@pytest.mark.timeout(360)
@pytest.mark.parametrize("style", ["torchrun"], indirect=True)
def test_torchrun_restarts_its_workers_and_the_run_resumes(
    style: Style, tmp_path: Path, baseline: dict[str, torch.Tensor]
) -> None:
    straight_dir = tmp_path / "straight"
    straight = straight_run("torchrun-straight", style.commands(
        [*PARITY_ARGS, "--output", str(straight_dir / "params.pt")]), straight_dir,
        TORCHRUN_RESTART_ENV)

    directory = tmp_path / "restarted"
    commands = style.commands(elastic_args(directory))
    for command in commands:  # the style runs torchrun without restarts
        command[command.index("--max-restarts") + 1] = "1"
    job = start("torchrun-restart", commands, directory, TORCHRUN_RESTART_ENV)
    try:
        output = finished(job, 240, "torchrun --max-restarts 1")
    finally:
        job.kill()
    assert_failed_once_and_resumed(output, "torchrun")
    summary = job.summary()
    assert (summary["steps"], summary["world_size"]) == (STEPS, style.world_size)
    params = load_params(directory / "params.pt")
    # Not bit for bit: with four ranks any resume from step 6 (a restart, or a run
    # stopped there and started again by hand, which ends bit for bit where the restart
    # does) differs from the uninterrupted run in the last float32 bit (about 6e-8),
    # under interlock's launcher too. The likely cause: DDP reduces the first step after
    # a start with its initial gradient buckets and later steps with buckets rebuilt in
    # gradient-ready order, so step 7 sums four ranks' gradients in another order. Two
    # ranks' sums do not depend on the order, so the two-rank jobs match exactly.
    assert_same_params(params, straight, "torchrun restarted vs uninterrupted")
    assert_same_params(params, baseline, "torchrun restarted vs one process")


# ----------------------------------------------------------------- SLURM requeue

#: long enough that the job still runs when the signal comes: the first run sleeps
#: --step-sleep seconds per step (a hidden test flag, first run only)
REQUEUE_STEPS = 200
REQUEUE_BATCH = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={directory}/slurm-%j.out
echo "batch script: run ${{SLURM_RESTART_COUNT:-0}} of job $SLURM_JOB_ID starts" \
    "(time $(date +%s.%N))"
srun --kill-on-bad-exit=1 {python} {script} --devices 2 {args}
"""


def _slurm(*command: str, env: dict[str, str]) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=30,
                          check=False, env={**os.environ, **env})
    return done.stdout + done.stderr


def _job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job``'s fields (empty once SLURM forgot the job)."""
    text = _slurm("scontrol", "show", "job", "--oneliner", job_id, env=env)
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


#: SLURM job states after which a job does not run again
_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"})


def _final_state(job_id: str, env: dict[str, str], timeout: float) -> dict[str, str]:
    """``scontrol show job``'s fields once the job has ended after its requeue."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = _job_fields(job_id, env)
        if fields.get("JobState") in _ENDED and fields.get("Restarts") == "1":
            return fields
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not end within {timeout:.0f}s after its "
                         f"requeue: {fields.get('JobState')}, restarts "
                         f"{fields.get('Restarts')}")


def _wait_for(what: str, job: Job, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        job.sample()
        if time.monotonic() > deadline or not job.running():
            raise AssertionError(f"{job.name}: {what} did not happen within {timeout:.0f}s\n"
                                 + job.output_tail())
        time.sleep(0.1)


@pytest.mark.timeout(600)
def test_a_slurm_batch_job_requeues_itself_on_usr1_and_resumes(
    slurm: dict[str, str], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    # one intra-op thread per rank, as torchrun sets: srun leaves it to torch, which
    # oversubscribes the cores (about 10x slower steps on 2 cores)
    env = {**slurm, "OMP_NUM_THREADS": "1"}
    common = ["--steps", str(REQUEUE_STEPS), "--batch-size", "16"]

    straight_dir = tmp_path / "straight"
    straight = straight_run("srun-straight", STYLES["srun"].commands(
        [*common, "--output", str(straight_dir / "params.pt")], name=job_name(straight_dir)),
        straight_dir, env)

    directory = tmp_path / "requeued"
    directory.mkdir()
    checkpoint, ready = directory / "ckpt" / "last.pt", directory / "ready"
    args = [*common, "--checkpoint", str(checkpoint), "--checkpoint-every", str(EVERY),
            "--resume", "--requeue-on", "USR1", "--preemption-grace", "20",
            "--ready-file", str(ready), "--step-sleep", "0.05",
            "--output", str(directory / "params.pt")]
    batch = directory / "job.sh"
    batch.write_text(REQUEUE_BATCH.format(name=job_name(directory), directory=directory,
                                          python=PYTHON, script=SCRIPT, args=" ".join(args)))
    # --wait keeps sbatch waiting through the requeue, until the job's final end
    job = start("sbatch-requeue", [["sbatch", "--parsable", "--wait", str(batch)]],
                directory, env)
    job_id = ""
    try:
        job_id = job.wait_for_text(r"^(\d+)", timeout=60).group(1)
        _wait_for("both ranks entering the loop", job,
                  lambda: all(Path(f"{ready}.rank{r}").exists() for r in (0, 1)), 120)
        # every task of the job's steps gets the signal (the batch shell does not, which
        # would end the script); #SBATCH --signal=USR1@SECONDS does the same before the
        # time limit
        _slurm("scancel", "--signal=USR1", job_id, env=env)

        fields: dict[str, str] = {}

        def requeued() -> bool:
            fields.update(_job_fields(job_id, env))
            return fields.get("JobState") == "PENDING" and fields.get("Restarts") == "1"

        _wait_for("the requeue", job, requeued, 90)
        log = next(directory.glob("slurm-*.out"))
        said = re.search(r"requeued \(time (\d+\.\d+)\)", log.read_text())
        assert said, f"rank 0 did not report the requeue\n{log.read_text()[-4000:]}"
        requeued_at = float(said.group(1))
        # the requeued job may not start before its EligibleTime (squeue: BeginTime)
        eligible = datetime.datetime.strptime(fields["EligibleTime"], "%Y-%m-%dT%H:%M:%S")
        delay = eligible.timestamp() - requeued_at
        record_property("requeue_begin_delay_s", round(delay, 1))
        print(f"SLURM holds the requeued job for {delay:.0f}s (its credential lifetime: "
              "AuthInfo=cred_expire, 120 s by default, 20 s in services.sh)")
        # The hold is waited out: moving the job's StartTime to now made SLURM start
        # the requeued run before the first one was cleaned up, and the job then ended
        # FAILED without running the batch script again (1 time in 7 here). SLURM's own
        # record of the job decides, not sbatch --wait's exit code, which around a
        # requeue can be the first run's.
        final = _final_state(job_id, env, timeout=max(60.0, delay) + 180)
        job.wait(timeout=60)
        text = log.read_text()
        assert (final.get("JobState"), final.get("ExitCode")) == ("COMPLETED", "0:0"), (
            f"the job ended {final.get('JobState')} (exit {final.get('ExitCode')})\n"
            f"{job.output_tail()}\n{text[-4000:]}")
        assert job.survivors() == [], "processes outlived the SLURM job"
    finally:
        job.kill()
        if job_id:
            _slurm("scancel", job_id, env=env)
        _slurm("scancel", "--name", job_name(straight_dir), env=env)

    runs = re.findall(r"batch script: run (\d+) of job \d+ starts \(time (\d+\.\d+)\)", text)
    assert [run for run, _ in runs] == ["0", "1"], f"the job ran {runs}, not twice\n{text[-4000:]}"
    record_property("requeue_to_second_run_s", round(float(runs[1][1]) - requeued_at, 1))
    stopped = re.search(r"preempted after step (\d+): checkpoint saved", text)
    assert stopped, f"the ranks did not stop and save on USR1\n{text[-4000:]}"
    step = int(stopped.group(1))
    assert 0 < step < REQUEUE_STEPS, f"stopped after step {step}\n{text[-4000:]}"
    assert resumed_steps(text) == [step], (
        f"the requeued run resumed from {resumed_steps(text)}, expected [{step}]\n{text[-4000:]}")
    assert f'"steps": {REQUEUE_STEPS}' in text and '"cluster": "slurm"' in text, text[-4000:]
    assert_identical_params(load_params(directory / "params.pt"), straight,
                            "requeued SLURM job vs uninterrupted srun")
