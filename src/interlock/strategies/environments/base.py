"""`ClusterEnvironment`: where ranks, addresses and the job's geometry come from."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from interlock.engine.runtime_queries import cluster_detected
from interlock.strategies.environments._variables import refuse_change


class ClusterEnvironment(ABC):
    """Ranks and the rendezvous address of the current process.

    ``name`` is the engine's cluster-table name (``"slurm"``, ``"torchelastic"``, ...);
    detection and geometry checks are the engine's rules, not a second copy.
    """

    #: lets the engine recognise instances without importing the runtime
    interlock_part_kind: ClassVar[str] = "cluster_environment"
    #: the marker's former name, deprecated since 0.2.0 (may be removed in 0.4.0)
    interlock_plugin_kind: ClassVar[str] = "cluster_environment"
    name: ClassVar[str]

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        # Read lazily from os.environ unless given: launchers set variables for children.
        self._environ = environ

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether something other than interlock started the processes."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Host of the rank-0 rendezvous store."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """Port of the rank-0 rendezvous store."""

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the environment (default ``os.environ``) is this cluster's: the
        detector of its row (`interlock.ClusterRow.detect`, which is what `plan()`
        asks), False when no row of this name is registered or it has no detector. A
        subclass need not override it; the row is the one place detection is written."""
        try:
            return cluster_detected(cls.name, os.environ if environ is None else environ)
        except KeyError:
            return False

    @abstractmethod
    def world_size(self) -> int:
        """Total number of processes."""

    def set_world_size(self, size: int) -> None:
        """Record the world size. By default only the value :meth:`world_size` already
        gives is accepted: the job's launcher owns it. An environment whose ranks can be
        assigned overrides this (`LocalEnvironment`); a subclass need not.

        Raises:
            ValueError: ``size`` differs from what the launcher decided.
        """
        refuse_change(self.name, "world size", self.world_size(), size)

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process among all processes."""

    def set_global_rank(self, rank: int) -> None:
        """Record the global rank; by default, as :meth:`set_world_size`, only the
        value :meth:`global_rank` already gives is accepted.

        Raises:
            ValueError: ``rank`` differs from what the launcher decided.
        """
        refuse_change(self.name, "global rank", self.global_rank(), rank)

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """Index of this process's node."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Refuse (``ResolutionError``, ``cluster-mismatch``) a job geometry that does not
        match ``num_devices`` per node x ``num_nodes``, before any collective."""
        from interlock.engine.runtime_queries import check_cluster_geometry

        check_cluster_geometry(self.name, num_devices, num_nodes, self.environ)

    def teardown(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Undo anything set up (environment variables this object exported)."""
