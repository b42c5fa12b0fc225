"""Accelerators, by the engine's accelerator names."""

from __future__ import annotations

from interlock.strategies.accelerators.base import Accelerator
from interlock.strategies.accelerators.cpu import CPUAccelerator
from interlock.strategies.accelerators.cuda import CUDAAccelerator
from interlock.strategies.accelerators.mps import MPSAccelerator
from interlock.strategies.accelerators.xla import XLAAccelerator

ACCELERATOR_CLASSES: dict[str, type[Accelerator]] = {
    cls.name: cls for cls in (CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator)
}


def accelerator_for(name: str) -> Accelerator:
    """The accelerator instance for an engine accelerator name."""
    try:
        return ACCELERATOR_CLASSES[name]()
    except KeyError:
        raise ValueError(
            f"no accelerator named {name!r}; known: {', '.join(ACCELERATOR_CLASSES)}"
        ) from None


__all__ = [
    "ACCELERATOR_CLASSES",
    "Accelerator",
    "CPUAccelerator",
    "CUDAAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "accelerator_for",
]
