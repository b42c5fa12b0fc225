"""`DeepSpeedPrecision`: precisions as DeepSpeed's engine implements them.

DeepSpeed casts the module, keeps float32 master weights and scales the loss itself
(its ``fp16``/``bf16`` config sections, which :func:`deepspeed_config` writes from the
precision name); this plugin only casts inputs and outputs around the engine.
"""

from __future__ import annotations

from typing import Any

import torch

from interlock.connector.tables import PRECISION_ROWS
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.utils import cast_floating

#: the precisions DeepSpeed implements
DEEPSPEED_PRECISIONS: tuple[str, ...] = (
    "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed",
)


class DeepSpeedPrecision(Precision):
    """Inputs in the engine's dtype, outputs back in the caller's.

    Args:
        precision: one of ``DEEPSPEED_PRECISIONS``.
    """

    def __init__(self, precision: str) -> None:
        if precision not in DEEPSPEED_PRECISIONS:
            raise ValueError(
                f"DeepSpeedPrecision(precision={precision!r}): expected one of "
                f"{', '.join(map(repr, DEEPSPEED_PRECISIONS))}"
            )
        self.precision = precision
        # the engine computes in the half dtype for both *-true and *-mixed
        self.dtype: torch.dtype = getattr(torch, PRECISION_ROWS[precision].compute_dtype)

    def convert_input(self, data: Any) -> Any:
        return cast_floating(data, self.dtype)

    def convert_output(self, data: Any) -> Any:
        return cast_floating(data, torch.get_default_dtype())
