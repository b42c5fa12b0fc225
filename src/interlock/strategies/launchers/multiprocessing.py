"""`MultiProcessingLauncher`: spawn, fork or forkserver worker processes."""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import os
import pickle
import signal
import tempfile
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp

from interlock.engine.tables import LAUNCHERS
from interlock.strategies.launchers.base import (
    ERROR_FILE_ENV,
    RECORDED_EXIT_GRACE_S,
    Launcher,
    LaunchError,
    RankFailedError,
    WorkerEntry,
    _raise_terminate,
    _Terminate,
    die_with_parent,
    exit_code_for_terminate,
    limit_worker_threads,
    read_failures,
    root_cause,
    run_recording_errors,
    set_worker_environment,
    sigterm_as_exception,
)
from interlock.strategies.launchers.rendezvous import choose_rendezvous, release_store
from interlock.strategies.preemption import PREEMPTED_EXIT_CODE, Preempted

#: the start methods of the multiprocessing launchers in the engine's launcher table
START_METHODS = tuple(
    r.start_method for r in LAUNCHERS if r.start_method is not None and r.name == r.start_method
)

if TYPE_CHECKING:
    from interlock.engine.tables import LauncherRow
    from interlock.strategies.environments import ClusterEnvironment


class MultiProcessingLauncher(Launcher):
    """Starts one worker per local device with a multiprocessing start method.

    The launching process does not train: it hosts the rendezvous store, watches the
    workers, and returns rank 0's result. If any worker fails, the others are
    terminated and :class:`RankFailedError` names the rank with its traceback.
    """

    @classmethod
    def for_job(cls, row: LauncherRow, *, num_processes: int, num_nodes: int,
                cluster: ClusterEnvironment) -> Launcher:
        if row.start_method is None:
            raise LaunchError(f"launcher row {row.name!r} names no start method")
        return cls(start_method=row.start_method, num_processes=num_processes,
                   node_rank=cluster.node_rank(), num_nodes=num_nodes,
                   main_address=cluster.main_address, main_port=cluster.main_port)

    def __init__(self, *, start_method: str, num_processes: int, node_rank: int = 0,
                 num_nodes: int = 1, main_address: str = "127.0.0.1",
                 main_port: int = 0) -> None:
        if start_method not in START_METHODS:
            raise LaunchError(
                f"start method {start_method!r} is unknown; choose {', '.join(START_METHODS)}"
            )
        if start_method not in multiprocessing.get_all_start_methods():
            raise LaunchError(f"this platform does not offer the {start_method!r} start method")
        self.name = start_method
        self.start_method = start_method
        self.num_processes = num_processes
        self.node_rank = node_rank
        self.num_nodes = num_nodes
        self.main_address = main_address
        self.main_port = main_port

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        # Checked before anything starts: a child forked after CUDA was initialised
        # fails at its first CUDA call, long after the cause (torch says only "Cannot
        # re-initialize CUDA in forked subprocess"). The check is torch's public one.
        if self.start_method == "fork" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            raise LaunchError(
                "cannot fork worker processes: CUDA was already initialised in this process "
                "(torch.cuda.is_initialized() is True), and a forked child cannot use it. "
                "Create CUDA tensors and move modules to the GPU only inside the function "
                "given to launch() (in a notebook, restart the kernel first), or use "
                "strategy='ddp_spawn', which starts fresh processes (its function and "
                "arguments must pickle; from a script, strategy='ddp' works too)."
            )
        payload = _payload(self.start_method, entry, args, kwargs)
        if self.start_method == "forkserver":
            preload_forkserver(entry, args)
        rendezvous, hosted = choose_rendezvous(self.num_nodes, self.main_address,
                                               self.main_port)
        world_size = self.num_processes * self.num_nodes
        process_context = None
        # children alive before this launch: a signal that lands inside
        # mp.start_processes leaves no context, and the workers forked so far are
        # then told apart from these
        earlier = set(multiprocessing.active_children())
        errors = tempfile.TemporaryDirectory(prefix="interlock-ranks-")
        gate = os.pipe() if self.start_method == "fork" else None
        if self.start_method == "fork":
            # Garbage in this process (a process group dropped in a reference cycle)
            # is finalised here, where its threads run; see _worker for the children.
            gc.collect()
        try:
            with sigterm_as_exception():
                with _signals_held(self.start_method) as held:
                    process_context = mp.start_processes(  # type: ignore[no-untyped-call]
                        _worker,
                        args=(payload, self.node_rank, self.num_processes,
                              world_size, rendezvous, not hosted, self.start_method,
                              errors.name,
                              # a forkserver child's parent is the server, not this process
                              None if self.start_method == "forkserver" else os.getpid(),
                              held, gate),
                        nprocs=self.num_processes,
                        join=False,
                        start_method=self.start_method,
                    )
                if gate is not None:  # every worker is forked: let them connect
                    os.write(gate[1], b"g" * self.num_processes)
                _join(process_context, self.node_rank * self.num_processes, errors.name)
                result_file = Path(errors.name, "result.pkl")
                if not result_file.exists():
                    raise RankFailedError(0, "rank 0 exited without a result")
                return pickle.loads(result_file.read_bytes())
        except _Terminate:
            _stop(_started(process_context, earlier))
            raise SystemExit(exit_code_for_terminate()) from None
        except BaseException:
            _stop(_started(process_context, earlier))
            raise
        finally:
            if gate is not None:
                os.close(gate[0])
                os.close(gate[1])
            errors.cleanup()
            _remove_torch_error_files(process_context)
            if hosted:
                release_store(rendezvous)


