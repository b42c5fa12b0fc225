"""`TruePrecision`: parameters, inputs and compute all in one dtype (no autocast)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.utils import cast_floating, default_dtype


class TruePrecision(Precision):
    """Shared behaviour of the ``*-true`` precisions other than ``32-true``.

    The module and floating inputs are cast to :attr:`dtype`, which is also torch's
    default dtype during the forward pass and inside the init contexts. Floating
    outputs go back to the caller's default dtype (float32 unless the caller changed
    it), so a loss against float32 targets works unchanged.
    """

    #: the dtype parameters and compute use
    dtype: torch.dtype = torch.float32

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the module's parameters and buffers to :attr:`dtype`."""
        return module.to(dtype=self.dtype)

    def convert_input(self, data: Any) -> Any:
        """Cast floating tensors in the batch to :attr:`dtype`."""
        return cast_floating(data, self.dtype)

    def convert_output(self, data: Any) -> Any:
        """Cast floating tensors in the output to the caller's default dtype."""
        return cast_floating(data, torch.get_default_dtype())

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """Tensors created during the forward pass default to :attr:`dtype`."""
        with default_dtype(self.dtype):
            yield

    @contextlib.contextmanager
    def tensor_init_context(self) -> Iterator[None]:
        """New floating tensors default to :attr:`dtype`; restored on exit."""
        with default_dtype(self.dtype):
            yield
