"""`MixedPrecision`: ``16-mixed`` and ``bf16-mixed`` through ``torch.autocast``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from interlock.engine.tables import ACCELERATORS, PRECISIONS
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.utils import cast_floating, check_one_of

#: the precisions this plugin implements and the autocast dtype each one uses (read
#: from the engine's precision table)
MIXED_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {r.name: getattr(torch, r.compute_dtype) for r in PRECISIONS if r.plugin == "mixed"}
)
#: device types whose accelerator supports a mixed precision (the engine's table)
MIXED_DEVICE_TYPES: tuple[str, ...] = tuple(
    a.name for a in ACCELERATORS if a.precisions & set(MIXED_DTYPES)
)


class MixedPrecision(Precision):
    """Float32 parameters with the forward pass under ``torch.autocast``.

    ``16-mixed`` scales the loss with a :class:`torch.amp.GradScaler` on every device
    type, the CPU included (float16 autocast and the scaler both run there); it is
    never swapped for bfloat16. ``bf16-mixed`` needs no scaler.

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device_type: the torch device type the model runs on.
        scaler: a scaler to use for ``16-mixed``; a fresh one when None.

    Raises:
        ValueError: for an unknown precision or device type, or a scaler passed
            with ``bf16-mixed``.
    """

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        return cls(precision, device_type)

    def __init__(self, precision: str, device_type: str,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        check_one_of("MixedPrecision", "precision", precision, MIXED_DTYPES)
        check_one_of("MixedPrecision", "device_type", device_type, MIXED_DEVICE_TYPES)
        if precision == "bf16-mixed" and scaler is not None:
            raise ValueError(
                "MixedPrecision(precision='bf16-mixed') takes no scaler: bfloat16 has "
                "float32's exponent range, so there is nothing to scale"
            )
        self.precision = precision
        self.device_type = device_type
        self.dtype = MIXED_DTYPES[precision]
        self.scaler: torch.amp.GradScaler | None = scaler
        if precision == "16-mixed" and scaler is None:
            self.scaler = torch.amp.GradScaler(device_type)
        # optimizers whose gradients were unscaled since the scaler's last update
        self._unscaled: set[int] = set()
        # whether an optimizer stepped since the scaler's last update
        self._stepped = False

    def convert_output(self, data: Any) -> Any:
        """Cast floating tensors in the output to the caller's default dtype (float32)."""
        return cast_floating(data, torch.get_default_dtype())

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """Run the block under autocast to :attr:`dtype` on :attr:`device_type`."""
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any,
                 **kwargs: Any) -> None:
        """Backpropagate the loss, scaled first when there is a scaler."""
        if self.scaler is not None:
            self.update_scale()
            tensor = self.scaler.scale(tensor)
        super().backward(tensor, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step through the scaler (which skips the step on inf or NaN gradients).

        The scale is updated once per iteration, before the next backward (or when
        the state is read), not after each optimizer: with several optimizers an
        update in between would unscale the later ones with the wrong scale. The
        step's return value (None when skipped) is passed through.
        """
        if self.scaler is None:
            return optimizer.step(**kwargs)
        result = self.scaler.step(optimizer, **kwargs)
        self._stepped = True
        return result

    def update_scale(self) -> None:
        """Apply the pending scale update of the last iteration, if any."""
        if self.scaler is not None and self._stepped:
            self.scaler.update()
            self._unscaled.clear()
            self._stepped = False

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Unscale ``optimizer``'s gradients in place (before clipping).

        Calling it again before the next :meth:`optimizer_step` does nothing, so
        gradients are never unscaled twice; the step then skips its own unscale.
        """
        if self.scaler is None or id(optimizer) in self._unscaled:
            return
        self.scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state under ``"scaler"``; empty without a scaler."""
        if self.scaler is None:
            return {}
        self.update_scale()
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the scaler's state, if both the plugin and ``state_dict`` have one.

        A checkpoint from another precision (no ``"scaler"`` key) leaves the scaler
        as it is; a scaler state loaded into ``bf16-mixed`` has nothing to go to.
        """
        if self.scaler is not None and "scaler" in state_dict:
            # finish the iteration in flight first: torch's scaler forgets which
            # optimizers stepped or were unscaled only in update(), and would refuse
            # their next step; the loaded state then replaces the scale it computed
            self.update_scale()
            self.scaler.load_state_dict(state_dict["scaler"])