def _remove_torch_error_files(context: Any) -> None:
    """Remove the files torch's ``start_processes`` gives each worker for its traceback
    (in the temp directory; a rank that raised leaves one, which torch never removes).
    What they held has been read or reported by now."""
    for name in getattr(context, "error_files", None) or ():
        if name:
            with contextlib.suppress(OSError):
                os.unlink(name)


#: signals whose Python handlers raise (KeyboardInterrupt, the launcher's SIGTERM)
_HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


class _signals_held:
    """Holds SIGINT and SIGTERM back while workers are forked; yields those it held.

    A forked child resumes in multiprocessing's code a few bytecodes before the
    ``try`` that ends it with ``os._exit``. A signal handled there (Ctrl-C at a terminal
    reaches the whole process group, so a child just forked gets it too; the launcher
    stops started children with SIGTERM) would raise *outside* that ``try``, and the
    child would return into the caller's code and go on running the caller's script as
    a second copy. Children inherit the blocked mask; :func:`_worker` releases it once
    it runs inside multiprocessing's ``try``. The parent gets any signal that arrived
    meanwhile as soon as the forks are done. Spawned children exec a fresh interpreter
    and forkserver children are forked by the server, so only ``fork`` needs this.
    """

    def __init__(self, start_method: str) -> None:
        self.start_method = start_method
        self.held: frozenset[int] = frozenset()

    def __enter__(self) -> frozenset[int]:
        if self.start_method == "fork":
            before = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
            self.held = frozenset(int(s) for s in _HELD_SIGNALS - set(before))
        return self.held

    def __exit__(self, *exc: object) -> None:
        if self.held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.held)


def _join(context: Any, first_rank: int, errors: str,
          grace: float = RECORDED_EXIT_GRACE_S) -> None:
    try:
        while not context.join(timeout=0.05):
            if read_failures(errors):
                # A rank recorded its failure but has not exited: it may never (a gloo
                # group freed after a timed-out collective can deadlock the interpreter's
                # exit), so do not wait for its exit code; the caller stops the workers.
                _settle(context, grace)
                failures = read_failures(errors)
                signalled = _killed_silently(context, first_rank, failures)
                if signalled is not None:
                    # a peer killed by a signal (SIGKILL, the OOM killer) before torch
                    # noticed its exit: the recorded errors are its consequences
                    raise _killed_first(signalled, failures)
                raise root_cause(failures)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        # torch reports the first process it noticed, not the first that failed: give
        # the others a moment to record theirs, then name the earliest.
        noticed = time.time()
        _settle(context, grace)
        failures = read_failures(errors)
        killed = first_rank + int(exc.error_index)
        if (isinstance(exc, mp.ProcessExitedException) and killed not in failures
                and exc.exit_code != PREEMPTED_EXIT_CODE
                and (exc.exit_code < 0
                     or not any(at < noticed - 1.0 for at, _ in failures.values()))):
            # a rank that died without a word: killed by a signal (SIGKILL, the OOM
            # killer; torch noticed this exit first, so it was no stop of ours), or an
            # os._exit before any other rank failed. The others' errors are its
            # consequences (their peer vanished, or torch stopped them), so it is the cause
            detail = str(exc)
            if failures:
                others = sorted(failures)
                detail += (f"\n(rank{'s' if len(others) > 1 else ''} "
                           f"{', '.join(map(str, others))} failed after it)")
            raise RankFailedError(killed, detail) from None
        if failures:
            raise root_cause(failures) from None
        if getattr(exc, "exit_code", None) == PREEMPTED_EXIT_CODE:
            raise Preempted() from None  # the ranks stopped together on a signal
        raise RankFailedError(first_rank + int(exc.error_index), str(exc)) from None


