"""`KubeflowEnvironment`: a Kubeflow PyTorchJob, one process per pod."""

from __future__ import annotations

from interlock.strategies.environments.torchelastic import TorchVariablesEnvironment


class KubeflowEnvironment(TorchVariablesEnvironment):
    """The PyTorchJob operator starts one process per pod.

    ``WORLD_SIZE`` counts pods and ``RANK`` is the pod's index, so a pod is a node:
    the global rank and the node rank are both ``RANK`` and the local rank is 0.
    ``MASTER_ADDR``/``MASTER_PORT`` point at the master pod's service.
    """

    name = "kubeflow"

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()
