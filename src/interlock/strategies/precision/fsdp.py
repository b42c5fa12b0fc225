"""`FSDPPrecision`: every precision of a fully sharded (FSDP2) module.

FSDP2 keeps the sharded parameters in their stored dtype and casts the gathered copies
for compute according to a :class:`MixedPrecisionPolicy`. This plugin owns that
policy and delegates everything else (module casting, autocast, the optimizer step,
the loss scaler's bookkeeping) to the precision's own plugin, built from its row
(`plugin_from_row`), built-in or registered: the behaviour of a precision is written
once, and a registered precision whose row names ``fsdp`` runs here unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.optim import Optimizer

from interlock.engine.registry import registered
from interlock.engine.tables import PRECISION_ROWS, SHARDED_PRECISIONS, PrecisionRow
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.from_row import plugin_from_row
from interlock.strategies.precision.mixed import MixedPrecision


class FSDPPrecision(Precision):
    """The precision plugin of ``FSDPStrategy``.

    - ``32-true``: float32 throughout, no policy.
    - ``16-true`` / ``bf16-true``: the module is cast before sharding, so the shards,
      the compute and the gradient reductions are all in the half dtype.
    - ``16-mixed`` / ``bf16-mixed``: float32 shards; FSDP2 gathers them in the half
      dtype for compute (``param_dtype``) and reduces gradients in float32
      (``reduce_dtype``), and the forward runs under autocast. ``16-mixed`` scales the
      loss with a sharded grad scaler, which agrees on "skip this step" across ranks
      (each rank sees only its own gradient shards).
    - a registered precision: its own plugin, with the policy its row's dtypes call for
      (a compute dtype other than the parameters' gathers in the compute dtype and
      reduces in float32, as the mixed rows do; otherwise none).

    Args:
        precision: a built-in sharded precision (``SHARDED_PRECISIONS``) or a
            registered one, by its row or its name.
        device_type: the torch device type the model computes on.

    Raises:
        ValueError: a built-in precision FSDP2 does not run (``64-true``, Transformer
            Engine's), or a name no row declares.
    """

    def __init__(self, precision: str | PrecisionRow, device_type: str) -> None:
        name = precision.name if isinstance(precision, PrecisionRow) else precision
        if name in PRECISION_ROWS and name not in SHARDED_PRECISIONS:
            raise ValueError(
                f"FSDPPrecision(precision={name!r}): expected one of "
                f"{', '.join(map(repr, SHARDED_PRECISIONS))} or a registered precision"
            )
        self.precision = name
        self.device_type = device_type
        self._inner = plugin_from_row(precision, device_type)
        self._row = row = (precision if isinstance(precision, PrecisionRow)
                           else registered(PrecisionRow)[name])
        if row.scaler and isinstance(self._inner, MixedPrecision):
            self._inner.scaler = _sharded_scaler(device_type)
        self.mixed_precision_policy: MixedPrecisionPolicy | None = (
            MixedPrecisionPolicy(param_dtype=getattr(torch, row.compute_dtype),
                                 reduce_dtype=torch.float32)
            if row.compute_dtype != row.param_dtype else None
        )

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler (``16-mixed`` only)."""
        return self._inner.scaler if isinstance(self._inner, MixedPrecision) else None

    @property
    def inner(self) -> Precision:
        """The precision's own plugin, which this one delegates to."""
        return self._inner

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward pass computes in."""
        return getattr(torch, self._row.compute_dtype)  # type: ignore[no-any-return]

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype the sharded parameters are stored in."""
        return getattr(torch, self._row.param_dtype)  # type: ignore[no-any-return]

    def convert_module(self, module: nn.Module) -> nn.Module:
        return self._inner.convert_module(module)

    def convert_input(self, data: Any) -> Any:
        return self._inner.convert_input(data)

    def convert_output(self, data: Any) -> Any:
        return self._inner.convert_output(data)

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        with self._inner.forward_context():
            yield

    @contextlib.contextmanager
    def tensor_init_context(self) -> Iterator[None]:
        with self._inner.tensor_init_context():
            yield

    @contextlib.contextmanager
    def module_init_context(self) -> Iterator[None]:
        with self._inner.module_init_context():
            yield

    def backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any,
                 **kwargs: Any) -> None:
        self._inner.backward(tensor, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        return self._inner.optimizer_step(optimizer, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        self._inner.unscale_gradients(optimizer)

    def state_dict(self) -> dict[str, Any]:
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._inner.load_state_dict(state_dict)

    def teardown(self) -> None:
        self._inner.teardown()


def _sharded_scaler(device_type: str) -> torch.amp.GradScaler:
    # the sharded scaler all-reduces its found-inf flags over the default group, so
    # every rank skips (or takes) the same steps
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class OffloadSafeScaler(ShardedGradScaler):
        """torch's sharded scaler, except that the inverse scale reaches gradients on
        another device (the CPU, under FSDP's CPU offload) by a blocking copy.

        torch hands it over with ``non_blocking=True``: from a GPU to the CPU that is
        an asynchronous copy into pinned memory, which the CPU unscale kernel may read
        before it has landed. Measured on CUDA: fsdp_cpu_offload's 16-mixed parity
        failed in one suite run of three (up to 0.01 off after 3 steps)."""

        def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor,
                            found_inf: torch.Tensor, allow_fp16: bool = True
                            ) -> dict[torch.device, torch.Tensor]:
            grads: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]] = {}
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    if grad.is_sparse:  # torch's own handling (same device as the scale)
                        return super()._unscale_grads_(optimizer, inv_scale, found_inf,
                                                       allow_fp16)
                    if not allow_fp16 and grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    grads.setdefault(grad.device, {}).setdefault(grad.dtype, []).append(grad)
            flags: dict[torch.device, torch.Tensor] = {}
            with torch.no_grad():
                for device, by_dtype in grads.items():
                    here = (inv_scale if device == inv_scale.device
                            else inv_scale.to(device))  # blocking
                    flags[device] = (found_inf if device == found_inf.device
                                     else found_inf.to(device))
                    for same_dtype in by_dtype.values():
                        torch._amp_foreach_non_finite_check_and_unscale_(
                            same_dtype, flags[device], here)
            if not flags:
                flags[found_inf.device] = found_inf
            return flags

    return OffloadSafeScaler(device=device_type)
