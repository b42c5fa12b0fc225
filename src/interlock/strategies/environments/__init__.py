"""Cluster environments: where ranks, addresses and the job's geometry come from."""

from __future__ import annotations

from collections.abc import Mapping

from interlock.engine.tables import ClusterRow
from interlock.strategies.environments.base import ClusterEnvironment
from interlock.strategies.environments.external import ExternalLauncherEnvironment
from interlock.strategies.environments.hostlist import expand_hostlist, first_host
from interlock.strategies.environments.kubeflow import KubeflowEnvironment
from interlock.strategies.environments.local import LocalEnvironment
from interlock.strategies.environments.lsf import LSFEnvironment
from interlock.strategies.environments.mpi import MPIEnvironment
from interlock.strategies.environments.slurm import SLURMEnvironment
from interlock.strategies.environments.torchelastic import TorchElasticEnvironment
from interlock.strategies.environments.xla import XLAEnvironment


def environment_for(name: str | ClusterRow, environ: Mapping[str, str] | None = None
                    ) -> ClusterEnvironment:
    """The cluster environment for a cluster row (or a registered row's name: a
    Plan's ``cluster_environment``), reading ``environ`` (default ``os.environ``).

    Raises:
        ValueError: ``name`` is not a cluster name the engine knows.
    """
    from interlock.strategies.factories import part_class

    _, cls = part_class(ClusterRow, name, ClusterEnvironment)
    return cls(environ)


__all__ = [
    "ClusterEnvironment",
    "ExternalLauncherEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "environment_for",
    "expand_hostlist",
    "first_host",
]
