"""NVIDIA (and ROCm) GPUs."""

from __future__ import annotations

from typing import ClassVar

import torch

from interlock.strategies.accelerators.base import Accelerator


class CUDAAccelerator(Accelerator):
    """CUDA devices; each process binds one."""

    name: ClassVar[str] = "cuda"

    def setup_device(self, device: torch.device) -> None:
        super().setup_device(device)
        torch.cuda.set_device(device)

    def teardown(self) -> None:
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()
