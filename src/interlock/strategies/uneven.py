"""Ranks that disagree on how many collectives to run fail at once, by name.

If one rank returns from the training function while another still steps (the last,
smaller batch of an uneven dataset on one rank only), the other rank's next gradient
reduction waits for a peer that will never join it: gloo and nccl report that only
after the process group's timeout (30 minutes by default), as "connection closed" or
"timed out", without saying why.

Each rank of a multi-process strategy announces in the rendezvous store that it
returned from the function. A watcher thread in every rank looks for such
announcements; if a peer has returned while this rank's main thread sits, unchanged
for :data:`GRACE_S` seconds, in a collective or in a backward pass (where gradients
are reduced), this rank is waiting for a rank that is gone. It records an
:class:`UnevenCollectivesError` naming the ranks for its launcher and exits.

A rank that fails announces that too (:meth:`ReturnWatch.failed`), so that a peer
whose collective then breaks knows which rank failed first.

The watcher talks to the store through a clone of its own (torch's way to use a store
from two threads) and is not a daemon thread: a daemon thread that comes back from a
store operation while the interpreter is shutting down ends the process with SIGABRT
("terminate called without an active exception"), and a rank that did everything right
would be reported as killed by a signal. Teardown waits for the watcher instead (one
poll and one store operation: a store operation is answered at once, unless the
process serving the store has stopped), and the watcher also stops by itself once the
main thread has ended, for the interpreter waits for it too.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from types import FrameType

import torch.distributed as dist

from interlock.strategies.launchers import history as launch_history
from interlock.strategies.launchers.base import ERROR_FILE_ENV, RENDEZVOUS_ENV, report_failure

#: how long this rank's main thread must stay in the same collective (or backward)
#: after a peer returned before it counts as stranded: long enough for the end of a
#: backward pass whose last reduction already completed
GRACE_S = 10.0
#: how often the watcher looks at the store (one operation per rank and poll)
POLL_S = 1.0
#: the exit code of a rank ended by the watcher
STRANDED_EXIT_CODE = 70
#: seconds a failing rank waits for the store when it announces its failure
STORE_TIMEOUT_S = 5.0

_generation = 0


class UnevenCollectivesError(RuntimeError):
    """A rank was left waiting in a collective by ranks that had already returned."""


def _key(generation: str, rank: int) -> str:
    return f"interlock/returned/{generation}/{rank}"


def _count_key(generation: str) -> str:
    return f"interlock/returned/{generation}/count"


def _first_failed_key(generation: str) -> str:
    return f"interlock/failed/{generation}/first"


def _waiting_in_collective(frame: FrameType) -> bool:
    """Whether the main thread, whose innermost frame is ``frame``, is in
    torch.distributed or DDP code (a collective, or DDP's buffer broadcast) or in
    the autograd engine (where DDP and FSDP reduce gradients). The few innermost
    frames are looked at: C++ calls leave their Python caller innermost."""
    current: FrameType | None = frame
    for _ in range(3):
        if current is None:
            return False
        where = current.f_code.co_filename.replace(os.sep, "/")
        if ("/torch/distributed/" in where or "/torch/nn/parallel/" in where
                or current.f_code.co_name in ("_engine_run_backward", "backward")):
            return True
        current = current.f_back
    return False


def _is_distributed_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from a collective (not, say, an out-of-memory error in
    code a rank runs alone after its peers returned)."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        mark in text for mark in ("gloo", "Connection closed", "Connection reset",
                                  "NCCL", "Timed out", "timed out"))


def _in_callers_process() -> bool:
    """Whether this rank runs in the user's own process (the script launcher's rank
    0): ending it would end the user's script, not just a worker."""
    return RENDEZVOUS_ENV in os.environ and ERROR_FILE_ENV not in os.environ


