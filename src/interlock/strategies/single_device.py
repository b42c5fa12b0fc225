"""`SingleDeviceStrategy`: one process on one device."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from interlock.strategies.accelerators import Accelerator
from interlock.strategies.base import Strategy
from interlock.strategies.collectives import Collective, SingleDeviceCollective
from interlock.strategies.environments import ClusterEnvironment, LocalEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.parts import parts_from_plan
from interlock.strategies.precision import Precision

if TYPE_CHECKING:
    from interlock.connector.planner import Plan


class SingleDeviceStrategy(Strategy):
    """Runs in the calling process on ``device``; collectives have identity semantics."""

    registry_name: ClassVar[str] = "single_device"

    def __init__(
        self,
        *,
        device: torch.device | str,
        accelerator: Accelerator,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision,
                         checkpoint_io=checkpoint_io)
        self._device = torch.device(device)
        self._cluster = cluster_environment if cluster_environment is not None else (
            LocalEnvironment()
        )
        self._collective = SingleDeviceCollective()

    @classmethod
    def from_plan(cls, plan: Plan) -> SingleDeviceStrategy:
        parts = parts_from_plan(plan)
        return cls(device=plan.parallel_devices[0], **parts)

    @property
    def root_device(self) -> torch.device:
        return self._device

    @property
    def cluster_environment(self) -> ClusterEnvironment:
        return self._cluster

    @property
    def collective(self) -> Collective:
        return self._collective

    def setup_environment(self) -> None:
        self.accelerator.setup_device(self._device)
