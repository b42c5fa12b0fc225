"""Rank functions that combine features the way training scripts do: clipping with
accumulation under pipelines, tensor-parallel plans that leave a layer replicated
(module level, so spawned ranks can import them)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from workloads import batch, full, model, share

from interlock.strategies.base import Strategy


def _loss(accumulate: int) -> Any:
    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out.float(), target) / accumulate
    return loss_fn


def train_clipped(strategy: Strategy, steps: int, accumulate: int, max_norm: float,
                  last_size: int = 8) -> dict[str, Any]:
    """SGD with momentum, ``accumulate`` micro-steps per optimizer step through
    ``forward_backward`` (the first ones under ``no_backward_sync``), then
    ``clip_gradients_norm``; every rank's parameters merged and the norms returned.
    Each step's last micro-batch has ``last_size`` samples, the others 8."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    norms: list[float] = []
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro,
                         last_size if micro == accumulate - 1 else 8)
            with strategy.no_backward_sync(net, enabled=micro < accumulate - 1):
                strategy.forward_backward(net, share(x, strategy), share(y, strategy),
                                          _loss(accumulate))
        norms.append(float(strategy.clip_gradients_norm(net, opt, max_norm=max_norm)))
        strategy.optimizer_step(opt)
        opt.zero_grad()
    merged: dict[str, torch.Tensor] = {}
    for part in strategy.collective.all_gather_object(full(net.state_dict())):
        merged.update(part)
    return {"params": merged, "norms": norms}


def baseline_clipped(steps: int, accumulate: int, max_norm: float,
                     last_size: int = 8) -> dict[str, Any]:
    """`train_clipped` in one plain process on the whole batches (no interlock)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    norms: list[float] = []
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro,
                         last_size if micro == accumulate - 1 else 8)
            _loss(accumulate)(net(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
        opt.step()
        opt.zero_grad()
    return {"params": {k: v.detach().clone() for k, v in net.state_dict().items()},
            "norms": norms}


def tp_first_layer_only(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel for the first layer only (its output gathered): the head stays
    replicated, as a plan that leaves a layer out does; FSDP2 over ``dp_shard``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    if mesh["tp"].size() > 1:
        parallelize_module(module, mesh["tp"],
                           {"0": ColwiseParallel(output_layouts=Replicate())})
    if mesh["dp_shard"].size() > 1:
        fully_shard(module, mesh=mesh["dp_shard"])
    return module


def leave_as_is(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """A parallelize function that shards nothing."""
    return module


def tp_only(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel over ``tp`` and nothing over the data-parallel dimensions."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    parallelize_module(module, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return module


def hsdp(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """FSDP2 over the 2-D ``(dp_replicate, dp_shard)`` mesh."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(module, mesh=mesh["dp_replicate", "dp_shard"])
    return module
