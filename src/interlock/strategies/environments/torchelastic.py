"""`TorchElasticEnvironment`: processes started by ``torchrun`` (TorchElastic)."""

from __future__ import annotations

from interlock.strategies.environments._external import ExternalEnvironment
from interlock.strategies.environments._variables import read_int, read_port, read_str


class TorchVariablesEnvironment(ExternalEnvironment):
    """What every launcher that exports torch's standard variables shares: ranks
    from ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``, the store at ``MASTER_ADDR`` and
    ``MASTER_PORT``, detection by the cluster table row named ``name``. Subclasses
    say where the node rank comes from."""

    name = ""

    @property
    def main_address(self) -> str:
        return read_str(self.name, self.environ, "MASTER_ADDR")

    @property
    def main_port(self) -> int:
        return read_port(self.name, self.environ, "MASTER_PORT")

    def world_size(self) -> int:
        return read_int(self.name, self.environ, "WORLD_SIZE", minimum=1)

    def global_rank(self) -> int:
        return read_int(self.name, self.environ, "RANK")

    def local_rank(self) -> int:
        return read_int(self.name, self.environ, "LOCAL_RANK")


class TorchElasticEnvironment(TorchVariablesEnvironment):
    """Ranks from the variables torchrun exports to every worker.

    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK`` (the node's rank),
    ``MASTER_ADDR`` and ``MASTER_PORT``. After an elastic restart torchrun exports new
    values, which are read on every call.
    """

    name = "torchelastic"

    def node_rank(self) -> int:
        return read_int(self.name, self.environ, "GROUP_RANK")
