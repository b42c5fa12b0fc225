"""launch(max_restarts=N): a failed rank makes every rank start again.

Real launches (fork, spawn, forkserver, the script launcher) with a rank killed by
SIGKILL or raising in the first attempt; the policy's arithmetic and refusals; what is
not restarted; and the plan's explanation of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import interlock
from interlock.strategies.launchers.base import RankFailedError
from interlock.strategies.preemption import Preempted
from interlock.strategies.restarts import (
    ATTEMPT_ENV,
    RestartPolicy,
    RestartsExhaustedError,
    restart_attempt,
    run_with_restarts,
)

NO_WAIT = RestartPolicy(max_restarts=1, backoff_s=0)


def _kill_rank_one_first(strategy: Any, tag: str) -> tuple[int, float, int, str]:
    """Rank 1 dies by SIGKILL in attempt 0; the attempt after it sums the ranks."""
    attempt = restart_attempt()
    if attempt == 0 and strategy.global_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    total = strategy.all_reduce(torch.tensor(float(strategy.global_rank + 1)), "sum")
    return attempt, float(total.item()), strategy.global_rank, tag


def _always_raise(strategy: Any) -> None:
    raise ValueError(f"bad batch in attempt {restart_attempt()} on rank {strategy.global_rank}")


def _preempted(strategy: Any) -> None:
    raise Preempted()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_spawn", "ddp_forkserver"])
def test_a_killed_rank_is_restarted_and_launch_returns_the_finished_attempt(
        strategy: str, capfd: pytest.CaptureFixture[str]) -> None:
    built = interlock.resolve(accelerator="cpu", devices=2, strategy=strategy)
    result = built.launch(_kill_rank_one_first, "x", restart_policy=NO_WAIT)
    assert result == (1, 3.0, 0, "x")  # rank 0's result of attempt 1, both ranks took part
    err = capfd.readouterr().err
    assert "attempt 0 failed (rank 1:" in err and "SIGKILL" in err
    assert ATTEMPT_ENV not in os.environ  # the launching process is left as it was


class _Exited:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None


class _Context:
    """What the launcher's join sees: rank 0 recorded the peer's lost connection, rank 1
    died by SIGKILL, and torch has not noticed the exit yet."""

    def __init__(self) -> None:
        self.processes = [_Exited(None), _Exited(-signal.SIGKILL)]

    def join(self, timeout: float) -> bool:
        return False


def test_a_rank_killed_by_a_signal_is_the_cause_even_when_a_peer_recorded_first(
        tmp_path: Path) -> None:
    """The order the launcher learns of them in is a race (under load the peer's
    "connection closed" is often recorded before torch notices the killed process)."""
    from interlock.strategies.launchers.base import record_failure
    from interlock.strategies.launchers.multiprocessing import _join

    try:
        raise RuntimeError("gloo: Connection closed by peer")
    except RuntimeError as error:
        record_failure(tmp_path / "rank0.json", error)
    with pytest.raises(RankFailedError) as info:
        _join(_Context(), 0, str(tmp_path), grace=0.1)
    assert info.value.rank == 1
    assert "process 1 terminated with signal SIGKILL" in str(info.value)
    assert "(rank 0 failed after it)" in str(info.value)


@pytest.mark.timeout(180)
def test_without_restarts_the_first_failure_is_raised_as_before() -> None:
    built = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_fork")
    with pytest.raises(RankFailedError) as info:
        built.launch(_kill_rank_one_first, "x")
    assert not isinstance(info.value, RestartsExhaustedError)
    assert info.value.rank == 1


@pytest.mark.timeout(180)
def test_exhausted_restarts_list_each_attempts_cause() -> None:
    built = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_fork")
    with pytest.raises(RestartsExhaustedError) as info:
        built.launch(_always_raise, restart_policy=RestartPolicy(max_restarts=2, backoff_s=0))
    error = info.value
    assert len(error.attempts) == 3 and isinstance(error, RankFailedError)
    text = str(error)
    for attempt in range(3):
        assert f"attempt {attempt}: rank " in text
        assert f"bad batch in attempt {attempt}" in text


@pytest.mark.timeout(120)
def test_a_preempted_job_is_not_restarted() -> None:
    built = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_fork")
    calls: list[float] = []
    with pytest.raises(Preempted):
        run_with_restarts(lambda attempt: built.launch(_preempted),
                          RestartPolicy(max_restarts=3, backoff_s=0), in_process=False,
                          sleep=calls.append)
    assert calls == []


def test_a_single_process_strategy_runs_the_function_again_in_this_process() -> None:
    built = interlock.resolve(accelerator="cpu", devices=1)
    seen: list[int] = []

    def flaky(strategy: Any) -> str:
        seen.append(restart_attempt())
        if len(seen) < 3:
            raise OSError("the data server hiccupped")
        return "done"

    assert built.launch(flaky, restart_policy=RestartPolicy(max_restarts=2, backoff_s=0)) == "done"
    assert seen == [0, 1, 2]
    assert ATTEMPT_ENV not in os.environ


def test_keyboard_interrupt_is_never_retried() -> None:
    built = interlock.resolve(accelerator="cpu", devices=1)
    seen: list[int] = []

    def interrupted(strategy: Any) -> None:
        seen.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        built.launch(interrupted, max_restarts=5)
    assert seen == [1]


def test_back_off_doubles_up_to_its_cap_and_the_waits_happen() -> None:
    policy = RestartPolicy(max_restarts=5, backoff_s=0.5, backoff_factor=2, max_backoff_s=3)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    waits: list[float] = []
    attempts: list[int] = []

    def fails_four_times(attempt: int) -> int:
        attempts.append(attempt)
        if attempt < 4:
            raise RankFailedError(1, "boom")
        return attempt

    assert run_with_restarts(fails_four_times, policy, in_process=False,
                             sleep=waits.append) == 4
    assert waits == [0.5, 1.0, 2.0, 3.0] and attempts == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("bad", [
    {"max_restarts": -1}, {"max_restarts": 10**9}, {"max_restarts": 1.5},
    {"max_restarts": True}, {"backoff_s": float("nan")}, {"backoff_s": -1},
    {"backoff_factor": 0.5}, {"max_backoff_s": float("inf")},
])
def test_absurd_policies_are_refused_with_the_field_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        RestartPolicy(**bad)


def test_launch_refuses_both_forms_and_a_policy_of_the_wrong_type() -> None:
    built = interlock.resolve(accelerator="cpu", devices=1)
    with pytest.raises(ValueError, match="not both"):
        built.launch(lambda s: None, max_restarts=1, restart_policy=NO_WAIT)
    # TypeError, or typeguard's error first when the tests run under it
    with pytest.raises(Exception, match="RestartPolicy"):
        built.launch(lambda s: None, restart_policy=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_restarts"):
        built.launch(lambda s: None, max_restarts=-2)


def test_an_external_launcher_warns_that_it_cannot_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29555", "LOCAL_WORLD_SIZE": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plan = interlock.plan(accelerator="cpu", devices=1, strategy="ddp")
    assert plan.launcher == "external"
    assert "torchrun --max-restarts" in plan.on_failure()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    built = interlock.resolve(accelerator="cpu", devices=1, strategy="ddp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # one run, which reads torchrun's count of its restarts, not an attempt of ours
        assert built.launch(lambda s: (s.world_size, restart_attempt()),
                            max_restarts=2) == (1, 3)
    assert any("cannot restart ranks through the 'external' launcher" in str(w.message)
               for w in caught)


def test_the_plan_says_what_happens_on_failure() -> None:
    spawn_plan = interlock.plan(accelerator="cpu", devices=2, strategy="ddp_spawn")
    assert "on failure:" in spawn_plan.explain()
    spawned = spawn_plan.on_failure()
    assert "max_restarts=N" in spawned and "any rank may die" in spawned
    assert "back-off of 1 s, x2 each time, at most 60 s" in spawned
    single = interlock.plan(accelerator="cpu", devices=1).on_failure()
    assert "runs the function again in this process" in single
    script = interlock.plan(accelerator="cpu", devices=2, strategy="ddp").on_failure()
    assert "its own death ends the job" in script


def test_restart_attempt_reads_interlock_then_torchrun_then_slurm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ATTEMPT_ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert restart_attempt() == 0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert restart_attempt() == 1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert restart_attempt() == 2
    monkeypatch.setenv(ATTEMPT_ENV, "1")
    assert restart_attempt() == 1
    monkeypatch.setenv(ATTEMPT_ENV, "junk")
    assert restart_attempt() == 2


SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import torch, interlock
    from interlock.strategies.restarts import RestartPolicy, restart_attempt

    def work(strategy):
        attempt = restart_attempt()
        if attempt == 0 and strategy.global_rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        total = strategy.all_reduce(torch.tensor(float(strategy.global_rank + 1)), "sum")
        return [attempt, total.item(), strategy.global_rank]

    if __name__ == "__main__":
        before = interlock.resolve(accelerator="cpu", devices=1).launch(lambda s: "earlier")
        strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp")
        result = strategy.launch(work, restart_policy=RestartPolicy(max_restarts=1,
                                                                    backoff_s=0))
        if strategy.global_rank == 0:
            print("RESULT " + json.dumps([before, result]))
""")


