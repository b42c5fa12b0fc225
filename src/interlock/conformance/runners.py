"""The suite's runners: which accelerator each one runs strategies on, and whether
this machine has it.

A runner is named by the accelerator row that it exercises (``AcceleratorRow.runner``);
nothing here lists the runners again.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from types import MappingProxyType

from interlock.engine.tables import ACCELERATORS

#: runner name -> the accelerator it runs strategies on, in the accelerator table's order
RUNNERS: Mapping[str, str] = MappingProxyType(
    {row.runner: row.name for row in ACCELERATORS if row.runner is not None})


def runner_devices(runner: str) -> tuple[int, str | None]:
    """How many devices the runner has here, and why it cannot run when it has none."""
    if runner == "cpu":
        return 1 << 10, None  # processes, not devices, bound the CPU runner
    if runner == "cuda":
        import torch

        count = torch.cuda.device_count()
        return count, None if count else "this machine has no CUDA devices"
    if importlib.util.find_spec("torch_xla") is None:
        return 0, "torch_xla is not installed, so there is no TPU runner here"
    from interlock.engine.machine import Machine

    count = Machine.probe().xla_devices
    return count, None if count else "this machine has no XLA devices"


def available_runners() -> list[str]:
    """The runners this machine has, in table order."""
    return [r for r in RUNNERS if runner_devices(r)[1] is None]
