"""`CompressedDDPStrategy`: DDP with torch's fp16 compression communication hook.

Each gradient bucket is cast to float16, all-reduced, divided by the world size and
cast back, so every rank applies the same averaged gradient, rounded to float16.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from interlock.strategies.ddp import DDPStrategy


class CompressedDDPStrategy(DDPStrategy):
    """DistributedDataParallel whose gradient all-reduce travels in float16."""

    registry_name: ClassVar[str] = "ddp_fp16_compress"

    def wrap_module(self, module: nn.Module) -> nn.Module:
        ddp: Any = super().wrap_module(module)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        wrapped: nn.Module = ddp
        return wrapped