@pytest.mark.timeout(180)
def test_the_script_launcher_restarts_a_killed_child(tmp_path: Path) -> None:
    lines, stderr = _run_script(tmp_path / "train.py", SCRIPT)
    assert lines == ['RESULT ["earlier", [1, 3.0, 0]]'], lines
    assert "attempt 0 failed (rank 1:" in stderr


def _run_script(script: Path, text: str) -> tuple[list[str], str]:
    """Run ``text`` as a script in its own directory; its RESULT lines and stderr."""
    script.write_text(text)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=150, check=False, cwd=script.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return ([line for line in done.stdout.splitlines() if line.startswith("RESULT ")],
            done.stderr)


def test_an_interrupt_during_teardown_still_destroys_the_process_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The script launcher interrupts rank 0 from a thread when a child dies; landing
    in rank 0's teardown, the interrupt must not leave the process group for the
    restarted attempt to reuse (it would talk to the dead rank)."""
    import torch.distributed as dist

    from interlock.strategies.base import _run_worker

    strategy = interlock.resolve(accelerator="cpu", devices=1, strategy="ddp")
    cls = type(strategy)
    real = cls.teardown
    seen: list[bool] = []

    def interrupted(self: Any) -> None:
        seen.append(dist.is_initialized())
        if len(seen) == 1:
            raise KeyboardInterrupt  # the launcher's interrupt, at the teardown's start
        real(self)

    monkeypatch.setattr(cls, "teardown", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            _run_worker(strategy, lambda s: s.all_reduce(torch.ones(1)).item(), (), {})
        assert seen == [True, True]
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


DATA_ORDER_SCRIPT = textwrap.dedent("""
    import json
    import torch, interlock
    from torch.utils.data import DataLoader
    from interlock.strategies.restarts import RestartPolicy, restart_attempt

    def epoch_order(strategy, fail):
        interlock.seed_everything(7)
        loader = strategy.setup_dataloader(DataLoader(list(range(22)), batch_size=2,
                                                      shuffle=True))
        order = [batch.tolist() for batch in loader]
        if fail and restart_attempt() == 0 and strategy.global_rank == 1:
            raise ValueError("deliberate failure in attempt 0")
        return strategy.collective.all_gather_object(order)

    if __name__ == "__main__":
        strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp")
        policy = RestartPolicy(max_restarts=1, backoff_s=0)
        clean = strategy.launch(epoch_order, False, restart_policy=policy)
        restarted = strategy.launch(epoch_order, True, restart_policy=policy)
        if strategy.global_rank == 0:
            print("RESULT " + json.dumps([clean, restarted]))
""")


@pytest.mark.timeout(180)
def test_a_restart_under_the_script_launcher_keeps_the_data_order(tmp_path: Path) -> None:
    """Rank 0 is the launching process and lives through every attempt and launch:
    nothing it keeps between them (a count of loaders set up) may change what an
    attempt computes. The restarted attempt, and a second launch, shuffle exactly
    as the first clean one."""
    lines, stderr = _run_script(tmp_path / "order.py", DATA_ORDER_SCRIPT)
    assert len(lines) == 1, lines
    clean, restarted = json.loads(lines[0][len("RESULT "):])
    assert "attempt 0 failed (rank 1:" in stderr
    assert restarted == clean
    assert clean[0] != clean[1], "each rank reads its own share"
