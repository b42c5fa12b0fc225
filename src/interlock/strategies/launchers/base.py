"""`Launcher`: how a strategy's processes come into being."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interlock.engine.registry import registered
from interlock.engine.tables import LauncherRow
from interlock.strategies.preemption import Preempted

if TYPE_CHECKING:
    from interlock.engine.tables import LauncherRow
    from interlock.strategies.environments import ClusterEnvironment

#: Environment variable through which interlock's launchers hand workers the
#: rendezvous store's address ("host:port"); the store itself lives in the launching
#: process, bound to a port the kernel chose, so no port is ever picked and released.
RENDEZVOUS_ENV = "INTERLOCK_RENDEZVOUS"
#: Set to "1" when no launcher process hosts the store and global rank 0 must serve
#: it (a multi-node job without a cluster launcher, on a fixed MASTER_PORT).
RANK0_SERVES_ENV = "INTERLOCK_RANK0_SERVES"
#: Where a worker started by the script launcher writes its traceback on failure.
ERROR_FILE_ENV = "INTERLOCK_ERROR_FILE"
#: Seconds a worker that recorded its failure has to exit before its launcher stops it
#: and goes on as if it had exited. A failed worker records, tears down, then exits;
#: one can also never exit (a process group freed at shutdown joins threads that never
#: end, a thread that is not a daemon keeps the interpreter waiting), and while it
#: lives its connections stay open, so its peers' collectives do not fail either.
RECORDED_EXIT_GRACE_S = 2.0

WorkerEntry = Callable[..., Any]


class RankFailedError(RuntimeError):
    """A rank raised or died; the message names it and carries its traceback."""

    def __init__(self, rank: int, detail: str) -> None:
        self.rank = rank
        self.detail = detail
        super().__init__(f"rank {rank} failed:\n{detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankFailedError, (self.rank, self.detail))


class LaunchError(RuntimeError):
    """The launcher cannot start processes here (and says why)."""


class Launcher(ABC):
    """Starts the processes of one node and runs a worker entry in each.

    ``name`` is the engine's launcher name; interactive compatibility and the start
    method come from the engine's launcher table.
    """

    #: the engine's launcher name (subprocess, spawn, fork, forkserver, xla, external)
    name: str
    #: the kind of device each process it starts drives (``"cpu"``, ``"cuda"``, ...),
    #: set by :func:`~interlock.strategies.launchers.launcher_for` from the strategy: a
    #: launcher that reserves resources for its ranks (a cluster's GPUs) reads it
    device_type: str = "cpu"

    @classmethod
    def for_job(cls, row: LauncherRow, *, num_processes: int, num_nodes: int,
                cluster: ClusterEnvironment) -> Launcher:
        """The launcher a plan's launcher ``row`` names, for ``num_processes`` per node
        on ``num_nodes`` nodes, with ``cluster`` saying where this node stands: how
        :func:`~interlock.strategies.launchers.launcher_for` builds the class a launcher
        row's ``factory`` names. The default passes the three as keyword arguments;
        classes with another constructor override it."""
        return cls(num_processes=num_processes, num_nodes=num_nodes,  # type: ignore[call-arg]
                   cluster=cluster)

    @property
    def is_interactive_compatible(self) -> bool:
        row = registered(LauncherRow).get(self.name)
        return row is not None and row.interactive

    @abstractmethod
    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        """Run ``entry(*args, **kwargs)`` in every local process; rank 0's result."""


