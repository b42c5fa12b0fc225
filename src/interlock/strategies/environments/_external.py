"""Behaviour shared by clusters whose own launcher starts the processes."""

from __future__ import annotations

from interlock.strategies.environments.base import ClusterEnvironment


class ExternalEnvironment(ClusterEnvironment):
    """A cluster whose launcher (torchrun, srun, jsrun, mpirun, ...) owns the ranks.

    The world size and global rank come from the launcher; setting them to the value
    they already have is accepted, any other value is refused.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True
