"""`XLALauncher`: torch_xla's multiprocessing, imported lazily."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from interlock.strategies.accelerators.xla import import_torch_xla
from interlock.strategies.launchers.base import Launcher, LaunchError, WorkerEntry

_RESULT = "rank0.result"


class XLALauncher(Launcher):
    """One process per XLA device through torch_xla's ``xmp.spawn``; rank 0's result.

    torch_xla starts the processes itself (PJRT: every addressable device of the
    host), so the runtime must not have been started in the launching process.
    Rank 0's result travels back through a file.
    """

    name = "xla"

    def __init__(self, *, num_processes: int) -> None:
        self.num_processes = num_processes

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        import_torch_xla()
        import torch_xla.distributed.xla_multiprocessing as xmp

        # nprocs=None: one process per addressable device; 1: a single process
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


def _xla_worker(index: int, entry: WorkerEntry, args: tuple[Any, ...], kwargs: dict[str, Any],
                results: str) -> None:
    result = entry(*args, **kwargs)
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 0:
        temp = Path(results, f".{_RESULT}.{os.getpid()}")
        with temp.open("wb") as file:
            pickle.dump(result, file)
        temp.replace(Path(results, _RESULT))
