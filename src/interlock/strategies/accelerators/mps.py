"""Apple silicon GPUs through Metal."""

from __future__ import annotations

from typing import ClassVar

import torch

from interlock.strategies.accelerators.base import Accelerator


class MPSAccelerator(Accelerator):
    """The one MPS device."""

    name: ClassVar[str] = "mps"

    @staticmethod
    def is_available() -> bool:
        return bool(torch.backends.mps.is_available())

    @staticmethod
    def auto_device_count() -> int:
        return 1 if MPSAccelerator.is_available() else 0
