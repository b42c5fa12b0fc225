"""`DeepSpeedPrecision`: precisions as DeepSpeed's engine implements them.

For ``*-true`` DeepSpeed casts the module and keeps float32 master weights in its
optimizer, from the ``fp16``/``bf16`` config sections that :func:`deepspeed_config`
writes (``16-true`` with a static loss scale of 1: the precision has no scaler); for
``*-mixed`` the parameters stay float32 and the engine runs the forward pass under
torch's autocast (its ``torch_autocast`` section). This plugin casts inputs and outputs
around the engine, sets the default dtype in the init contexts and, for ``16-mixed``,
holds the dynamic loss scale (:class:`LossScale`) the strategy hands the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from interlock.engine.tables import PRECISION_ROWS, SHARDED_PRECISIONS
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.utils import cast_floating, check_one_of, default_dtype

#: the precisions DeepSpeed implements (the engine's sharded set)
DEEPSPEED_PRECISIONS: tuple[str, ...] = SHARDED_PRECISIONS


class LossScale:
    """A dynamic loss scale with :class:`torch.amp.GradScaler`'s rules and state keys.

    DeepSpeed's ZeRO optimizers take the scale from outside (``override_loss_scale``):
    they multiply the loss by it, divide the gradients by it and skip the step when
    the gradient norm is not finite. Whether a step was skipped is the engine's to
    say; :meth:`update` then halves the scale (skipped) or doubles it after
    ``growth_interval`` steps taken in a row, as GradScaler does.

    DeepSpeed's own ``torch_autocast`` GradScaler is not used: ZeRO skips an
    overflowing step before that scaler sees it, so its scale never backs off, and
    with optimizer offloading it unscales CPU gradients by a scale on the GPU.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = 0

    def update(self, *, skipped: bool) -> None:
        """The scale for the next step, after one that was ``skipped`` or taken."""
        if skipped:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's keys, so that checkpoints read alike."""
        return {"scale": self.scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval,
                "_growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.scale = float(state["scale"])
        self.growth_factor = float(state.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(state.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))
        self.growth_tracker = int(state.get("_growth_tracker", 0))


class DeepSpeedPrecision(Precision):
    """Inputs in the engine's dtype, outputs back in the caller's.

    Args:
        precision: one of ``DEEPSPEED_PRECISIONS``.
    """

    def __init__(self, precision: str) -> None:
        check_one_of("DeepSpeedPrecision", "precision", precision, DEEPSPEED_PRECISIONS)
        self.precision = precision
        row = PRECISION_ROWS[precision]
        #: the dtype the engine computes in (autocast's, for the mixed precisions)
        self.dtype: torch.dtype = getattr(torch, row.compute_dtype)
        #: the dtype parameters are stored in
        self.param_dtype: torch.dtype = getattr(torch, row.param_dtype)
        #: ``16-mixed``'s dynamic loss scale (the strategy applies it to the engine)
        self.loss_scale: LossScale | None = LossScale() if row.scaler else None

    def convert_input(self, data: Any) -> Any:
        """Floating inputs in the parameters' dtype (autocast casts further)."""
        return cast_floating(data, self.param_dtype)

    @contextlib.contextmanager
    def tensor_init_context(self) -> Iterator[None]:
        """New floating tensors default to the parameters' dtype."""
        with default_dtype(self.param_dtype):
            yield

    def convert_output(self, data: Any) -> Any:
        return cast_floating(data, torch.get_default_dtype())

    def state_dict(self) -> dict[str, Any]:
        """The loss scale's state under ``"scaler"`` (``16-mixed``); empty otherwise
        (the ``*-true`` precisions' DeepSpeed loss scaler is optimizer state)."""
        if self.loss_scale is None:
            return {}
        return {"scaler": self.loss_scale.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the loss scale; a state without ``"scaler"`` leaves it as it is."""
        if self.loss_scale is not None and "scaler" in state_dict:
            self.loss_scale.load_state_dict(state_dict["scaler"])
