"""`XLALauncher`: torch_xla's multiprocessing, imported lazily."""

from __future__ import annotations

from typing import Any

from interlock.strategies.accelerators.xla import import_torch_xla
from interlock.strategies.launchers.base import Launcher, WorkerEntry


class XLALauncher(Launcher):
    """One process per XLA device through torch_xla's ``xmp.spawn``; rank 0's result."""

    name = "xla"

    def __init__(self, *, num_processes: int) -> None:
        self.num_processes = num_processes

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        import_torch_xla()
        import torch.multiprocessing as mp
        import torch_xla.distributed.xla_multiprocessing as xmp

        results = mp.get_context("fork").SimpleQueue()
        # nprocs=None lets torch_xla use every addressable device
        nprocs = None if self.num_processes > 1 else 1
        xmp.spawn(_xla_worker, args=(entry, args, kwargs, results), nprocs=nprocs,
                  start_method="fork")
        return results.get() if not results.empty() else None


def _xla_worker(index: int, entry: WorkerEntry, args: tuple[Any, ...], kwargs: dict[str, Any],
                results: Any) -> None:  # pragma: no cover - needs torch_xla
    result = entry(*args, **kwargs)
    if index == 0:
        results.put(result)
