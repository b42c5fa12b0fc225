"""`DoublePrecision`: ``64-true``."""

from __future__ import annotations

from typing import Any

import torch

from interlock.strategies.precision.true import TruePrecision


class DoublePrecision(TruePrecision):
    """Double precision parameters, inputs, compute and outputs (``64-true``).

    Unlike the half precisions, outputs stay in float64: casting them to float32
    would give the loss, and every gradient computed from it, float32 rounding, and
    training would be only as accurate as ``32-true``. Cast the output yourself if
    you want float32.
    """

    precision = "64-true"
    dtype = torch.float64

    def convert_output(self, data: Any) -> Any:
        """Leave the (float64) output as the forward pass produced it."""
        return data
