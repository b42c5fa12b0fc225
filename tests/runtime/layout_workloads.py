"""Rank functions and parallelize functions for the N-D layouts (module level, so
spawned ranks can import them)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from workloads import batch, full, model, share

from interlock.engine.parallelism import DIMS, FLATTENED
from interlock.strategies.base import Strategy
from interlock.strategies.parallel import ParallelStrategy


def fsdp_tp(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel over ``tp`` (column-wise then row-wise), then FSDP2 over
    ``dp_shard``: the order torch's 2-D parallelism needs."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if mesh["tp"].size() > 1:
        parallelize_module(module, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mesh["dp_shard"].size() > 1:
        fully_shard(module, mesh=mesh["dp_shard"])
    return module


def shard_stage(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """FSDP2 over ``dp_shard`` (a pipeline stage's layers, under pp > 1)."""
    from torch.distributed.fsdp import fully_shard

    if mesh["dp_shard"].size() > 1:
        fully_shard(module, mesh=mesh["dp_shard"])
    return module


def _merged(strategy: Strategy, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every rank's entries together (a pipeline's stages hold different layers)."""
    merged: dict[str, torch.Tensor] = {}
    for part in strategy.collective.all_gather_object(values):
        merged.update(part)
    return merged


def where_am_i(strategy: ParallelStrategy) -> dict[str, Any]:
    """This rank's coordinates as the device mesh reports them, and its data shard."""
    mesh = strategy.meshes
    return {
        "rank": strategy.global_rank,
        "coords": {dim: mesh[dim].get_local_rank() for dim in DIMS},
        "flattened": {name: (mesh[name].get_local_rank(), mesh[name].size())
                      for name in FLATTENED},
        "data": (strategy.data_parallel_rank, strategy.data_parallel_size),
    }


def train_layout(strategy: ParallelStrategy, steps: int) -> dict[str, Any]:
    """SGD with momentum through ``forward_backward`` (the one training step every
    layout, pipelines included, runs); each data-parallel rank takes its shard."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    losses = []
    for step in range(steps):
        x, y = batch(step)
        loss = strategy.forward_backward(
            net, share(x, strategy), share(y, strategy),
            lambda out, target: nn.functional.mse_loss(out.float(), target))
        losses.append(float(strategy.all_reduce(loss, reduce_op="mean")))
        strategy.optimizer_step(opt)
        opt.zero_grad()
    return {
        "params": _merged(strategy, full(net.state_dict())),
        "losses": losses,
        "layout": strategy.collective.all_gather_object(where_am_i(strategy)),
    }


def train_and_save_layout(strategy: ParallelStrategy, path: str,
                          steps: int) -> dict[str, Any]:
    """`train_layout` with Adam, then a checkpoint; returns the saved parameters."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    for step in range(steps):
        x, y = batch(step)
        strategy.forward_backward(net, share(x, strategy), share(y, strategy),
                                  lambda out, target: nn.functional.mse_loss(out.float(),
                                                                             target))
        strategy.optimizer_step(opt)
        opt.zero_grad()
    strategy.save_checkpoint(path, {"model": net, "optimizer": opt, "step": steps})
    return {"params": _merged(strategy, full(net.state_dict()))}


def load_layout(strategy: Strategy, path: str) -> dict[str, Any]:
    """A fresh model loads ``path``; returns its parameters, every rank's merged."""
    torch.manual_seed(1234)
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": net, "optimizer": opt, "step": 0}
    strategy.load_checkpoint(path, state)
    params = full(net.state_dict())
    merged = _merged(strategy, params) if strategy.world_size > 1 else params
    return {"params": merged, "step": state["step"]}


def misuse_pipeline(strategy: ParallelStrategy, path: str) -> dict[str, str]:
    """What a pipeline says to a plain forward call and to a full checkpoint file."""
    from interlock.strategies.io.errors import CheckpointLoadError

    net = strategy.setup_module(model())
    said: dict[str, str] = {}
    try:
        net(batch(0)[0])
    except RuntimeError as error:
        said["forward"] = str(error)
    try:
        strategy.load_checkpoint(path, {"model": net})
    except CheckpointLoadError as error:
        said["load"] = str(error)
    return said


def train_reference(strategy: ParallelStrategy, steps: int) -> dict[str, torch.Tensor]:
    """The conformance suite's model, batches and optimizer, through
    ``forward_backward`` in the strategy's precision; every rank's parameters merged,
    as float32."""
    from interlock.conformance import reference

    # the loss scale the reference starts from, as the suite's checks do
    strategy.precision.load_state_dict(
        reference.with_parity_scale(strategy.precision.state_dict()))
    net = strategy.setup_module(reference.model())
    opt = strategy.setup_optimizer(
        torch.optim.SGD(net.parameters(), lr=reference.LR, momentum=0.9))
    for step in range(steps):
        x, y = reference.batch(step)
        x, y = strategy.batch_to_device((share(x, strategy), share(y, strategy)))
        strategy.forward_backward(
            net, x, y, lambda out, target: nn.functional.mse_loss(out.float(), target))
        strategy.optimizer_step(opt)
        opt.zero_grad()
    return _merged(strategy, {k: v.float() for k, v in full(net.state_dict()).items()})
