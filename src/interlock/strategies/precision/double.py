"""`DoublePrecision`: ``64-true``."""

from __future__ import annotations

import torch

from interlock.strategies.precision.true import TruePrecision


class DoublePrecision(TruePrecision):
    """Double precision parameters, inputs and compute (``64-true``)."""

    precision = "64-true"
    dtype = torch.float64
