"""CPU processes."""

from __future__ import annotations

from typing import ClassVar

from interlock.strategies.accelerators.base import Accelerator


class CPUAccelerator(Accelerator):
    """The CPU: always available; devices are process counts."""

    name: ClassVar[str] = "cpu"
