"""Functions run inside the ranks (module level, so the actors import them by name)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

FEATURES = 6


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))


def batch(step: int, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(size, FEATURES, generator=g), torch.randn(size, 1, generator=g)


def _full(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.full_tensor().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def train(strategy: Any, steps: int) -> dict[str, torch.Tensor]:
    """SGD with momentum; each rank takes its shard of every global batch."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    for step in range(steps):
        x, y = batch(step)
        x = x.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]
        y = y.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]
        strategy.backward(nn.functional.mse_loss(net(x), y), net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    return {k: _full(v) for k, v in net.state_dict().items()}


def baseline(steps: int) -> dict[str, torch.Tensor]:
    """The same training in one plain PyTorch process on the full batches."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step)
        nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def places(strategy: Any, pid_dir: str) -> list[dict[str, Any]]:
    """Every rank's place as the strategy and Ray see it, gathered on every rank."""
    import ray

    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    env = strategy.cluster_environment
    mine = {
        "rank": strategy.global_rank, "local": strategy.local_rank, "node": strategy.node_rank,
        "world": strategy.world_size, "nodes": env.num_nodes(), "env": env.name,
        "ray_node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
        "torch_rank": dist.get_rank(), "torch_world": dist.get_world_size(),
    }
    gathered: list[Any] = [None] * strategy.world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def fail_on(strategy: Any, rank: int, pid_dir: str) -> None:
    """Rank ``rank`` raises; the others wait in a collective it never joins."""
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    if strategy.global_rank == rank:
        time.sleep(0.5)
        raise ValueError(f"planned failure on rank {rank}")
    dist.barrier()


def die_on(strategy: Any, rank: int, pid_dir: str) -> None:
    """Rank ``rank``'s process is killed by SIGKILL; the others wait for it."""
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    if strategy.global_rank == rank:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def die_once(strategy: Any, marker: str) -> dict[str, Any]:
    """Rank 1 dies in the first attempt only; every attempt counts itself."""
    from interlock.strategies.restarts import restart_attempt

    attempt = restart_attempt()
    if strategy.global_rank == 1 and not Path(marker).exists():
        Path(marker).write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return {"attempt": attempt, "world": strategy.world_size}


def sleep_forever(strategy: Any, pid_dir: str) -> None:
    """Every rank records its pid, then waits until it is killed."""
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(1)
