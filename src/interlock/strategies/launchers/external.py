"""`ExternalLauncher` and `InProcessLauncher`: processes already exist."""

from __future__ import annotations

from typing import Any

from interlock.strategies.launchers.base import Launcher, WorkerEntry, run_recording_errors


class ExternalLauncher(Launcher):
    """torchrun, srun, mpirun, jsrun or Kubeflow created this process: run in place."""

    name = "external"

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        # a child of interlock's script launcher also reports its traceback
        return run_recording_errors(entry, args, kwargs)
