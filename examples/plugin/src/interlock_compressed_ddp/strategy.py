"""`CompressedDDPStrategy`: DDP with torch's fp16 compression communication hook.

Each gradient bucket is cast to float16, all-reduced, divided by the world size and
cast back, so every rank applies the same averaged gradient, rounded to float16.
"""

from __future__ import annotations

from typing import ClassVar

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from interlock.strategies.ddp import DDPStrategy


class CompressedDDPStrategy(DDPStrategy):
    """DistributedDataParallel whose gradient all-reduce travels in float16."""

    registry_name: ClassVar[str] = "ddp_fp16_compress"

    def configure_ddp(self, ddp_module: DistributedDataParallel) -> None:
        # the fp16 hook keeps no state between steps: None stands for its state
        ddp_module.register_comm_hook(None, default_hooks.fp16_compress_hook)