class ReturnWatch:
    """Announces this rank's return and watches for stranded collectives."""

    def __init__(self, rank: int, world_size: int) -> None:
        global _generation
        # Keys must agree between ranks: the launch's number does (ranks re-run by the
        # script launcher replay earlier launches without setting anything up), plus
        # how many watches this process made, for a process that sets up outside any
        # launch.
        _generation += 1
        self.generation = f"{launch_history.in_progress()}.{_generation}"
        self.rank = rank
        self.world_size = world_size
        self._store: dist.Store | None = None
        #: the watcher thread's own client of the store
        self._watch_store: dist.Store | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # peers seen returned, kept: the store may go with the rank that hosts it
        self._returned: list[int] = []

    def start(self) -> None:
        """Begin watching (a no-op with one rank or no default store)."""
        if self.world_size < 2:
            return
        try:
            self._store = dist.distributed_c10d._get_default_store()
            self._watch_store = self._store.clone()  # type: ignore[attr-defined]  # not in the stubs
        except (RuntimeError, ValueError, AttributeError, NotImplementedError):
            # no store to talk through (or none this thread may use): the process
            # group's timeout still applies
            self._watch_store = None
            return
        # not a daemon: see the module's docstring
        self._thread = threading.Thread(target=self._watch, name="interlock-return-watch")
        self._thread.start()

    def returned(self) -> None:
        """Announce that this rank returned from the training function."""
        self._stop.set()
        if self._store is not None:
            try:
                self._store.set(_key(self.generation, self.rank), "1")
                self._store.add(_count_key(self.generation), 1)
            except (RuntimeError, ValueError):
                pass  # the store is gone with a peer: nothing is waiting for this rank

    def stop(self) -> None:
        """Stop watching (teardown): returns once the watcher has ended."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self._watch_store = None

    def _peers_returned(self, store: dist.Store) -> list[int]:
        peers = [r for r in range(self.world_size) if r != self.rank]
        return [r for r in peers if store.check([_key(self.generation, r)])]

    def _watch(self) -> None:
        main_thread = threading.main_thread()
        main = main_thread.ident
        store = self._watch_store
        since: tuple[FrameType, float] | None = None
        while store is not None and not self._stop.wait(POLL_S) and main_thread.is_alive():
            try:
                # one store operation per poll, whatever the world size
                if store.add(_count_key(self.generation), 0) == 0:
                    continue
                if not self._returned:
                    self._returned = self._peers_returned(store)
            except (RuntimeError, ValueError):
                return  # the store went away: the launch is ending
            frame = sys._current_frames().get(main or -1)
            if frame is None or not _waiting_in_collective(frame):
                since = None
                continue
            if since is None or since[0] is not frame:
                since = (frame, time.monotonic())
                continue
            if time.monotonic() - since[1] < GRACE_S or self._stop.is_set():
                continue
            if self._returned:
                self._give_up(self._returned, frame)
                return

    def explain(self, exc: BaseException) -> UnevenCollectivesError | None:
        """``exc`` (a collective that failed in this rank) explained, when peers had
        returned from the function before it: their absence is the cause."""
        if self._store is None or not _is_distributed_error(exc):
            return None
        returned = self._returned
        if not returned:
            try:
                returned = self._peers_returned(self._store)
            except (RuntimeError, ValueError):
                return None
        if not returned:
            return None
        return _stranded(self.rank, returned, f"it failed with {type(exc).__name__}")

    def failed(self, exc: BaseException) -> int | None:
        """Announce that this rank failed with ``exc``; the peer that failed before it,
        when ``exc`` is a collective's failure (most likely that peer's doing).

        One store operation: the first rank to fail claims a key, every later one
        reads it. None when this rank was first, when ``exc`` is not a collective's
        failure, or when the store is gone (with the rank that hosted it)."""
        if self._store is None:
            return None
        try:
            self._store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
            first = self._store.compare_set(_first_failed_key(self.generation), "",
                                            str(self.rank))
            rank = int(first)
        except (RuntimeError, ValueError):
            return None
        if rank == self.rank or not _is_distributed_error(exc):
            return None
        return rank

    def _give_up(self, returned: list[int], frame: FrameType) -> None:
        where = (f"it has waited in {frame.f_code.co_name} "
                 f"({os.path.basename(frame.f_code.co_filename)}) for {GRACE_S:.0f}s")
        error = _stranded(self.rank, returned, where)
        print(f"interlock: {error}", file=sys.stderr, flush=True)
        if _in_callers_process():
            # the user's own script: say why it waits, but do not end it; the collective
            # fails once the peers' processes exit, and explain() names the cause
            return
        report_failure(error)
        sys.stdout.flush()
        # the main thread is blocked in C++ and cannot be interrupted: end the worker
        os._exit(STRANDED_EXIT_CODE)


def _stranded(rank: int, returned: list[int], what: str) -> UnevenCollectivesError:
    names = ", ".join(map(str, returned))
    many = len(returned) > 1
    return UnevenCollectivesError(
        f"rank {rank} was left in a collective that rank{'s' if many else ''} {names} "
        f"will never join ({what}): {'they' if many else 'it'} already returned from "
        "the training function. The ranks ran different numbers of steps or "
        "collectives, usually because their data had different lengths: give every "
        "rank the same number of batches (strategy.setup_dataloader does), or make "
        "every rank run the same collectives."
    )
