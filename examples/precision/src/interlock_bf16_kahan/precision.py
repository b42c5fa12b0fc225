"""`KahanBF16Precision`: bfloat16 parameters and compute, compensated optimizer updates.

bfloat16 keeps 8 significant bits, so ``w + u`` rounds back to ``w`` whenever the update
``u`` is smaller than half a unit in the last place of ``w`` (``|u| < |w| * 2**-9``):
with a small learning rate most updates of a pure-bf16 model are lost. This precision
keeps, per parameter, the rounding error of its last update in a bfloat16
*compensation* buffer ``c`` (in the optimizer's state, so it travels with every
checkpoint of the optimizer), and steps the optimizer on ``w + c`` in float32:

    w32 = float32(w) + float32(c)      # the value the parameter stands for
    w32 = optimizer.step(w32)          # the update computed in float32
    w   = bfloat16(w32)                # round to nearest, what the model computes with
    c   = bfloat16(w32 - float32(w))   # what the rounding lost, carried to next step

Together ``w`` and ``c`` hold about 16 significant bits, so updates far below bf16's
resolution accumulate instead of vanishing. The forward and backward passes are those
of ``bf16-true``: the module, the inputs and the gradients are bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer

from interlock.strategies.precision import Precision, TruePrecision

#: the key of a parameter's compensation buffer in ``optimizer.state[param]``
COMPENSATION = "kahan_compensation"


class KahanBF16Precision(TruePrecision):
    """``bf16-true`` whose optimizer steps are Kahan-compensated.

    Only the optimizer step differs from ``bf16-true``: for each bfloat16 parameter
    the step runs in float32 on the parameter plus its compensation, with the
    gradient and the optimizer's state of that parameter widened to float32 for the
    step and narrowed back to bfloat16 afterwards (so the state at rest, and in a
    checkpoint, stays bfloat16 like the parameters, and the parameters keep their
    storage and dtype throughout).

    Args:
        precision: the canonical name it was built for (``"bf16-true-kahan"``).
    """

    dtype = torch.bfloat16

    def __init__(self, precision: str = "bf16-true-kahan") -> None:
        self.precision = precision

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        return cls(precision)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step ``optimizer`` in float32 on each bfloat16 parameter plus its
        compensation, then round the parameters back and keep what rounding lost.

        The optimizer steps float32 working copies that stand in for the parameters in
        its ``param_groups`` and ``state`` for the step; the parameters themselves are
        only written in place afterwards. (Changing a parameter's dtype instead, even
        for a moment, would drop the gradient hooks DistributedDataParallel put on it.)

        Raises:
            ValueError: a ``closure`` was given (it would run the model on the
                parameters while the optimizer holds the working copies; closure
                optimizers such as LBFGS are not supported).
        """
        closure: Callable[[], Any] | None = kwargs.get("closure")
        if closure is not None:
            raise ValueError(f"{self.precision}: optimizer.step(closure=...) is not "
                             "supported (the optimizer steps float32 working copies of "
                             "the parameters)")
        swapped: list[tuple[list[torch.Tensor], int, torch.Tensor, torch.Tensor]] = []
        try:
            for group in optimizer.param_groups:
                params: list[torch.Tensor] = group["params"]
                for index, param in enumerate(params):
                    if param.grad is None or param.dtype != self.dtype:
                        continue
                    working = _widen(param, optimizer.state.pop(param, {}), optimizer)
                    params[index] = working
                    swapped.append((params, index, param, working))
            return optimizer.step(**kwargs)
        finally:
            for params, index, param, working in swapped:
                params[index] = param
                _narrow(param, working, optimizer.state.pop(working, {}), optimizer,
                        self.dtype)


def _widen(param: torch.Tensor, state: dict[str, Any], optimizer: Optimizer
           ) -> torch.Tensor:
    """A float32 working copy of ``param`` plus its compensation, with the gradient and
    per-element optimizer state widened to float32 (registered in ``optimizer.state``)."""
    grad = param.grad
    if grad is None:  # the caller skips these
        raise ValueError("a parameter without a gradient has nothing to step")
    working = param.detach().float()
    compensation = state.get(COMPENSATION)
    if compensation is not None:
        working += compensation.float()
    working.requires_grad_(True)
    working.grad = grad.detach().float()
    optimizer.state[working] = {
        key: value.float() if _is_companion(key, value, param) else value
        for key, value in state.items()
    }
    return working


def _narrow(param: torch.Tensor, working: torch.Tensor, state: dict[str, Any],
            optimizer: Optimizer, dtype: torch.dtype) -> None:
    """Write the stepped working copy into ``param`` rounded to ``dtype``, keep the
    rounding error as its compensation, and give the narrowed state back to it."""
    stepped = working.detach()
    rounded = stepped.to(dtype)
    with torch.no_grad():
        param.copy_(rounded)
    narrowed = {key: value.to(dtype) if _is_companion(key, value, param) else value
                for key, value in state.items()}
    narrowed[COMPENSATION] = (stepped - rounded.float()).to(dtype)
    optimizer.state[param] = narrowed


def _is_companion(key: str, value: Any, param: torch.Tensor) -> bool:
    """Whether ``state[key]`` is a per-element buffer of ``param`` (momentum, Adam's
    moments), as opposed to a step count or the compensation itself."""
    return (key != COMPENSATION and isinstance(value, torch.Tensor)
            and value.is_floating_point() and value.shape == param.shape
            and value.dim() > 0)
