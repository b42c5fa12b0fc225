"""Preemption: a termination signal becomes a request to save and stop at a safe point.

A cluster scheduler that preempts a job sends SIGTERM to every process of it (SLURM,
Kubernetes, torchrun's agent passing on its own SIGTERM) and kills what is left a grace
period later. By default a Python process dies on SIGTERM at once, mid-step. Inside a
:class:`PreemptionGuard` the signal only sets a flag; the training loop asks
:meth:`PreemptionGuard.should_stop` once per step (every rank at the same point, since
the ranks agree through a collective), saves, and calls :meth:`PreemptionGuard.stop`::

    with PreemptionGuard() as preemption:
        for step in range(start, steps):
            train_one_step(...)
            if preemption.should_stop(strategy):
                strategy.save_checkpoint(path, state)
                preemption.stop()  # raises Preempted: the process exits with 143

A rank that cannot reach ``should_stop`` (stuck in a collective or in user code) exits
with ``128 + signal`` once ``grace`` seconds have passed since the signal, or is ended
by SIGALRM a second later if even that cannot run (the guard takes over ``alarm(2)``
once a signal has arrived).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, NoReturn, Protocol


class PreemptibleStrategy(Protocol):
    """What a guard needs of a strategy (`interlock.strategies.base.Strategy`, whose
    launchers use guards, and so is not imported here)."""

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool: ...

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None: ...

#: The exit status of a process stopped by SIGTERM through a guard (the shell's 128 + 15).
PREEMPTED_EXIT_CODE = 128 + int(signal.SIGTERM)

#: Seconds a guarded process may keep running after the signal (SLURM's KillWait and
#: torchrun's stop timeout both default to 30 s before SIGKILL).
DEFAULT_GRACE = 25.0


class Preempted(SystemExit):
    """The job was asked to stop; the process exits with ``128 + signal``.

    A ``SystemExit``, so that it passes through ``except Exception`` blocks and ends
    the process without a traceback; launchers do not report it as a rank failure.
    """

    def __init__(self, signum: int = int(signal.SIGTERM)) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:
        return (Preempted, (self.signum,))


class PreemptionGuard:
    """Within it, ``signals`` ask the training loop to stop instead of killing the process.

    Args:
        signals: the signals that mean "stop soon" (SIGTERM by default; add SIGUSR1 for
            SLURM's ``--signal=USR1@60``).
        grace: seconds after the first signal within which the process must have
            ended by itself (inside the guard or after it); after that it exits with
            ``128 + signal`` whatever it is doing. ``None`` waits for ever (the
            scheduler's SIGKILL ends it).

    Signal handlers can only be installed from the main thread; in any other thread
    the guard is inert and :attr:`requested` stays false.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
                 grace: float | None = DEFAULT_GRACE) -> None:
        if not signals:
            raise ValueError("a preemption guard needs at least one signal")
        if grace is not None and grace <= 0:
            raise ValueError(f"grace must be positive seconds or None, got {grace!r}")
        self.signals = tuple(signals)
        self.grace = grace
        self.signum: int | None = None
        self.received_at: float | None = None
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        """Whether this process has received one of the signals."""
        return self.signum is not None

    def should_stop(self, strategy: PreemptibleStrategy) -> bool:
        """Whether any rank has received a signal: a collective, so every rank must
        call it at the same point (once per step) and all get the same answer."""
        return strategy.reduce_boolean_decision(self.requested, all=False)

    def stop(self) -> NoReturn:
        """End the training function: raise :class:`Preempted`."""
        raise Preempted(self.signum if self.signum is not None else int(signal.SIGTERM))

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[int(signum)] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        # After a signal the deadline stays: teardown after the guard (destroying the
        # process group while peers leave) must not outlive the grace period either.

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            return  # the launcher and the scheduler may both send it: once is enough
        self.signum = signum
        self.received_at = time.time()
        if self.grace is not None:
            self._timer = threading.Timer(self.grace, os._exit, args=(128 + signum,))
            self._timer.daemon = True
            self._timer.start()
            # The timer needs the GIL, and a thread can hold it while stuck in native
            # code (freeing a gloo process group at exit can deadlock so): one second
            # later the kernel ends the process with SIGALRM, which needs nothing.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(math.ceil(self.grace) + 1)
