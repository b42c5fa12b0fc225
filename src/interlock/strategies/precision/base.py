"""`Precision`: how a strategy converts modules, inputs and outputs, and steps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer


class Precision:
    """Full single precision (``32-true``), and the base of every precision plugin.

    A strategy owns exactly one precision and calls it around every forward, backward
    and optimizer step. Subclasses override what differs.
    """

    #: lets the engine recognise instances without importing the runtime
    interlock_part_kind: ClassVar[str] = "precision"
    #: the marker's former name, deprecated since 0.2.0 (may be removed in 0.4.0)
    interlock_plugin_kind: ClassVar[str] = "precision"
    #: canonical precision name from the engine's table
    precision: str = "32-true"

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        """The plugin for a plan's ``precision`` on ``device_type``: how
        :func:`~interlock.strategies.precision.precision_for` builds the class a
        precision row's ``factory`` names. The default takes no arguments; classes whose
        constructor needs the name or the device type override it."""
        return cls()

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast or wrap the module's parameters for this precision."""
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors in a batch to the compute dtype."""
        return data

    def convert_output(self, data: Any) -> Any:
        """Cast floating-point tensors in a forward's output back for the caller."""
        return data

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """Context the forward pass runs in (autocast for mixed precision)."""
        yield

    @contextlib.contextmanager
    def tensor_init_context(self) -> Iterator[None]:
        """Context in which new tensors get this precision's default dtype."""
        yield

    @contextlib.contextmanager
    def module_init_context(self) -> Iterator[None]:
        """Context in which a module is built with this precision's dtype."""
        with self.tensor_init_context():
            yield

    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any,
                 **kwargs: Any) -> None:
        """Backpropagate ``tensor`` (scaled first, when a scaler is used)."""
        tensor.backward(*args, **kwargs)  # type: ignore[no-untyped-call]  # untyped in torch

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step the optimizer (through the scaler, which may skip the step)."""
        return optimizer.step(**kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling on the gradients (before clipping); no-op without a scaler."""

    def state_dict(self) -> dict[str, Any]:
        """State that must travel with checkpoints (the scaler's)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def teardown(self) -> None:
        """Release anything the precision set up."""
