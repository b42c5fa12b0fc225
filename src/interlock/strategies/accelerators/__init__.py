"""Accelerators, by the engine's accelerator names."""

from __future__ import annotations

from interlock.engine.tables import AcceleratorRow
from interlock.strategies.accelerators.base import Accelerator
from interlock.strategies.accelerators.cpu import CPUAccelerator
from interlock.strategies.accelerators.cuda import CUDAAccelerator
from interlock.strategies.accelerators.mps import MPSAccelerator
from interlock.strategies.accelerators.xla import XLAAccelerator


def accelerator_for(name: str | AcceleratorRow) -> Accelerator:
    """The accelerator instance for an accelerator row (or a registered row's name):
    its ``factory`` class, made with no arguments.

    Raises:
        ValueError: no accelerator row has that name.
        TypeError: the row's factory is not an :class:`Accelerator` class.
    """
    from interlock.strategies.factories import part_class

    _, cls = part_class(AcceleratorRow, name, Accelerator)
    return cls()


__all__ = [
    "Accelerator",
    "CPUAccelerator",
    "CUDAAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "accelerator_for",
]
