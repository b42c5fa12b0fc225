"""TPU cores (or other PJRT devices) through torch_xla, imported lazily."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from interlock.engine.tables import INSTALL_HINTS
from interlock.strategies.accelerators.base import Accelerator


def import_torch_xla() -> Any:
    """torch_xla's runtime module, or an ImportError with the install hint."""
    try:
        import torch_xla.runtime as xr
    except ImportError as exc:
        raise ImportError(
            f"the xla accelerator needs torch_xla: {INSTALL_HINTS['torch_xla']}"
        ) from exc
    return xr


class XLAAccelerator(Accelerator):
    """XLA devices; one process per device, placed by torch_xla."""

    name: ClassVar[str] = "xla"

    def setup_device(self, device: torch.device) -> None:
        # torch_xla binds each process to its device when the process starts
        super().setup_device(device)
