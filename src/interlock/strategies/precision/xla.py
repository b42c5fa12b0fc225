"""`XLAPrecision`: 32-true, 16-true and bf16-true on XLA devices."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import Optimizer

from interlock.engine.tables import PRECISION_ROWS, XLA_PRECISIONS
from interlock.strategies.precision.half import HalfPrecision
from interlock.strategies.precision.true import TruePrecision
from interlock.strategies.precision.utils import check_one_of


class XLAPrecision(TruePrecision):
    """The module, inputs and compute in one dtype; each optimizer step ends the traced
    graph (``xm.mark_step``), so XLA compiles and runs one step at a time.

    Args:
        precision: one of ``XLA_PRECISIONS``.
    """

    def __init__(self, precision: str) -> None:
        check_one_of("XLAPrecision", "precision", precision, XLA_PRECISIONS)
        self.precision = precision
        self.dtype = (HalfPrecision(precision).dtype if PRECISION_ROWS[precision].plugin == "half"
                      else torch.float32)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        import torch_xla.core.xla_model as xm

        result = optimizer.step(**kwargs)
        xm.mark_step()
        return result
