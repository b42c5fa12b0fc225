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


def dropout_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.Tanh(), nn.Linear(16, 1))


def train_with_dropout(strategy: Strategy, path: str, steps: int, save_at: int,
                       resume: bool) -> dict[str, torch.Tensor]:
    """Adam on a model with dropout, each rank's inputs jittered by Python's and numpy's
    generators; saves after step ``save_at``. With ``resume``, the ranks are seeded
    otherwise, load that checkpoint and train the remaining steps: the checkpoint's
    random state must make them draw what the undisturbed run drew."""
    import random

    import numpy

    import interlock

    interlock.seed_everything(99 if resume else 5, rank_offset=True)
    net = strategy.setup_module(dropout_model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": net, "optimizer": opt, "step": 0}
    if resume:
        strategy.load_checkpoint(path, state)
    for step in range(state["step"], steps):
        x, y = batch(step)
        x = share(x, strategy) + 0.01 * random.random() + 0.01 * float(numpy.random.rand())
        loss = nn.functional.mse_loss(net(x).float(), share(y, strategy))
        strategy.backward(loss, net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
        if step + 1 == save_at and not resume:
            state["step"] = save_at
            strategy.save_checkpoint(path, state)
    merged: dict[str, torch.Tensor] = {}
    params: dict[str, torch.Tensor] = full(net.state_dict())
    for part in strategy.collective.all_gather_object(params) if strategy.world_size > 1 \
            else [params]:
        merged.update(part)
    return merged


class TiedLM(nn.Module):
    """A language model's shape: the head shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 12, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.tanh(self.body(self.embed(tokens))))
        return out


def tokens(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(300 + step)
    return torch.randint(12, (8, 5), generator=g), torch.randint(12, (8, 5), generator=g)


def train_tied(strategy: Strategy, path: str, steps: int, save_at: int,
               resume: bool) -> dict[str, Any]:
    """AdamW on `TiedLM`; saves after ``save_at`` steps, or (``resume``) loads that
    checkpoint into a fresh model and trains the rest. Returns the parameters (merged)
    and the optimizer state's keys."""
    torch.manual_seed(0)
    net = strategy.setup_module(TiedLM())
    opt = strategy.setup_optimizer(torch.optim.AdamW(net.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": net, "optimizer": opt, "step": 0}
    if resume:
        strategy.load_checkpoint(path, state)
    for step in range(state["step"], steps):
        x, y = tokens(step)
        out = net(share(x, strategy))
        loss = nn.functional.cross_entropy(out.float().flatten(0, 1),
                                           share(y, strategy).flatten())
        strategy.backward(loss, net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
        if step + 1 == save_at and not resume:
            state["step"] = save_at
            strategy.save_checkpoint(path, state)
    from interlock.strategies.module_wrapper import unwrap

    inner = unwrap(net)
    return {"params": full(net.state_dict()),
            "tied_live": inner.get_submodule("head").weight
            is inner.get_submodule("embed").weight}


def baseline_tied(steps: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = TiedLM()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    for step in range(steps):
        x, y = tokens(step)
        nn.functional.cross_entropy(net(x).flatten(0, 1), y.flatten()).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
