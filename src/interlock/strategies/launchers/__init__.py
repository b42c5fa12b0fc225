"""Launchers: how processes come into being.

A launcher of another package derives from :class:`Launcher` and is registered with a
`interlock.LauncherRow` (see ``docs/architecture.md``). What such a launcher needs
from interlock is exported here: the variables a worker reads its place from
(:func:`set_worker_environment`, :data:`RENDEZVOUS_ENV`, :data:`ERROR_FILE_ENV`), a
rendezvous store bound to a port the kernel chose (:func:`host_store`,
:func:`release_store`), one intra-op thread per worker (:func:`limit_worker_threads`),
and naming the rank that failed first (:func:`failure_time`, :func:`root_cause`,
:class:`RankFailedError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interlock.engine.tables import LauncherRow
from interlock.strategies.factories import part_class, row_named
from interlock.strategies.launchers import history
from interlock.strategies.launchers.base import (
    ERROR_FILE_ENV,
    RENDEZVOUS_ENV,
    Launcher,
    LaunchError,
    RankFailedError,
    failure_time,
    limit_worker_threads,
    root_cause,
    set_worker_environment,
)
from interlock.strategies.launchers.external import ExternalLauncher
from interlock.strategies.launchers.multiprocessing import MultiProcessingLauncher
from interlock.strategies.launchers.rendezvous import host_store, release_store
from interlock.strategies.launchers.subprocess_script import SubprocessScriptLauncher
from interlock.strategies.launchers.xla import XLALauncher

if TYPE_CHECKING:
    from interlock.strategies.environments import ClusterEnvironment


def launcher_for(name: str | LauncherRow | None, *, num_processes: int, num_nodes: int,
                 cluster: ClusterEnvironment, device_type: str = "cpu") -> Launcher | None:
    """The launcher a launcher row (or a registered row's name: a Plan's ``launcher``)
    stands for, set up for ``num_processes`` per node on ``num_nodes`` nodes, each process on
    one device of ``device_type`` (``"cpu"``, ``"cuda"``: the launcher's
    :attr:`~Launcher.device_type`); None runs in the calling process.

    This makes the launcher the name says and decides nothing: the engine chose the
    name. The one thing it reads from the process is whether the script launcher
    started it: such a rank re-ran the script, and runs the launch it was started for
    whatever this copy of the script planned.

    Raises:
        ValueError: no launcher row (built-in or registered) has that name.
        TypeError: the row's factory is not a :class:`Launcher` class.
    """
    if name is None:
        return None
    # an unknown name is refused before anything else
    row = name if isinstance(name, LauncherRow) else row_named(LauncherRow, name)
    if row.name in ("subprocess", "external") and history.is_script_child():
        return SubprocessScriptLauncher(num_processes=num_processes)
    row, cls = part_class(LauncherRow, row, Launcher)
    launcher = cls.for_job(row, num_processes=num_processes, num_nodes=num_nodes,
                           cluster=cluster)
    launcher.device_type = device_type
    return launcher


__all__ = [
    "ERROR_FILE_ENV",
    "RENDEZVOUS_ENV",
    "ExternalLauncher",
    "LaunchError",
    "Launcher",
    "MultiProcessingLauncher",
    "RankFailedError",
    "SubprocessScriptLauncher",
    "XLALauncher",
    "failure_time",
    "host_store",
    "launcher_for",
    "limit_worker_threads",
    "release_store",
    "root_cause",
    "set_worker_environment",
]
