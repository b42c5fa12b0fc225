"""NVIDIA (and ROCm) GPUs."""

from __future__ import annotations

from typing import ClassVar

import torch

from interlock.strategies.accelerators.base import Accelerator


class CUDAAccelerator(Accelerator):
    """CUDA devices; each process binds one."""

    name: ClassVar[str] = "cuda"

    @staticmethod
    def is_available() -> bool:
        # device_count() asks NVML first and does not initialise CUDA
        return torch.cuda.device_count() > 0

    @staticmethod
    def auto_device_count() -> int:
        return int(torch.cuda.device_count())

    def setup_device(self, device: torch.device) -> None:
        super().setup_device(device)
        torch.cuda.set_device(device)

    def teardown(self) -> None:
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()