def run_recording_errors(entry: WorkerEntry, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    """Run ``entry``; on failure write when and what failed where the launcher that
    started this process (``INTERLOCK_ERROR_FILE``) will read it, then re-raise."""
    try:
        return entry(*args, **kwargs)
    except BaseException as exc:
        report_failure(exc)
        raise


def report_failure(exc: BaseException) -> None:
    """Record ``exc`` where this process's launcher reads failures, once (the first
    report, made closest to the failure, stands). A preempted rank did not fail."""
    if isinstance(exc, Preempted):
        return
    mark_failure_time(exc)
    path = os.environ.get(ERROR_FILE_ENV)
    if path and not os.path.exists(path):
        record_failure(path, exc)


def mark_failure_time(exc: BaseException) -> None:
    """Remember when ``exc`` was first seen (kept if already set)."""
    if not hasattr(exc, "_interlock_failed_at"):
        exc._interlock_failed_at = time.time()  # type: ignore[attr-defined]


def failure_time(exc: BaseException) -> float:
    """When ``exc`` was first seen in this rank (``time.time()``): the moment the
    strategy recorded it, closest to the failure, else now. Launchers compare these
    to name the rank that failed first (:func:`root_cause`)."""
    mark_failure_time(exc)
    return float(exc._interlock_failed_at)  # type: ignore[attr-defined]


def record_failure(path: str | os.PathLike[str], exc: BaseException) -> None:
    """Write the failure's time and traceback (the earliest failure is the cause)."""
    mark_failure_time(exc)
    report = {"time": exc._interlock_failed_at,  # type: ignore[attr-defined]
              "traceback": "".join(traceback.format_exception(exc))}
    # written whole or not at all: the launcher may read while this process dies
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(tmp, path)


def read_failures(directory: str | os.PathLike[str]) -> dict[int, tuple[float, str]]:
    """The failures recorded as ``rank<N>.json`` in ``directory``."""
    found: dict[int, tuple[float, str]] = {}
    for path in Path(directory).glob("rank*.json"):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            found[int(path.stem[4:])] = (float(report["time"]), str(report["traceback"]))
        except (ValueError, KeyError, OSError):
            continue  # a report cut short by a kill: the exit code still tells
    return found


def root_cause(failures: dict[int, tuple[float, str]]) -> RankFailedError:
    """The failure that happened first; the others are usually its consequences (a
    peer's collective fails with "connection closed" once the first rank is gone)."""
    rank = min(failures, key=lambda r: (failures[r][0], r))
    detail = failures[rank][1]
    others = sorted(r for r in failures if r != rank)
    if others:
        detail += (f"\n(rank{'s' if len(others) > 1 else ''} "
                   f"{', '.join(map(str, others))} failed after it)")
    return RankFailedError(rank, detail)


def limit_worker_threads(start_method: str | None) -> None:
    """One intra-op thread per worker unless OMP_NUM_THREADS says otherwise.

    Several processes per node each running a full thread pool oversubscribe the CPU
    (torchrun applies the same default). For forked workers it is also a matter of
    correctness: GNU OpenMP cannot be used again in a child once the parent has used
    it, and a multi-threaded CPU kernel in such a child hangs for ever.
    """
    if start_method == "fork" or "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (no orphans after SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return


class _Terminate(BaseException):
    """Raised in the launching process when it receives SIGTERM."""


class sigterm_as_exception:
    """Within this context SIGTERM raises in the main thread, so launchers can stop
    their children before the process exits (the default action would orphan them)."""

    def __enter__(self) -> None:
        self._previous: Any = None
        if _in_main_thread():
            self._previous = signal.signal(signal.SIGTERM, _raise_terminate)

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _raise_terminate(signum: int, frame: object) -> None:
    raise _Terminate()


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def exit_code_for_terminate() -> int:
    return 128 + int(signal.SIGTERM)


@contextlib.contextmanager
def environment_variables(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment for the block, and put back after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def set_worker_environment(
    *, local_rank: int, node_rank: int, num_processes: int, world_size: int,
    rendezvous: str, rank0_serves: bool = False,
) -> None:
    """Variables a worker reads its place from (this process only)."""
    host, _, port = rendezvous.rpartition(":")
    os.environ.update(
        {
            "RANK": str(node_rank * num_processes + local_rank),
            "LOCAL_RANK": str(local_rank),
            "NODE_RANK": str(node_rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": host,
            "MASTER_PORT": port,
            RENDEZVOUS_ENV: rendezvous,
            RANK0_SERVES_ENV: "1" if rank0_serves else "0",
        }
    )
