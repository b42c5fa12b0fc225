"""Rank functions and plain single-process baselines for the "correct by default" tests.

Every workload here has a baseline computed by one plain PyTorch process without
interlock; the tests compare the two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import workloads
from torch import nn

from interlock.strategies.base import Strategy

LR = 0.1


# ------------------------------------------------------------------ a model passed to launch


def train_given(strategy: Strategy, net: nn.Module, steps: int) -> dict[str, Any]:
    """Train the module ``launch`` handed over (not one built in the rank)."""
    shared = [n for n, p in net.named_parameters()
              if p.is_shared()]  # type: ignore[no-untyped-call]
    module = strategy.setup_module(net)
    opt = strategy.setup_optimizer(torch.optim.SGD(module.parameters(), lr=LR))
    for step in range(steps):
        x, y = workloads.batch(step)
        x, y = workloads.share(x, strategy), workloads.share(y, strategy)
        strategy.backward(nn.functional.mse_loss(module(x), y), module)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    return {"params": workloads.full(module.state_dict()), "shared_on_arrival": shared}


def plain_sgd(steps: int, net: nn.Module | None = None) -> dict[str, torch.Tensor]:
    net = net if net is not None else workloads.model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        x, y = workloads.batch(step)
        nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


# ------------------------------------------------------------------ schedulers


def train_with_scheduler(strategy: Strategy, steps: int) -> dict[str, Any]:
    net = workloads.model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    module, (stepped,) = strategy.setup_module_and_optimizers(net, [opt])
    for step in range(steps):
        x, y = workloads.batch(step)
        x, y = workloads.share(x, strategy), workloads.share(y, strategy)
        strategy.backward(nn.functional.mse_loss(module(x), y), module)
        strategy.optimizer_step(stepped)
        stepped.zero_grad()
        scheduler.step()
    return {"params": workloads.full(module.state_dict()), "same_object": stepped is opt,
            "lr": stepped.param_groups[0]["lr"]}


def plain_with_scheduler(steps: int) -> dict[str, Any]:
    net = workloads.model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    for step in range(steps):
        x, y = workloads.batch(step)
        nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
        scheduler.step()
    return {"params": {k: v.detach().clone() for k, v in net.state_dict().items()},
            "lr": opt.param_groups[0]["lr"]}


# ------------------------------------------------------------------ buffers under empty init


class Rotary(nn.Module):
    """A layer whose non-persistent buffer is computed in ``__init__`` (not in the
    state dict, so no checkpoint can restore it)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(workloads.FEATURES, workloads.FEATURES)
        self.register_buffer("freq", 1.0 / (10.0 ** (torch.arange(workloads.FEATURES) / 3)),
                             persistent=False)
        self.head = nn.Linear(workloads.FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cos(self.proj(x) * self.freq))  # type: ignore[no-any-return]


def empty_init_then_load(strategy: Strategy, path: str) -> dict[str, Any]:
    with strategy.module_init_context(empty_init=True):
        net = Rotary()
    module = strategy.setup_module(net)
    strategy.load_checkpoint(path, {"model": module})
    x, _ = workloads.batch(0)
    freq = workloads.full(module.module.freq)
    return {"out": workloads.full(module(x)), "freq": freq}


# ------------------------------------------------------------------ one starting point


def per_rank_seed_start(strategy: Strategy) -> dict[str, Any]:
    """Each rank seeds differently (as some frameworks do), then sets the model up."""
    torch.manual_seed(1000 + strategy.global_rank)
    net = nn.Sequential(nn.Linear(workloads.FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))
    module = strategy.setup_module(net)
    params = workloads.full(module.state_dict())
    return {"params": params, "everyone": strategy.collective.all_gather_object(params)}


def rank0_seed_model() -> dict[str, torch.Tensor]:
    torch.manual_seed(1000)
    net = nn.Sequential(nn.Linear(workloads.FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


# ------------------------------------------------------------------ uneven inputs


def uneven_steps(strategy: Strategy) -> str:
    """Rank 0 takes one step more than the others (an uneven last batch)."""
    module = strategy.setup_module(workloads.model())
    opt = strategy.setup_optimizer(torch.optim.SGD(module.parameters(), lr=LR))
    for step in range(3 if strategy.global_rank == 0 else 2):
        x, y = workloads.batch(step)
        strategy.backward(nn.functional.mse_loss(module(x), y), module)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    return "returned"


# ------------------------------------------------------------------ unused parameters


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(workloads.FEATURES, 4)
        self.unused = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))  # type: ignore[no-any-return]


def save_with_unused(strategy: Strategy, path: str) -> dict[str, Any]:
    torch.manual_seed(0)
    net = WithUnused()
    module, (opt,) = strategy.setup_module_and_optimizers(
        net, [torch.optim.Adam(net.parameters(), lr=1e-2)])
    x, y = workloads.batch(0)
    x, y = workloads.share(x, strategy), workloads.share(y, strategy)
    strategy.backward(nn.functional.mse_loss(module(x), y), module)
    strategy.optimizer_step(opt)
    strategy.save_checkpoint(path, {"model": module, "optimizer": opt})
    return {"params": workloads.full(module.state_dict()),
            "optimizer": workloads.full(opt.state_dict())}


def load_with_unused(strategy: Strategy, path: str) -> dict[str, Any]:
    torch.manual_seed(1)
    net = WithUnused()
    module, (opt,) = strategy.setup_module_and_optimizers(
        net, [torch.optim.Adam(net.parameters(), lr=1e-2)])
    strategy.load_checkpoint(path, {"model": module, "optimizer": opt})
    return {"params": workloads.full(module.state_dict()),
            "optimizer": workloads.full(opt.state_dict())}


def save_plain(path: Path, net: nn.Module) -> None:
    torch.save({"model": net.state_dict()}, path)


# ------------------------------------------------------------------ parameters under empty init


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(workloads.FEATURES, 8), nn.Tanh(), nn.Linear(8, 2))


def empty_init_values(strategy: Strategy) -> dict[str, Any]:
    """Every rank seeds alike, builds on the meta device, and lets setup initialise."""
    torch.manual_seed(7)
    with strategy.module_init_context(empty_init=True):
        net = _mlp()
    module = strategy.setup_module(net)
    return {"params": workloads.full(module.state_dict()), "after": torch.rand(3)}


def empty_init_reference() -> dict[str, Any]:
    """What one process gets: the seed rank 0 draws, then reset_parameters in order."""
    torch.manual_seed(7)
    with torch.random.fork_rng():
        seed = int(torch.randint(0, 2**62, ()).item())
        torch.manual_seed(seed)
        net = _mlp()
    # the caller's random state is untouched by setup
    return {"params": {k: v.detach().clone() for k, v in net.state_dict().items()},
            "after": torch.rand(3)}


def put_rank(strategy: Strategy, queue: Any, tensor: torch.Tensor) -> None:
    """Send (rank, whether the tensor arrived shared) through a multiprocessing queue."""
    queue.put((strategy.global_rank, bool(tensor.is_shared())))  # type: ignore[no-untyped-call]


def load_into_sgd(strategy: Strategy, path: str) -> str:
    """Load a checkpoint saved with Adam into SGD with momentum: must be refused."""
    net = WithUnused()
    module, (opt,) = strategy.setup_module_and_optimizers(
        net, [torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)])
    try:
        strategy.load_checkpoint(path, {"model": module, "optimizer": opt})
    except Exception as error:  # the refusal is the result
        return f"{type(error).__name__}: {error}"
    return "loaded"
