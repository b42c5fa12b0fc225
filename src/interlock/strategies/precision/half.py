"""`HalfPrecision`: ``16-true`` and ``bf16-true``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from interlock.engine.tables import PRECISIONS
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.true import TruePrecision
from interlock.strategies.precision.utils import check_one_of

#: the precisions this plugin implements and the dtype each one uses (read from the
#: engine's precision table)
HALF_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {r.name: getattr(torch, r.param_dtype) for r in PRECISIONS if r.plugin == "half"}
)


class HalfPrecision(TruePrecision):
    """Half precision parameters, inputs and compute, with no gradient scaler.

    Args:
        precision: ``"16-true"`` (float16) or ``"bf16-true"`` (bfloat16).

    Raises:
        ValueError: for any other precision name.
    """

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        return cls(precision)

    def __init__(self, precision: str) -> None:
        check_one_of("HalfPrecision", "precision", precision, HALF_DTYPES)
        self.precision = precision
        self.dtype = HALF_DTYPES[precision]
