"""`KubeflowEnvironment`: a Kubeflow PyTorchJob, one process per pod."""

from __future__ import annotations

from interlock.strategies.environments._external import ExternalEnvironment
from interlock.strategies.environments._variables import read_int, read_port, read_str


class KubeflowEnvironment(ExternalEnvironment):
    """The PyTorchJob operator starts one process per pod.

    ``WORLD_SIZE`` counts pods and ``RANK`` is the pod's index, so a pod is a node:
    the global rank and the node rank are both ``RANK`` and the local rank is 0.
    ``MASTER_ADDR``/``MASTER_PORT`` point at the master pod's service.
    """

    name = "kubeflow"

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
        return 0

    def node_rank(self) -> int:
        return read_int(self.name, self.environ, "RANK")
