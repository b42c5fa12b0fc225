"""Restarts: a failed rank makes every rank start again, up to a budget.

``Strategy.launch(fn, *args, max_restarts=N)`` runs the job as usual. When a rank
fails (raises, or dies, SIGKILL included) and restarts remain, the launcher has
already stopped every other rank and released the rendezvous; after a back-off the
processes are started again, the process group is rebuilt, and ``fn`` runs again in
every rank. A training function that resumes from its last checkpoint (a
:class:`~interlock.checkpoints.CheckpointManager`'s ``load_latest``) therefore
continues where it stopped. ``launch`` returns rank 0's result of the attempt that
finished; when the budget runs out, :class:`RestartsExhaustedError` lists each
attempt's root cause.

What is restarted:

- a rank that failed under a launcher that starts the processes itself
  (``LauncherRow.restarts``: the script, spawn, fork and forkserver launchers). Under
  the script launcher rank 0 is the calling process, so only its own death cannot be
  survived;
- with no launcher (single-process strategies), an ``Exception`` raised by ``fn``:
  it runs again in this process.

What is not: a preempted job (:class:`~interlock.strategies.preemption.Preempted`,
every rank agreed to stop), Ctrl-C and SIGTERM to the launching process, a launcher
that cannot start processes at all (:class:`LaunchError`), and processes started by
someone else (torchrun, srun, mpirun: their launcher restarts them, e.g. ``torchrun
--max-restarts``).

Each worker can ask :func:`restart_attempt` which attempt it runs in (0 for the
first); it reads torchrun's ``TORCHELASTIC_RESTART_COUNT`` and SLURM's
``SLURM_RESTART_COUNT`` too (under an external launcher ``launch`` sets no count of
its own).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from interlock.engine.tables import (
    RESTART_BACKOFF_FACTOR,
    RESTART_BACKOFF_S,
    RESTART_MAX_BACKOFF_S,
)
from interlock.strategies.launchers.base import (
    LaunchError,
    RankFailedError,
    environment_variables,
)

T = TypeVar("T")

#: the attempt a worker runs in (0, 1, ...), set by ``Strategy.launch`` in every rank
ATTEMPT_ENV = "INTERLOCK_RESTART_ATTEMPT"
#: torchrun's count of the restarts it made
TORCHRUN_ATTEMPT_ENV = "TORCHELASTIC_RESTART_COUNT"
#: SLURM's count of the times a batch job was requeued
SLURM_ATTEMPT_ENV = "SLURM_RESTART_COUNT"

#: the most restarts one launch may be given: a job that fails this often will not
#: succeed by retrying (and a typo such as 10**9 would retry for ever)
MAX_RESTARTS_LIMIT = 1_000


def restart_attempt() -> int:
    """Which attempt this process runs in: 0 for the first, 1 after one restart, ...
    (interlock's launchers, torchrun and a requeued SLURM batch job say, in that
    order; 0 outside all three)."""
    for name in (ATTEMPT_ENV, TORCHRUN_ATTEMPT_ENV, SLURM_ATTEMPT_ENV):
        text = os.environ.get(name, "")
        if text.isdigit():
            return int(text)
    return 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartPolicy:
    """How often, and after how long a wait, a failed job is started again.

    Attributes:
        max_restarts: restarts after the first attempt (0: none; the job runs at most
            ``max_restarts + 1`` times).
        backoff_s: the wait before the first restart, in seconds.
        backoff_factor: each later wait is this many times the one before.
        max_backoff_s: no wait is longer than this.
    """

    max_restarts: int = 0
    backoff_s: float = RESTART_BACKOFF_S
    backoff_factor: float = RESTART_BACKOFF_FACTOR
    max_backoff_s: float = RESTART_MAX_BACKOFF_S

    def __post_init__(self) -> None:
        if (not isinstance(self.max_restarts, int) or isinstance(self.max_restarts, bool)
                or not 0 <= self.max_restarts <= MAX_RESTARTS_LIMIT):
            raise ValueError(f"max_restarts={self.max_restarts!r}: expected a whole number "
                             f"from 0 to {MAX_RESTARTS_LIMIT}")
        for name in ("backoff_s", "backoff_factor", "max_backoff_s"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"{name}={value!r}: expected a finite number of at least 0")
        if self.backoff_factor < 1:
            raise ValueError(f"backoff_factor={self.backoff_factor!r}: expected at least 1 "
                             "(waits that shrink would retry a failing job ever faster)")

    def delay(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 for the first)."""
        wait = self.backoff_s * self.backoff_factor ** min(restart - 1, 64)
        return float(min(wait, self.max_backoff_s))

    def describe(self) -> str:
        """One line for logs and the plan's explanation."""
        if self.max_restarts == 0:
            return "no restarts"
        return (f"up to {self.max_restarts} restart{'s' if self.max_restarts != 1 else ''}, "
                f"waiting {self.backoff_s:g} s first, x{self.backoff_factor:g} each time, "
                f"at most {self.max_backoff_s:g} s")


