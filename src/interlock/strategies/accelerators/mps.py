"""Apple silicon GPUs through Metal."""

from __future__ import annotations

from typing import ClassVar

from interlock.strategies.accelerators.base import Accelerator


class MPSAccelerator(Accelerator):
    """The one MPS device."""

    name: ClassVar[str] = "mps"
