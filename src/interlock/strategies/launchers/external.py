"""`ExternalLauncher` and `InProcessLauncher`: processes already exist."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interlock.strategies.launchers.base import Launcher, WorkerEntry, run_recording_errors

if TYPE_CHECKING:
    from interlock.engine.tables import LauncherRow
    from interlock.strategies.environments import ClusterEnvironment


class ExternalLauncher(Launcher):
    """torchrun, srun, mpirun, jsrun or Kubeflow created this process: run in place."""

    name = "external"

    @classmethod
    def for_job(cls, row: LauncherRow, *, num_processes: int, num_nodes: int,
                cluster: ClusterEnvironment) -> Launcher:
        return cls()

    def launch(self, entry: WorkerEntry, *args: Any, **kwargs: Any) -> Any:
        # a child of interlock's script launcher also reports its traceback
        return run_recording_errors(entry, args, kwargs)
