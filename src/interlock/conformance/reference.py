"""The suite's fixed model, data and single-process reference computations.

Everything here is deterministic: every rank (and every world size) computes the same
reference, and each rank trains on its share of the same global batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from interlock.connector.tables import PRECISION_ROWS

FEATURES = 6
HIDDEN = 8
LR = 0.1
#: global batch size: divisible by every world size the suite uses (1, 2, 4, 8)
BATCH = 16


def model() -> nn.Module:
    """A small MLP, always initialised the same way."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def other_model() -> nn.Module:
    """The same architecture with different weights (a "fresh" model to load into)."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def buffer_values() -> torch.Tensor:
    """The value :func:`model_with_buffer` computes for its buffer in ``__init__``."""
    return torch.tensor(0.75)


class _ScaledTanh(nn.Module):
    """Tanh of the input times a non-persistent buffer (a scalar, so tensor-parallel
    splits of the activations still multiply by it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freq", buffer_values().to(torch.get_default_dtype()),
                             persistent=False)

    freq: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.freq)


def model_with_buffer() -> nn.Module:
    """:func:`model`'s shape, its activation scaled by a non-persistent buffer (not in
    the state dict: no checkpoint can restore it)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), _ScaledTanh(), nn.Linear(HIDDEN, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, 1, generator=g)


def tensor_parallel_plan(module: nn.Module, mesh: Any) -> nn.Module:
    """How the suite splits its MLP for strategies that take a ``parallelize_fn``:
    column-wise then row-wise over ``mesh["tensor_parallel"]``, and FSDP2 over
    ``mesh["data_parallel"]`` when it has more than one rank."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if mesh["tensor_parallel"].size() > 1:
        parallelize_module(module, mesh["tensor_parallel"],
                           {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mesh["data_parallel"].size() > 1:
        fully_shard(module, mesh=mesh["data_parallel"])
    return module


def activation_dtype(precision: str) -> torch.dtype:
    """The dtype a Linear layer's output has under ``precision``: the compute dtype,
    except for the Transformer Engine precisions, whose FP8 matrix products happen
    inside its layers, which return activations in the parameters' dtype (torch has
    no dtype named ``float8``)."""
    row = PRECISION_ROWS[precision]
    name = row.param_dtype if row.plugin == "transformer_engine" else row.compute_dtype
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"precision {precision!r}: {name!r} is not a torch dtype")
    return dtype


@contextlib.contextmanager
def _autocast(precision: str) -> Iterator[None]:
    row = PRECISION_ROWS[precision]
    if row.plugin == "mixed":
        with torch.autocast("cpu", dtype=getattr(torch, row.compute_dtype)):
            yield
    else:
        yield


def baseline(precision: str, steps: int, accumulate: int = 1) -> dict[str, torch.Tensor]:
    """K SGD steps in one plain process on the full batches, in ``precision`` the way a
    single device runs it (cast module for ``*-true``, autocast and a loss scaler for
    ``*-mixed``)."""
    row = PRECISION_ROWS[precision]
    net = model()
    if row.plugin in ("half", "double", "transformer_engine"):
        net = net.to(getattr(torch, row.param_dtype))
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu") if row.scaler else None
    dtype = next(net.parameters()).dtype
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro)
            with _autocast(precision):
                out = net(x.to(dtype))
            loss = nn.functional.mse_loss(out.float(), y) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()  # type: ignore[no-untyped-call]
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
    return {k: v.detach().float().clone() for k, v in net.state_dict().items()}


def gradient_norms(loss_factor: float = 1.0) -> list[torch.Tensor]:
    """The gradient norm of each Linear layer of :func:`model` after one float32
    backward of the (scaled) MSE loss on batch 0, in one plain process."""
    net = model()
    x, y = batch(0)
    (nn.functional.mse_loss(net(x), y) * loss_factor).backward()  # type: ignore[no-untyped-call]
    return [torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in layer.parameters()
                                                if p.grad is not None]))
            for layer in net.children() if isinstance(layer, nn.Linear)]


def tolerance(precision: str, extra: tuple[float, float] | None) -> dict[str, float]:
    """``assert_close`` tolerances for training parity in ``precision``: float32's own
    for ``32-true`` (and ``64-true``, compared in float32), a few half-precision ulps
    otherwise, widened by a strategy's declared ``parity_tolerance``."""
    if precision in ("32-true", "64-true"):
        rtol, atol = 1.3e-6, 1e-5
    elif PRECISION_ROWS[precision].plugin == "transformer_engine":
        # FP8 products against the half-precision baseline: a few FP8 ulps
        rtol, atol = 1.25e-1, 2.5e-2
    else:
        rtol, atol = 2e-2, 2e-3
    if extra is not None:
        rtol, atol = max(rtol, extra[0]), max(atol, extra[1])
    return {"rtol": rtol, "atol": atol}
