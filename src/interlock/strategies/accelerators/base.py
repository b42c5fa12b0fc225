"""`Accelerator`: one kind of device, owned by a strategy."""

from __future__ import annotations

from abc import ABC
from typing import ClassVar

import torch

from interlock.engine.deprecation import warn_deprecated
from interlock.engine.errors import ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.registry import current_parts
from interlock.engine.runtime_queries import place_devices
from interlock.engine.stages.accelerator import available_on


class Accelerator(ABC):
    """A device kind: device parsing and per-process device setup (what devices this
    machine has is the engine's :class:`~interlock.Machine`).

    ``name`` is the engine's accelerator name; device parsing runs the engine's
    devices rules so that flags mean the same here as in `interlock.plan()`.
    """

    #: lets the engine recognise instances without importing the runtime
    interlock_part_kind: ClassVar[str] = "accelerator"
    name: ClassVar[str]

    @classmethod
    def is_available(cls) -> bool:
        """Whether this machine has at least one such device, as ``plan()`` sees it.

        Deprecated since 0.2.0, and no longer for a subclass to implement: nothing
        reads it; the devices of a plan come from the engine's
        :class:`~interlock.Machine` (``Machine.probe()`` on this machine).
        """
        warn_deprecated(f"{cls.__qualname__}.is_available()", since="0.2.0",
                        replacement="interlock.Machine.probe(), which plan() reads")
        return _auto_devices(cls.name) > 0

    @classmethod
    def auto_device_count(cls) -> int:
        """How many devices ``devices="auto"`` uses on this machine, as ``plan()``
        decides it (0 without such a device).

        Deprecated since 0.2.0, and no longer for a subclass to implement: nothing
        reads it; ``interlock.plan(accelerator=..., devices="auto").devices`` is the
        engine's answer.
        """
        warn_deprecated(f"{cls.__qualname__}.auto_device_count()", since="0.2.0",
                        replacement='interlock.plan(devices="auto") and its devices')
        return _auto_devices(cls.name)

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


def _auto_devices(accelerator: str) -> int:
    """How many devices of ``accelerator`` the engine gives ``devices="auto"`` on this
    machine; 0 where it has none, or lacks a package the accelerator needs."""
    machine = Machine.probe()
    row = current_parts().accelerators.get(accelerator)
    if row is None or not available_on(row, machine):
        return 0
    try:
        return len(place_devices(accelerator, "auto", machine))
    except ResolutionError:
        return 0
