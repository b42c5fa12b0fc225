"""Launchers: how processes come into being."""

from __future__ import annotations

from typing import TYPE_CHECKING

from interlock.connector.tables import LAUNCHER_ROWS
from interlock.strategies.launchers import history
from interlock.strategies.launchers.base import Launcher, LaunchError, RankFailedError
from interlock.strategies.launchers.external import ExternalLauncher
from interlock.strategies.launchers.multiprocessing import MultiProcessingLauncher
from interlock.strategies.launchers.subprocess_script import SubprocessScriptLauncher
from interlock.strategies.launchers.xla import XLALauncher

if TYPE_CHECKING:
    from interlock.strategies.environments import ClusterEnvironment


def launcher_for(name: str | None, *, num_processes: int, num_nodes: int,
                 cluster: ClusterEnvironment) -> Launcher | None:
    """The launcher that a name of the launcher table (a Plan's ``launcher``) stands
    for, set up for ``num_processes`` per node on ``num_nodes`` nodes; None runs in the
    calling process.

    This makes the launcher the name says and decides nothing: the engine chose the
    name. The one thing it reads from the process is whether the script launcher
    started it: such a rank re-ran the script, and runs the launch it was started for
    whatever this copy of the script planned.

    Raises:
        ValueError: ``name`` is not in the launcher table.
    """
    if name is None:
        return None
    if name not in LAUNCHER_ROWS:
        raise ValueError(f"unknown launcher {name!r}; choose {', '.join(LAUNCHER_ROWS)}")
    if name in ("subprocess", "external") and history.is_script_child():
        return SubprocessScriptLauncher(num_processes=num_processes)
    if name == "external":
        return ExternalLauncher()
    if name == "xla":
        return XLALauncher(num_processes=num_processes)
    node_rank, address, port = cluster.node_rank(), cluster.main_address, cluster.main_port
    if name == "subprocess":
        return SubprocessScriptLauncher(num_processes=num_processes, node_rank=node_rank,
                                        num_nodes=num_nodes, main_address=address,
                                        main_port=port)
    return MultiProcessingLauncher(start_method=str(LAUNCHER_ROWS[name].start_method),
                                   num_processes=num_processes, node_rank=node_rank,
                                   num_nodes=num_nodes, main_address=address, main_port=port)


__all__ = [
    "ExternalLauncher",
    "LaunchError",
    "Launcher",
    "MultiProcessingLauncher",
    "RankFailedError",
    "SubprocessScriptLauncher",
    "XLALauncher",
    "launcher_for",
]
