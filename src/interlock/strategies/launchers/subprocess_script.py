"""`SubprocessScriptLauncher`: re-run the user's script once per extra local rank."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from interlock.strategies.launchers import history as launch_history
from interlock.strategies.launchers.base import (
    ERROR_FILE_ENV,
    RANK0_SERVES_ENV,
    RECORDED_EXIT_GRACE_S,
    RENDEZVOUS_ENV,
    Launcher,
    LaunchError,
    RankFailedError,
    WorkerEntry,
    _Terminate,
    die_with_parent,
    environment_variables,
    exit_code_for_terminate,
    read_failures,
    record_failure,
    root_cause,
    run_recording_errors,
    sigterm_as_exception,
)
from interlock.strategies.launchers.rendezvous import (
    await_arrivals,
    choose_rendezvous,
    release_store,
)
from interlock.strategies.preemption import DEFAULT_GRACE, PREEMPTED_EXIT_CODE, Preempted

if TYPE_CHECKING:
    from interlock.engine.tables import LauncherRow
    from interlock.strategies.environments import ClusterEnvironment


def script_command() -> list[str]:
    """The command that started this process, to run again for the other ranks."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        module = spec.name.removesuffix(".__main__")
        return [sys.executable, "-m", module, *sys.argv[1:]]
    path = getattr(main, "__file__", None)
    if not path:
        raise LaunchError(
            "the script launcher starts the other ranks by re-running the main script, and "
            "this process has none (an interactive session or python -c); use "
            "strategy='ddp_notebook' or 'ddp_fork' there"
        )
    return [sys.executable, os.path.abspath(path), *sys.argv[1:]]


def hydra_overrides(local_rank: int) -> list[str]:
    """Keep a Hydra app's re-runs in the run directory Hydra made for rank 0."""
    if "hydra" not in sys.modules:
        return []
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return []
    if not HydraConfig.initialized():
        return []
    run_dir = HydraConfig.get().runtime.output_dir
    return [f"hydra.run.dir={run_dir}", f"hydra.job.name=rank_{local_rank}",
            "hydra.output_subdir=null"]


