"""`Accelerator`: one kind of device, owned by a strategy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from interlock.connector.machine import Machine
from interlock.connector.parts import place_devices


class Accelerator(ABC):
    """A device kind: availability, device parsing and per-process device setup.

    ``name`` is the engine's accelerator name; device parsing runs the engine's
    devices rules so that flags mean the same here as in `interlock.plan()`.
    """

    #: lets the engine recognise instances without importing the runtime
    interlock_part_kind: ClassVar[str] = "accelerator"
    name: ClassVar[str]

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this machine has at least one such device."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` uses on this machine."""

    def parse_devices(self, devices: object, machine: Machine | None = None) -> tuple[str, ...]:
        """Device strings of one node for a devices flag (the engine's rules).

        Raises:
            ResolutionError: invalid or unavailable devices.
        """
        return place_devices(self.name, devices, machine or Machine.probe())

    def get_parallel_devices(self, devices: object) -> list[torch.device]:
        """``torch.device`` objects for a devices flag."""
        return [torch.device(d) for d in self.parse_devices(devices)]

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current device."""
        if device.type != self.name:
            raise ValueError(f"{type(self).__name__} cannot set up a {device.type} device")

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Release per-process device state."""
