"""The fault scenarios, run under any launch style: a crash, a hang, a preemption.

Each returns an :class:`Outcome` with the measured time from the fault to the end of
the whole job, after checking everything the scenario promises (all ranks ended and no
process survived, the rank is named, the last checkpoint is intact). The tests call
them once; ``repeat_faults.py`` calls them many times and prints the times.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cluster_harness import Job, assert_checkpoint_intact, fault_time
from cluster_launchers import SLURM_ENV, Style, job_name

#: The process-group timeout of the hang scenario, in seconds.
PG_TIMEOUT = 5.0
#: How long a guarded rank may linger after SIGTERM in the scenarios, in seconds.
GRACE = 3.0
#: The failing (or hanging) rank and the step at which it fails.
RANK = 1
STEP = 7
#: Periodic checkpoints every this many steps: the last complete one is step 6.
EVERY = 2
#: Upper bounds on fault-to-end times, generous for a loaded 2-core machine.
CRASH_BOUND = 30.0
HANG_BOUND = PG_TIMEOUT + 30.0
PREEMPT_BOUND = 30.0


@dataclass(frozen=True)
class Outcome:
    style: str
    scenario: str
    seconds: float  # from the fault to the end of the last launcher process
    codes: tuple[int, ...]


def _common(directory: Path, steps: int = 100_000) -> tuple[Path, list[str]]:
    checkpoint = directory / "ckpt" / "last.pt"
    return checkpoint, ["--steps", str(steps), "--batch-size", "16",
                        "--checkpoint", str(checkpoint), "--checkpoint-every", str(EVERY)]


def _finish(job: Job, style: Style, scenario: str, codes: list[int], fault: float,
            bound: float) -> Outcome:
    survivors = job.survivors()
    assert not survivors, (
        f"{style.name} {scenario}: processes {survivors} of the job survived it\n"
        + job.output_tail())
    assert all(code != 0 for code in codes), (
        f"{style.name} {scenario}: a launcher exited 0 (exit codes {codes})\n"
        + job.output_tail())
    assert job.ended is not None
    seconds = job.ended - fault
    assert seconds < bound, (
        f"{style.name} {scenario}: the job took {seconds:.1f}s after the fault to end "
        f"(bound {bound:.0f}s)\n" + job.output_tail())
    return Outcome(style.name, scenario, round(seconds, 2), tuple(codes))


def crash(style: Style, directory: Path) -> Outcome:
    """Rank 1 raises at step 7: every rank ends, rank 1 is named, step 6's checkpoint
    is intact and loads."""
    checkpoint, args = _common(directory)
    job = style.start("crash", [*args, "--fail-at-step", str(STEP), "--fail-rank",
                                str(RANK)], directory)
    try:
        codes = job.wait(timeout=120)
        output = job.output()
        assert style.names_rank(output, RANK), (
            f"{style.name} crash: the output does not name rank {RANK} as the failed one\n"
            + job.output_tail())
        fault = fault_time(output, f"deliberate failure at step {STEP} on rank {RANK}")
        outcome = _finish(job, style, "crash", codes, fault, CRASH_BOUND)
        step = assert_checkpoint_intact(checkpoint, EVERY, STEP)
        assert step == STEP - 1, f"the last complete checkpoint is step {step}, not {STEP - 1}"
        return outcome
    finally:
        job.kill()


def hang(style: Style, directory: Path) -> Outcome:
    """Rank 1 stops before step 7's collectives: its peers fail after the process-group
    timeout instead of waiting for ever, and the job ends."""
    checkpoint, args = _common(directory)
    job = style.start("hang", [*args, "--hang-at-step", str(STEP), "--hang-rank", str(RANK),
                               "--pg-timeout", str(PG_TIMEOUT),
                               "--preemption-grace", str(GRACE)], directory)
    try:
        codes = job.wait(timeout=120)
        output = job.output()
        assert re.search(r"[Tt]imed? ?out", output), (
            f"{style.name} hang: no rank reported a timeout\n" + job.output_tail())
        fault = fault_time(output, f"rank {RANK} hangs at step {STEP}")
        outcome = _finish(job, style, "hang", codes, fault, HANG_BOUND)
        assert outcome.seconds >= PG_TIMEOUT - 0.5, (
            f"{style.name} hang: the job ended {outcome.seconds:.1f}s after the hang, "
            f"before the {PG_TIMEOUT:.0f}s timeout could have fired\n" + job.output_tail())
        assert_checkpoint_intact(checkpoint, EVERY, STEP)
        return outcome
    finally:
        job.kill()


def preempt(style: Style, directory: Path) -> Outcome:
    """SIGTERM to the whole job once it trains: every rank stops at the same step, the
    checkpoint of that step is saved whole, and the job exits non-zero."""
    checkpoint, args = _common(directory, steps=100_000_000)
    args[args.index("--checkpoint-every") + 1] = "50"
    job = style.start("preempt", [*args, "--preemption-grace", "20"], directory)
    try:
        _wait_for_file(job, checkpoint)
        sent = _send_sigterm(style, job, directory)
        codes = job.wait(timeout=90)
        output = job.output()
        said = re.search(r"preempted after step (\d+): checkpoint saved", output)
        assert said, f"{style.name} preempt: rank 0 did not save on SIGTERM\n" + job.output_tail()
        outcome = _finish(job, style, "preempt", codes, sent, PREEMPT_BOUND)
        step = assert_checkpoint_intact(checkpoint, 1, 10**9)
        assert step == int(said.group(1)), (
            f"the checkpoint holds step {step}, but the job said it saved step {said.group(1)}")
        return outcome
    finally:
        job.kill()


def _wait_for_file(job: Job, path: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        job.sample()
        if time.monotonic() > deadline or not job.running():
            raise AssertionError(f"{job.name}: no checkpoint appeared at {path}\n"
                                 + job.output_tail())
        time.sleep(0.1)


def _send_sigterm(style: Style, job: Job, directory: Path) -> float:
    """What the scheduler does on preemption: SIGTERM to every process of the job."""
    if style.name != "srun":
        return job.signal(signal.SIGTERM)
    # SLURM: cancelling the job sends SIGTERM to every task, SIGKILL after KillWait
    env = {**os.environ, **SLURM_ENV}
    name = job_name(directory)
    ids = subprocess.run(["squeue", "--noheader", "--name", name, "--format", "%i"],
                         capture_output=True, text=True, timeout=30, check=True,
                         env=env).stdout.split()
    assert ids, f"squeue does not list the job {name}"
    sent = time.time()
    with contextlib.suppress(subprocess.CalledProcessError):
        subprocess.run(["scancel", *ids], timeout=30, check=True, env=env)
    return sent