def _killed_silently(context: Any, first_rank: int,
                     failures: dict[int, Any]) -> tuple[int, int, int] | None:
    """``(rank, process index, signal)`` of the lowest worker that a signal ended
    without a recorded failure (nothing here has stopped a worker yet), or None."""
    for index, process in enumerate(context.processes):
        code = process.exitcode
        rank = first_rank + index
        if code is not None and code < 0 and rank not in failures:
            return rank, index, -code
    return None


def _killed_first(killed: tuple[int, int, int],
                  failures: dict[int, Any]) -> RankFailedError:
    """The failure of a rank a signal killed, the recorded ones named as after it."""
    rank, index, number = killed
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    others = sorted(failures)
    return RankFailedError(rank, f"process {index} terminated with signal {name}"
                           f"\n(rank{'s' if len(others) > 1 else ''} "
                           f"{', '.join(map(str, others))} failed after it)")


def _settle(context: Any, grace: float) -> None:
    """Give the workers ``grace`` seconds to exit (and record their failures)."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.is_alive() for p in context.processes):
        time.sleep(0.05)


def _started(context: Any, earlier: set[multiprocessing.process.BaseProcess]
             ) -> list[multiprocessing.process.BaseProcess]:
    """The workers this launch started: the context's, or, when the launch was
    interrupted before ``mp.start_processes`` returned one, every child alive now that
    was not alive before."""
    if context is not None:
        return list(context.processes)
    return [p for p in multiprocessing.active_children() if p not in earlier]


def _stop(processes: list[multiprocessing.process.BaseProcess], grace: float = 5.0
          ) -> None:
    """Terminate every live worker, then kill what is still there after ``grace``."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


#: what the forkserver imports before it forks any worker, besides the modules of the
#: entry and its arguments that belong to these packages (see preload_forkserver)
FORKSERVER_PRELOAD = ("torch", "torch.distributed", __name__)
#: the packages whose modules the forkserver may import for a launch's entry and
#: arguments: their import has no side effect a forked child would inherit wrongly
_PRELOADABLE = ("torch", "interlock")


def preload_forkserver(entry: WorkerEntry, args: tuple[Any, ...]) -> tuple[str, ...]:
    """Have the forkserver import torch (and interlock's modules the launch needs)
    once, before it forks the workers; returns the modules it will preload, or ``()``
    when the server already runs (then it keeps what it had).

    Without this every forkserver worker imports torch afresh, seconds of CPU each,
    as a spawned one does: the server's default preload, ``__main__``, is never
    imported under Python 3.11 (the server is not given the main module's path), and
    nothing else is preloaded. The user's own modules are not preloaded: one that
    initialises CUDA at import would leave every forked worker with a context it
    cannot use. Modules the user set with ``multiprocessing.set_forkserver_preload``
    are kept.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is not None:
        return ()
    wanted = list(FORKSERVER_PRELOAD)
    for obj in (entry, getattr(entry, "__self__", None), *args):
        module = getattr(obj, "__module__", None) or type(obj).__module__
        if isinstance(module, str) and module.split(".")[0] in _PRELOADABLE:
            wanted.append(module)
    already = list(getattr(server, "_preload_modules", None) or [])
    chosen = tuple(dict.fromkeys([*already, *wanted]))
    server.set_forkserver_preload(list(chosen))
    return chosen


def _payload(start_method: str, entry: WorkerEntry, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
    """What the workers receive: the call itself for fork (each child has a private
    copy-on-write image of this process), else the call wrapped so that it pickles
    with tensors copied (see :class:`_PrivateCall`)."""
    if start_method == "fork":
        return entry, args, kwargs
    return _PrivateCall((entry, args, kwargs))


class _CopyingPickler(ForkingPickler):
    """multiprocessing's pickler without torch's tensor and storage reducers.

    torch registers reducers that move CPU storages into shared memory (and send CUDA
    ones by IPC handle), so every worker would receive the same storage: a model
    passed to ``launch`` would be one set of parameters that every rank's optimizer
    steps, and the caller's model would be left in shared memory. Without them,
    tensors pickle by value. multiprocessing's own reducers (queues, locks, events,
    connections) stay, so those still reach spawned workers.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_table = {
            cls: reducer for cls, reducer in self.dispatch_table.items()
            if getattr(reducer, "__module__", "") != "torch.multiprocessing.reductions"
        }


