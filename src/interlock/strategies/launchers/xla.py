"""`XLALauncher`: torch_xla's multiprocessing, imported lazily."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.strategies.accelerators.xla import import_torch_xla
from interlock.strategies.launchers.base import Launcher, LaunchError, WorkerEntry

_RESULT = "rank0.result"

if TYPE_CHECKING:
    from interlock.engine.tables import LauncherRow
    from interlock.strategies.environments import ClusterEnvironment


class XLALauncher(Launcher):
    """One process per XLA device through torch_xla's ``xmp.spawn``; rank 0's result.

    torch_xla starts the processes itself (PJRT: every addressable device of the
    host), so the runtime must not have been started in the launching process.
    Rank 0's result travels back through a file, and the launching process's
    environment is left as it was (torch_xla's import and its single-process path
    write variables into it).
    """

    name = "xla"

    @classmethod
    def for_job(cls, row: LauncherRow, *, num_processes: int, num_nodes: int,
                cluster: ClusterEnvironment) -> Launcher:
        return cls(num_processes=num_processes)

    def __init__(self, *, num_processes: int) -> None:
        self.num_processes = num_processes

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        with torch_xla_environment() as xr:
            return self._launch(xr, entry, args, kwargs)

    def _launch(self, xr: Any, entry: WorkerEntry, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        refuse_cpu_collectives(str(xr.device_type() or ""), self.num_processes)
        if self.num_processes <= 1 and "MASTER_PORT" not in os.environ:
            # a one-process world still rendezvouses (the xla backend's store, on
            # torch_xla's fixed default port 12355 unless told otherwise): two such
            # launches on one host at once must not collide; restored afterwards
            os.environ["MASTER_PORT"] = str(_free_port())
        import torch_xla.distributed.xla_multiprocessing as xmp

        # nprocs=None: one process per addressable device; 1: a single process (this
        # one: torch_xla then runs the entry in the launching process)
        nprocs = None if self.num_processes > 1 else 1
        with tempfile.TemporaryDirectory(prefix="interlock-xla-") as results:
            try:
                xmp.spawn(_xla_worker, args=(entry, args, kwargs, results), nprocs=nprocs,
                          start_method="fork")
            except RuntimeError as error:
                raise LaunchError(f"torch_xla could not run the worker processes: {error}") \
                    from error
            path = Path(results, _RESULT)
            if not path.exists():
                raise LaunchError("the XLA worker processes ended without rank 0's result")
            with path.open("rb") as file:
                return pickle.load(file)


#: what importing torch_xla added to the environment (its logging and XLA flags, the
#: PJRT device it picked), set again for every launch; None until the first launch
_IMPORT_ENVIRONMENT: dict[str, str] | None = None


def _import_with_its_environment() -> Any:
    """torch_xla's runtime module, with the variables its import sets in place.

    A launch leaves the caller's environment as it found it, so what torch_xla set
    on import is removed afterwards, and put back here for the next launch (the
    import itself happens once).
    """
    global _IMPORT_ENVIRONMENT
    before = dict(os.environ)
    xr = import_torch_xla()
    if _IMPORT_ENVIRONMENT is None:
        _IMPORT_ENVIRONMENT = {k: v for k, v in os.environ.items() if before.get(k) != v}
    for key, value in _IMPORT_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    return xr


@contextlib.contextmanager
def torch_xla_environment() -> Iterator[Any]:
    """torch_xla's runtime module, with the variables its import sets in place for the
    block; afterwards the environment is what it was before the block."""
    caller = dict(os.environ)
    try:
        yield _import_with_its_environment()
    finally:
        _restore_environment(caller)


def _restore_environment(saved: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    os.environ.update({k: v for k, v in saved.items() if os.environ.get(k) != v})


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def refuse_cpu_collectives(device_type: str, num_processes: int) -> None:
    """Refuse a launch of several ranks on torch_xla's CPU PJRT client.

    That client runs no collective across devices: several processes each form a
    world of one (it has no distributed runtime), and several devices in one process
    (``CPU_NUM_DEVICES``) abort in XLA's rendezvous on the first all-reduce
    (pytorch/xla#9089; ``tools/xla_cpu_multiprocess_repro.py`` reproduces both).
    Failing here says so instead of a hung, then aborted, worker pool.
    """
    if num_processes <= 1 or device_type.upper().split("_")[0] != "CPU":
        return
    raise LaunchError(
        f"cannot run {num_processes} XLA ranks on torch_xla's CPU PJRT device "
        "(PJRT_DEVICE=CPU): its CPU client runs no collective across devices, neither "
        "between processes nor between the CPU_NUM_DEVICES devices of one process "
        "(pytorch/xla#9089). Use strategy='single_xla' with devices=1 there, or run "
        "on TPU devices."
    )


def _xla_worker(index: int, entry: WorkerEntry, args: tuple[Any, ...], kwargs: dict[str, Any],
                results: str) -> None:
    result = entry(*args, **kwargs)
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 0:
        temp = Path(results, f".{_RESULT}.{os.getpid()}")
        with temp.open("wb") as file:
            pickle.dump(result, file)
        temp.replace(Path(results, _RESULT))