class SubprocessScriptLauncher(Launcher):
    """Rank 0 is the calling process; ranks 1..N-1 are the script run again.

    A child knows it is one by ``LOCAL_RANK`` in its environment and just runs the
    entry. Children die with the parent (SIGKILL included), a failed child is named
    with its traceback, and rank 0 waits for the children to exit before returning.
    """

    name = "subprocess"

    @classmethod
    def for_job(cls, row: LauncherRow, *, num_processes: int, num_nodes: int,
                cluster: ClusterEnvironment) -> Launcher:
        return cls(num_processes=num_processes, node_rank=cluster.node_rank(),
                   num_nodes=num_nodes, main_address=cluster.main_address,
                   main_port=cluster.main_port)

    def __init__(self, *, num_processes: int, node_rank: int = 0, num_nodes: int = 1,
                 main_address: str = "127.0.0.1", main_port: int = 0) -> None:
        self.num_processes = num_processes
        self.node_rank = node_rank
        self.num_nodes = num_nodes
        self.main_address = main_address
        self.main_port = main_port

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        index = launch_history.in_progress()
        if index is None:  # used directly, not through Strategy.launch: count it here
            index = launch_history.begin()
            try:
                return self._launch(index, entry, args, kwargs)
            finally:
                launch_history.finish(index, ("unavailable", "a launcher used directly"))
        return self._launch(index, entry, args, kwargs)

    def _launch(self, index: int, entry: WorkerEntry, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        if RENDEZVOUS_ENV in os.environ and "LOCAL_RANK" in os.environ:
            return _run_as_child(index, entry, args, kwargs)
        world_size = self.num_processes * self.num_nodes
        rendezvous, hosted = choose_rendezvous(self.num_nodes, self.main_address,
                                               self.main_port)
        host, _, port = rendezvous.rpartition(":")
        own = {launch_history.LAUNCH_INDEX_ENV: str(index),
               "RANK": str(self.node_rank * self.num_processes), "LOCAL_RANK": "0",
               "NODE_RANK": str(self.node_rank),
               "WORLD_SIZE": str(world_size), "MASTER_ADDR": host, "MASTER_PORT": port,
               RENDEZVOUS_ENV: rendezvous, RANK0_SERVES_ENV: "0" if hosted else "1"}
        threads = torch.get_num_threads()
        if self.num_processes > 1 and "OMP_NUM_THREADS" not in os.environ:
            # one intra-op thread per process, as torchrun does (no oversubscription)
            own["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)
        try:
            with tempfile.TemporaryDirectory(prefix="interlock-ranks-") as errors, \
                    environment_variables(own), sigterm_as_exception():
                return self._run_rank_zero(entry, args, kwargs, Path(errors), own)
        finally:
            torch.set_num_threads(threads)
            if hosted:
                release_store(rendezvous)

    def _run_rank_zero(self, entry: WorkerEntry, args: tuple[Any, ...],
                       kwargs: dict[str, Any], errors: Path, own: dict[str, str]) -> Any:
        first_rank = self.node_rank * self.num_processes
        children: dict[int, subprocess.Popen[bytes]] = {}
        watcher = _Watcher(children, errors, first_rank)
        relay = _SignalRelay(children, watcher, errors, first_rank)
        relay.install()
        try:
            return self._supervise(entry, args, kwargs, errors, own, children, watcher, relay)
        finally:
            relay.uninstall()

    def _supervise(self, entry: WorkerEntry, args: tuple[Any, ...], kwargs: dict[str, Any],
                   errors: Path, own: dict[str, str],
                   children: dict[int, subprocess.Popen[bytes]], watcher: _Watcher,
                   relay: _SignalRelay) -> Any:
        first_rank = self.node_rank * self.num_processes
        try:
            # inside the try: a signal while starting them stops those already started
            self._start_children(errors, own, children)
            watcher.start()
            if own[RANK0_SERVES_ENV] == "0":
                # The children take seconds to import torch; wait for them here, where
                # a signal is handled at once, rather than inside process-group
                # creation, where it would wait until they connect.
                await_arrivals(own[RENDEZVOUS_ENV], len(children),
                               stop=lambda: any(c.poll() is not None
                                                for c in children.values()))
            result = entry(*args, **kwargs)
        except _Terminate:
            watcher.stop()
            _stop(children)
            raise SystemExit(exit_code_for_terminate()) from None
        except Preempted:
            # every rank agreed to stop at the same step: let the children finish too
            watcher.stop()
            _wait(children, timeout=DEFAULT_GRACE)
            _stop(children)
            raise
        except BaseException as exc:
            watcher.stop()
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                record_failure(errors / f"rank{first_rank}.json", exc)
            failed = watcher.failure or _first_failure(children, wait=2.0)
            _stop(children)
            if (isinstance(exc, KeyboardInterrupt) and relay.stopped_children
                    and watcher.failure is None):
                raise  # the relay stopped the children for this interrupt: not a failure
            if failed is not None or not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise _failure(failed, errors, first_rank) from exc
            raise
        finally:
            watcher.stop()
        try:
            _wait(children)
        except _Terminate:
            _stop(children)
            raise SystemExit(exit_code_for_terminate()) from None
        except BaseException:
            _stop(children)
            raise
        failed = _first_failure(children, wait=0)
        if failed is not None:
            raise _failure(failed, errors, first_rank)
        return result

    def _start_children(self, errors: Path, own: dict[str, str],
                        children: dict[int, subprocess.Popen[bytes]]) -> None:
        """Start ranks 1..N-1 into ``children`` (each one as soon as it runs)."""
        command = script_command()
        history = launch_history.write(errors, int(own[launch_history.LAUNCH_INDEX_ENV]))
        own = {**own, launch_history.LAUNCH_HISTORY_ENV: str(history)}
        for local_rank in range(1, self.num_processes):
            rank = self.node_rank * self.num_processes + local_rank
            env = {**os.environ, **own, "LOCAL_RANK": str(local_rank),
                   "RANK": str(rank),
                   ERROR_FILE_ENV: str(errors / f"rank{rank}.json")}
            children[local_rank] = subprocess.Popen(
                command + hydra_overrides(local_rank), env=env, preexec_fn=die_with_parent,
            )


def _run_as_child(index: int, entry: WorkerEntry, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    # earlier launches were replayed by Strategy.launch (launchers/history.py); a child
    # started for rank 0's n-th launch runs the n-th and exits
    target = launch_history.target()
    if index != target:
        raise LaunchError("internal error: a child of the script launcher ran past its launch")
    try:
        run_recording_errors(entry, args, kwargs)
    except SystemExit:
        raise  # an exit the entry asked for (a preempted rank's included)
    except BaseException as exc:
        # The script goes no further here, as after a success: a script that catches
        # the failure of launch() (and goes on, or launches again) is rank 0's to go
        # on with; this process would run its code as if it were rank 0. The failure
        # is recorded for rank 0 already; print it as an uncaught one would be.
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(_CHILD_INTERRUPTED if isinstance(exc, KeyboardInterrupt)
                         else _CHILD_FAILED) from None
    # Rank 0 serves any later launch with new children; this one is done.
    raise SystemExit(0)


#: a child's exit code when its launch raised, and when it was interrupted (Ctrl-C)
_CHILD_FAILED = 1
_CHILD_INTERRUPTED = 128 + int(signal.SIGINT)


#: Seconds rank 0 has, once a child failed and the watcher interrupted it, to begin
#: handling that failure before the watcher ends the job itself. The interrupt takes
#: effect between Python bytecodes only: a rank 0 blocked in native code (a collective
#: that does not notice its peer is gone, a process-group teardown) would otherwise
#: wait for the process group's timeout, 30 minutes by default.
FAILURE_GRACE_S = 30.0
#: rank 0's exit code when the watcher ends the job for it (an uncaught exception's)
_BLOCKED_EXIT_CODE = 1


class _Watcher(threading.Thread):
    """Interrupts rank 0 as soon as a child exits with an error, and ends the job if
    rank 0 does not handle that within :data:`FAILURE_GRACE_S` seconds."""

    def __init__(self, children: dict[int, subprocess.Popen[bytes]], errors: Path,
                 first_rank: int) -> None:
        super().__init__(daemon=True, name="interlock-rank-watcher")
        self.children = children
        self.errors = errors
        self.first_rank = first_rank
        self.grace = FAILURE_GRACE_S
        self.failure: tuple[int, int] | None = None
        #: when each child's failure record was first seen (a monotonic time)
        self._recorded: dict[int, float] = {}
        self._done = threading.Event()
        #: set by stop(): rank 0's main thread is handling the failure (or is done)
        self._handled = threading.Event()
        # held while deciding to interrupt, so that none comes once stop() has begun
        # (rank 0 is then handling its own failure, and an interrupt landing in that
        # handler would cut it short)
        self._deciding = threading.Lock()

    def run(self) -> None:
        while not self._done.wait(0.05):
            # a preempted child stops with rank 0 at the same step: no need to interrupt
            failing = {rank: child for rank, child in self.children.items()
                       if child.poll() != PREEMPTED_EXIT_CODE}
            failed = _first_failure(failing, wait=0) or self._recorded_but_running()
            if failed is not None:
                with self._deciding:
                    if self._done.is_set():
                        return
                    self.failure = failed
                    self._done.set()
                    _raise_in_main_thread(KeyboardInterrupt)
                if not self._handled.wait(self.grace):
                    self._end_job(failed)
                return

    def _recorded_but_running(self) -> tuple[int, int] | None:
        """A child still running :data:`RECORDED_EXIT_GRACE_S` seconds after it recorded
        its failure, killed: its failure, as if it had exited."""
        now = time.monotonic()
        for rank in read_failures(self.errors):
            index = rank - self.first_rank
            child = self.children.get(index)
            if child is None:
                continue  # rank 0's own record
            seen = self._recorded.setdefault(index, now)
            if child.poll() is None and now - seen >= RECORDED_EXIT_GRACE_S:
                print(f"interlock: rank {rank} recorded its failure {now - seen:.0f}s ago "
                      "and has not exited (stuck in its teardown or its interpreter's "
                      "shutdown); killing it", file=sys.stderr, flush=True)
                child.kill()
                return index, int(child.wait())
        return None

    def _end_job(self, failed: tuple[int, int]) -> None:
        """Rank 0 did not get to the failure in time: name it, say where rank 0 is
        stuck, stop the other ranks and exit."""
        rank = self.first_rank + failed[0]
        print(f"interlock: {_failure(failed, self.errors, self.first_rank)}",
              file=sys.stderr, flush=True)
        print(f"interlock: rank 0 is still blocked {self.grace:.0f}s after rank {rank} "
              "failed (in native code, where the interrupt cannot reach it); ending the "
              "job. Where rank 0's threads were:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        _stop(self.children)
        shutil.rmtree(self.errors, ignore_errors=True)
        os._exit(_BLOCKED_EXIT_CODE)

    def stop(self) -> None:
        """Stop watching; once this returns the watcher interrupts no more and ends
        nothing."""
        with self._deciding:
            self._done.set()
            if self.failure is not None and threading.current_thread() is threading.main_thread():
                # rank 0 is handling a failure already (a collective that failed with
                # the peer): an interrupt not yet delivered must not cut that short
                _raise_in_main_thread(None)
        self._handled.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join()


def _raise_in_main_thread(exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the main thread at its next Python bytecode (None takes back
    one not raised yet).

    Not ``_thread.interrupt_main``: that runs the process's SIGINT handler, and does
    nothing at all where SIGINT is ignored (a job started with ``nohup`` or in the
    background of a script), which would leave rank 0 waiting for the process
    group's timeout after a peer failed. Like a signal, the exception cannot reach
    native code until it returns; :data:`FAILURE_GRACE_S` covers that case.
    """
    main = threading.main_thread().ident
    if main is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(main), None if exc is None else ctypes.py_object(exc))


#: Seconds the signal relay gives rank 0's main thread to run a signal's handler
#: before it acts for it (first stopping the other ranks, then ending the process).
RELAY_GRACE_S = 3.0


class _SignalRelay(threading.Thread):
    """Makes SIGINT and SIGTERM to rank 0 end the job even while rank 0 waits in C++.

    Python runs signal handlers in the main thread between bytecodes. A signal that
    arrives while rank 0 waits in native code (creating the process group, or a
    collective whose peer hangs) only sets a flag, and the handler runs when that call
    returns: when the peer comes, or after the process group's timeout (30 minutes).
    The signal's C handler also writes its number to the wakeup file descriptor that
    this thread reads. If the handler has not run :data:`RELAY_GRACE_S` seconds later,
    the thread stops the other ranks (a wait for a peer then fails, and the handler
    runs); if rank 0 is still blocked after as long again, it ends the process with
    ``128 + signal``.

    Only signals whose Python handler is in place when the launch starts are relayed,
    and only while that handler stays installed: a handler set later by the training
    function (a preemption guard) is its own business. Inert outside the main thread.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, children: dict[int, subprocess.Popen[bytes]], watcher: _Watcher,
                 errors: Path, first_rank: int) -> None:
        super().__init__(daemon=True, name="interlock-signal-relay")
        self.children = children
        self.watcher = watcher
        self.errors = errors
        self.first_rank = first_rank
        self._wrappers: dict[int, Any] = {}
        self._previous: dict[int, Any] = {}
        self._handled: dict[int, int] = {}
        self._fds: tuple[int, int] | None = None
        self._previous_fd = -1
        self._done = threading.Event()
        #: whether the relay stopped the children (their exit codes are its doing)
        self.stopped_children = False

    def install(self) -> None:
        """Wrap the current handlers and start reading the wakeup fd (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            previous = signal.getsignal(signum)
            if callable(previous):  # SIG_DFL ends the process at once; SIG_IGN ignores it
                self._previous[signum] = previous
                self._handled[signum] = 0
                self._wrappers[signum] = self._wrap(signum, previous)
                signal.signal(signum, self._wrappers[signum])
        if not self._wrappers:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._fds = (read_end, write_end)
        self._previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self.start()

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced, unless someone replaced it since."""
        if self._fds is None:
            return
        self._done.set()
        current = signal.set_wakeup_fd(self._previous_fd)
        if current != self._fds[1]:
            signal.set_wakeup_fd(current)
        os.write(self._fds[1], b"\0")  # wakes the thread
        self.join()
        for fd in self._fds:
            os.close(fd)
        self._fds = None
        for signum, wrapper in self._wrappers.items():
            if signal.getsignal(signum) is wrapper:
                signal.signal(signum, self._previous[signum])

    def _wrap(self, signum: int, previous: Any) -> Any:
        def handler(number: int, frame: FrameType | None) -> Any:
            self._handled[signum] += 1
            return previous(number, frame)
        return handler

    def run(self) -> None:
        assert self._fds is not None
        read_end = self._fds[0]
        arrived = dict.fromkeys(self._handled, 0)
        while not self._done.is_set():
            select.select([read_end], [], [])
            data = os.read(read_end, 512)
            if self._previous_fd != -1 and data.strip(b"\0"):
                try:  # another reader (an event loop) waits for these too
                    os.write(self._previous_fd, data.replace(b"\0", b""))
                except OSError:
                    pass
            for signum in data:
                if signum in arrived and not self._done.is_set():
                    arrived[signum] += 1
                    self._act(signum, arrived[signum])

    def _act(self, signum: int, count: int) -> None:
        """The ``count``-th ``signum`` arrived: make sure it takes effect."""
        if signal.getsignal(signum) is not self._wrappers[signum] or self._ran(signum, count):
            return
        name = signal.Signals(signum).name
        print(f"interlock: {name} arrived while rank 0 waits in native code; stopping the "
              "other ranks", file=sys.stderr, flush=True)
        self.watcher.stop()  # their exits are no failure to interrupt rank 0 for
        self.stopped_children = True
        _stop(self.children)
        if self._ran(signum, count):
            return
        if self.watcher.failure is not None:
            print(f"interlock: {_failure(self.watcher.failure, self.errors, self.first_rank)}",
                  file=sys.stderr, flush=True)
        print(f"interlock: rank 0 is still blocked {RELAY_GRACE_S:.0f}s after its peers "
              f"stopped; exiting on {name}", file=sys.stderr, flush=True)
        shutil.rmtree(self.errors, ignore_errors=True)
        os._exit(128 + signum)

    def _ran(self, signum: int, count: int) -> bool:
        """Whether the main thread runs the handler for the ``count``-th ``signum``
        within :data:`RELAY_GRACE_S` seconds (or the launch ends)."""
        deadline = time.monotonic() + RELAY_GRACE_S
        while self._handled[signum] < count:
            if self._done.wait(0.05) or time.monotonic() >= deadline:
                return self._done.is_set()
        return True


def _first_failure(children: dict[int, subprocess.Popen[bytes]],
                   wait: float) -> tuple[int, int] | None:
    import time

    deadline = time.monotonic() + wait
    while True:
        for rank, child in sorted(children.items()):
            code = child.poll()
            if code not in (None, 0):
                return rank, int(code)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _failure(failed: tuple[int, int] | None, errors: Path, first_rank: int) -> RankFailedError:
    """The earliest recorded failure, or the child's exit code when it recorded none."""
    failures = read_failures(errors)
    if failed is not None:
        local_rank, code = failed
        rank = first_rank + local_rank
        if rank not in failures:
            return RankFailedError(
                rank, f"exited with code {code} without a traceback (killed by a signal, "
                "or os._exit?)"
            )
    return root_cause(failures)


def _wait(children: dict[int, subprocess.Popen[bytes]], timeout: float | None = None) -> None:
    """Wait for every child to exit (at most ``timeout`` seconds in all, when given).

    Never in one blocking ``waitpid``: a signal delivered to another thread of this
    process would not interrupt it, and its handler would wait for the children.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    for child in list(children.values()):
        while child.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return
            try:
                child.wait(min(1.0, left))  # polls, running signal handlers in between
            except subprocess.TimeoutExpired:
                continue


def _stop(children: dict[int, subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """Terminate every live child, then kill what is still there after ``grace``."""
    children = dict(children)  # the signal relay may stop them from its thread
    for child in children.values():
        if child.poll() is None:
            child.terminate()
    for child in children.values():
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