class RestartsExhaustedError(RankFailedError):
    """Every attempt failed; ``attempts`` holds each attempt's root cause in order.

    A :class:`RankFailedError` (the last attempt's rank), so code that handles a failed
    launch handles this one too.
    """

    def __init__(self, attempts: tuple[BaseException, ...]) -> None:
        self.attempts = attempts
        last = attempts[-1]
        rank = last.rank if isinstance(last, RankFailedError) else 0
        lines = [f"the job failed {len(attempts)} time{'s' if len(attempts) != 1 else ''}, "
                 f"and no restart is left; each attempt's root cause:"]
        for number, cause in enumerate(attempts):
            lines.append(f"  attempt {number}: {_headline(cause)}")
        lines.append(f"the last attempt's failure in full:\n{_detail(last)}")
        RuntimeError.__init__(self, "\n".join(lines))
        self.rank = rank
        self.detail = "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RestartsExhaustedError, (self.attempts,))


def _detail(error: BaseException) -> str:
    if isinstance(error, RankFailedError):
        return error.detail
    return f"{type(error).__name__}: {error}"


def _headline(error: BaseException) -> str:
    """The failure in one line: the rank and the last line of its traceback."""
    if isinstance(error, RankFailedError):
        lines = [line.strip() for line in error.detail.splitlines()
                 if line.strip() and not line.startswith("(rank")]
        return f"rank {error.rank}: {lines[-1] if lines else 'no detail'}"
    return f"{type(error).__name__}: {error}"


def restartable(error: BaseException, *, in_process: bool) -> bool:
    """Whether a failed attempt that raised ``error`` may be restarted."""
    if isinstance(error, LaunchError) or not isinstance(error, Exception):
        return False  # cannot start at all; Ctrl-C, SIGTERM, a preempted job
    return in_process or isinstance(error, RankFailedError)


def attempt_environment(attempt: int) -> AbstractContextManager[None]:
    """``INTERLOCK_RESTART_ATTEMPT`` set to ``attempt`` in this process (children
    started now inherit it), and put back afterwards."""
    return environment_variables({ATTEMPT_ENV: str(attempt)})


def run_with_restarts(attempt_once: Callable[[int], T], policy: RestartPolicy, *,
                      in_process: bool, sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``attempt_once(attempt)`` until one returns or the budget is spent."""
    causes: list[BaseException] = []
    for attempt in range(policy.max_restarts + 1):
        try:
            with attempt_environment(attempt):
                return attempt_once(attempt)
        except BaseException as error:
            if not restartable(error, in_process=in_process):
                raise
            causes.append(error)
            if attempt == policy.max_restarts:
                if policy.max_restarts == 0:
                    raise
                raise RestartsExhaustedError(tuple(causes)) from error
            wait = policy.delay(attempt + 1)
            print(f"interlock: attempt {attempt} failed ({_headline(error)}); restarting "
                  f"every rank in {wait:g} s (restart {attempt + 1} of "
                  f"{policy.max_restarts})", file=sys.stderr, flush=True)
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
