"""`SingleDeviceStrategy`: one process on one device."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from interlock.strategies.accelerators import Accelerator
from interlock.strategies.base import Strategy
from interlock.strategies.collectives import Collective, SingleDeviceCollective
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.precision import Precision

if TYPE_CHECKING:
    from interlock.strategies.parts import Parts


class SingleDeviceStrategy(Strategy):
    """Runs in the calling process on ``device``; collectives have identity semantics."""

    registry_name: ClassVar[str] = "single_device"

    def __init__(
        self,
        *,
        device: torch.device | str | None = None,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision,
                         checkpoint_io=checkpoint_io, cluster_environment=cluster_environment)
        self._device = torch.device(device) if device is not None else None
        if self._device is not None:
            self._given["devices"] = (str(self._device),)
        self._collective = SingleDeviceCollective()

    def _place(self, parts: Parts) -> None:
        if "devices" not in self._given:
            self._device = parts.parallel_devices[0]

    @property
    def root_device(self) -> torch.device:
        if self._device is None:
            raise RuntimeError("SingleDeviceStrategy has no device yet: pass device=, or "
                               "build it with interlock.resolve(strategy=<this instance>)")
        return self._device

    @property
    def collective(self) -> Collective:
        return self._collective

    def setup_environment(self) -> None:
        self.accelerator.setup_device(self.root_device)
