"""`LocalEnvironment`: a plain machine where interlock's own launchers start the processes."""

from __future__ import annotations

from collections.abc import Mapping

from interlock.engine.tables import RENDEZVOUS_VARIABLE
from interlock.strategies.environments._variables import read_int, read_port
from interlock.strategies.environments.base import ClusterEnvironment


class LocalEnvironment(ClusterEnvironment):
    """No cluster: one process, or children started by interlock's launchers.

    A child started by interlock's launchers (``INTERLOCK_RENDEZVOUS`` is set) finds its
    place in ``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``; each is optional (defaults 0, 0, 1, ``"127.0.0.1"``).
    :meth:`set_world_size` and :meth:`set_global_rank` override what the environment
    says. Without an override the global rank is ``RANK`` when set, else the local rank
    on node 0; on other nodes it cannot be known from these variables, and asking for it
    is an error.

    ``main_port`` is ``MASTER_PORT`` when set, else 0: the launcher picks a free port
    and exports it to the processes it starts.
    """

    name = "local"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(environ)
        self._world_size: int | None = None
        self._global_rank: int | None = None

    @property
    def creates_processes_externally(self) -> bool:
        # A child of interlock's own launchers: they export LOCAL_RANK together with the
        # rendezvous address. LOCAL_RANK alone may come from any launcher or scheduler.
        return "LOCAL_RANK" in self.environ and RENDEZVOUS_VARIABLE in self.environ

    @property
    def main_address(self) -> str:
        address = self.environ.get("MASTER_ADDR", "").strip()
        return address or "127.0.0.1"

    @property
    def main_port(self) -> int:
        return read_port(self.name, self.environ, "MASTER_PORT", default=0)

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> bool:
        """Always true: the local environment is what remains when nothing else matches."""
        return True

    def world_size(self) -> int:
        if self._world_size is not None:
            return self._world_size
        return read_int(self.name, self.environ, "WORLD_SIZE", default=1, minimum=1)

    def set_world_size(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the world size must be >= 1, got {size}")
        self._world_size = size

    def global_rank(self) -> int:
        if self._global_rank is not None:
            return self._global_rank
        if "RANK" in self.environ:
            return read_int(self.name, self.environ, "RANK")
        node, local = self.node_rank(), self.local_rank()
        if node == 0:
            return local  # node 0 holds ranks 0..n-1 in local-rank order
        raise RuntimeError(
            f"the local environment cannot tell the global rank of local rank {local} on "
            f"node {node}: the processes per node are unknown. Call "
            "set_global_rank(node_rank * processes_per_node + local_rank) or export RANK."
        )

    def set_global_rank(self, rank: int) -> None:
        if rank < 0:
            raise ValueError(f"the global rank must be >= 0, got {rank}")
        self._global_rank = rank

    def local_rank(self) -> int:
        return read_int(self.name, self.environ, "LOCAL_RANK", default=0)

    def node_rank(self) -> int:
        return read_int(self.name, self.environ, "NODE_RANK", default=0)
