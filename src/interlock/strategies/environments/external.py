"""`ExternalLauncherEnvironment`: processes started by a launcher that is none of the
named clusters (the ``deepspeed`` command, an in-house launcher) but exports torch's
standard variables."""

from __future__ import annotations

from interlock.engine.errors import ResolutionError
from interlock.engine.tables import CLUSTER_ROWS, EXTERNAL_NODE_RANK_VARIABLES
from interlock.strategies.environments._variables import read_int
from interlock.strategies.environments.torchelastic import TorchVariablesEnvironment

#: Variables that count the processes on this node: the cluster table's, read once.
LOCAL_SIZE_VARIABLES = CLUSTER_ROWS["external"].local_size_vars


class ExternalLauncherEnvironment(TorchVariablesEnvironment):
    """Ranks from ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``, exported to every process by the launcher that started it.

    The node rank is the first of ``GROUP_RANK``, ``NODE_RANK`` and ``CROSS_RANK`` that
    is set; without one it is ``RANK // LOCAL_WORLD_SIZE`` (or ``LOCAL_SIZE``), ranks
    being placed node by node. Without that either, a process whose rank equals its
    local rank is on node 0; elsewhere the node rank cannot be known.
    """

    name = "external"

    def node_rank(self) -> int:
        for name in EXTERNAL_NODE_RANK_VARIABLES:
            if name in self.environ:
                return read_int(self.name, self.environ, name)
        for name in LOCAL_SIZE_VARIABLES:
            if name in self.environ:
                return self.global_rank() // read_int(self.name, self.environ, name, minimum=1)
        if self.global_rank() == self.local_rank():
            return 0
        raise ResolutionError(
            "invalid-environment",
            flag="environment",
            value="GROUP_RANK (unset)",
            reason=f"the external environment cannot tell the node of rank "
            f"{self.global_rank()} (local rank {self.local_rank()}): export GROUP_RANK or "
            "NODE_RANK (the node's index), or LOCAL_WORLD_SIZE (processes per node).",
        )
