"""`DeepSpeedPrecision`: precisions as DeepSpeed's engine implements them.

For ``*-true`` DeepSpeed casts the module, keeps float32 master weights in its
optimizer and (fp16) scales the loss itself, from the ``fp16``/``bf16`` config sections
that :func:`deepspeed_config` writes; for ``*-mixed`` the parameters stay float32 and the
engine runs the forward pass under torch's autocast (its ``torch_autocast`` section).
This plugin casts inputs and outputs around the engine and sets the default dtype in
the init contexts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from interlock.connector.tables import PRECISION_ROWS
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.utils import cast_floating, default_dtype

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
        row = PRECISION_ROWS[precision]
        #: the dtype the engine computes in (autocast's, for the mixed precisions)
        self.dtype: torch.dtype = getattr(torch, row.compute_dtype)
        #: the dtype parameters are stored in
        self.param_dtype: torch.dtype = getattr(torch, row.param_dtype)

    def convert_input(self, data: Any) -> Any:
        """Floating inputs in the parameters' dtype (autocast casts further)."""
        return cast_floating(data, self.param_dtype)

    @contextlib.contextmanager
    def tensor_init_context(self) -> Iterator[None]:
        """New floating tensors default to the parameters' dtype."""
        with default_dtype(self.param_dtype):
            yield

    @contextlib.contextmanager
    def module_init_context(self) -> Iterator[None]:
        with self.tensor_init_context():
            yield

    def convert_output(self, data: Any) -> Any:
        return cast_floating(data, torch.get_default_dtype())