class _PrivateCall:
    """The worker's call, pickled by :class:`_CopyingPickler` when (and only when)
    multiprocessing pickles the process's arguments: queues and locks may only be
    pickled while a process is being started."""

    def __init__(self, call: tuple[WorkerEntry, tuple[Any, ...], dict[str, Any]]) -> None:
        self.call = call

    def __reduce__(self) -> tuple[Any, ...]:
        buffer = io.BytesIO()
        try:
            _CopyingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(self.call)
        except Exception as error:
            raise LaunchError(
                "the function given to launch() and its arguments must pickle to reach "
                f"worker processes started by 'spawn' or 'forkserver': "
                f"{type(error).__name__}: {error}. Define functions at module level, or "
                "use strategy='ddp_fork' or 'ddp', which need no pickling"
            ) from error
        return (pickle.loads, (buffer.getvalue(),))


def _worker(local_rank: int,
            payload: tuple[WorkerEntry, tuple[Any, ...], dict[str, Any]],
            node_rank: int, num_processes: int,
            world_size: int, rendezvous: str, rank0_serves: bool, start_method: str,
            errors: str, parent_pid: int | None, held: frozenset[int],
            gate: tuple[int, int] | None = None) -> None:
    if start_method == "fork":
        # What the child inherited is never finalised in it: a gloo process group's
        # destructor joins its worker threads, which exist only in the launching
        # process, so a garbage collection that met one waited for ever (seen as a
        # rank stuck in gc.collect() inside DeepSpeed's ZeRO-3 setup). Objects the
        # child makes itself are collected as usual.
        gc.freeze()
    if signal.getsignal(signal.SIGTERM) is _raise_terminate:
        # inherited from the launching process by fork: here SIGTERM is the launcher
        # (or torch) stopping this worker, not a failure of its own to report
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if held:  # see _signals_held: from here on a signal raises inside multiprocessing's try
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    die_with_parent()
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect
    if gate is not None:
        # Forked workers wait until the last one is forked before any connects to the
        # store. The store's server thread in the launching process formats each new
        # peer's address with getnameinfo; a fork while it holds glibc's resolver lock
        # hands the child that lock held, and the child's own getnameinfo (when it
        # connects) waits for ever. Seen under load as a rank stuck in connect_store.
        os.close(gate[1])
        os.read(gate[0], 1)
        os.close(gate[0])
    limit_worker_threads(start_method)
    rank = node_rank * num_processes + local_rank
    os.environ[ERROR_FILE_ENV] = os.path.join(errors, f"rank{rank}.json")
    set_worker_environment(
        local_rank=local_rank, node_rank=node_rank, num_processes=num_processes,
        world_size=world_size,
        rendezvous=rendezvous, rank0_serves=rank0_serves,
    )
    entry, args, kwargs = payload
    result = run_recording_errors(entry, args, kwargs)
    if rank == 0:
        # A file, not a pipe: the parent reads it after the workers exit, so a result
        # larger than a pipe buffer cannot block rank 0. Plain pickle copies tensor
        # data (torch's queue reducers would share it through this exiting process).
        path = Path(errors, "result.pkl")
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(result))
        tmp.replace(path)
