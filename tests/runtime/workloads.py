"""Functions that run inside launched ranks (module level, so spawn can import them)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from interlock.strategies.base import Strategy

FEATURES = 6


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))


def batch(step: int, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(size, FEATURES, generator=g), torch.randn(size, 1, generator=g)


def share(tensor: torch.Tensor, strategy: Strategy) -> torch.Tensor:
    """This rank's part of a global batch (ranks of one tensor-parallel group share it)."""
    return tensor.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]


def train(strategy: Strategy, steps: int, accumulate: int = 1) -> dict[str, torch.Tensor]:
    """K steps of SGD; each rank takes its shard of every global micro-batch."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro)
            x = share(x, strategy)
            y = share(y, strategy)
            with strategy.no_backward_sync(net, enabled=micro < accumulate - 1):
                loss = nn.functional.mse_loss(net(x).float(), y) / accumulate
                strategy.backward(loss, net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    params: dict[str, torch.Tensor] = full(net.state_dict())
    return params


def full(value: Any) -> Any:
    """``value`` with every DTensor (a sharded parameter) gathered into a plain tensor.

    A collective for sharded values: every rank must call it in the same order.
    """
    if isinstance(value, DTensor):
        return value.full_tensor().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(full(v) for v in value)
    return value


def baseline(steps: int, accumulate: int = 1) -> dict[str, torch.Tensor]:
    """The same training in one plain process on the full batches (no interlock)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro)
            loss = nn.functional.mse_loss(net(x), y) / accumulate
            loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def places(strategy: Strategy) -> dict[str, Any]:
    """What each rank believes about itself, gathered on every rank."""
    me = {
        "global_rank": strategy.global_rank,
        "local_rank": strategy.local_rank,
        "node_rank": strategy.node_rank,
        "world_size": strategy.world_size,
        "is_global_zero": strategy.is_global_zero,
        "device": str(strategy.root_device),
        "pid": os.getpid(),
    }
    return {"ranks": strategy.collective.all_gather_object(me)}


def fail_on(strategy: Strategy, rank: int, pid_dir: str) -> None:
    """Rank ``rank`` raises after a collective; the others wait in the next one."""
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    strategy.barrier()
    if strategy.global_rank == rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    strategy.barrier()
    time.sleep(60)


def never_arrives(strategy: Strategy, pid_dir: str) -> None:
    """Rank 1 never reaches the barrier the others wait in."""
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    if strategy.global_rank == 1:
        time.sleep(120)
    strategy.barrier()


def collectives(strategy: Strategy) -> dict[str, Any]:
    """Every collective on rank-dependent inputs; results are compared by the test."""
    r, w = strategy.global_rank, strategy.world_size
    c = strategy.collective
    f = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r
    i = torch.arange(4, dtype=torch.int64) * (r + 1)
    non_contiguous = f.t()
    scalar = torch.tensor(float(r + 1))
    stacked = torch.stack([torch.full((2,), float(10 * r + j)) for j in range(w)])
    out: dict[str, Any] = {}
    for op in ("sum", "mean", "max", "min"):
        out[f"all_reduce_{op}_float"] = c.all_reduce(f, op)
        out[f"all_reduce_{op}_int"] = c.all_reduce(i, op)
        out[f"all_reduce_{op}_scalar"] = c.all_reduce(scalar, op)
        out[f"all_reduce_{op}_noncontig"] = c.all_reduce(non_contiguous, op)
    out["input_untouched"] = torch.equal(f, torch.arange(6, dtype=torch.float32).reshape(2, 3)
                                         + 10 * r)
    out["all_gather"] = c.all_gather(f)
    out["all_gather_scalar"] = c.all_gather(scalar)
    out["all_gather_noncontig"] = c.all_gather(non_contiguous)
    out["broadcast"] = c.broadcast(f, src=1)
    out["reduce"] = c.reduce(f, dst=0, op="sum")
    out["gather"] = c.gather(f, dst=0)
    out["scatter"] = c.scatter(stacked, src=1)
    out["reduce_scatter"] = c.reduce_scatter(stacked, "sum")
    out["all_to_all"] = c.all_to_all(stacked)
    out["all_gather_object"] = c.all_gather_object({"rank": r})
    out["broadcast_object"] = c.broadcast_object({"from": r}, src=1)
    out["gather_object"] = c.gather_object(r * 2, dst=0)
    out["scatter_object"] = c.scatter_object([f"to{j}" for j in range(w)] if r == 0 else None)
    out["strategy_all_reduce_mean"] = strategy.all_reduce(f)
    out["strategy_broadcast_object"] = strategy.broadcast({"r": r}, src=1)
    out["all_true"] = strategy.reduce_boolean_decision(True)
    out["all_mixed"] = strategy.reduce_boolean_decision(r == 0)
    out["any_mixed"] = strategy.reduce_boolean_decision(r == 0, all=False)
    out["any_false"] = strategy.reduce_boolean_decision(False, all=False)
    strategy.barrier()
    # every rank's view, so the test can check all of them, not only rank 0's
    return {"ranks": c.all_gather_object(out)}


def checkpoint_round_trip(strategy: Strategy, path: str, steps: int) -> dict[str, Any]:
    """Train, save, train on; then load into fresh objects and compare."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))

    def step(k: int) -> None:
        x, y = batch(k)
        x = share(x, strategy)
        y = share(y, strategy)
        strategy.backward(nn.functional.mse_loss(net(x).float(), y), net)
        strategy.optimizer_step(opt)
        opt.zero_grad()

    for k in range(steps):
        step(k)
    saved_params = full(net.state_dict())
    saved_opt = full(opt.state_dict())  # copies: state_dict shares the live tensors
    saved_precision = strategy.precision.state_dict()
    strategy.save_checkpoint(path, {"model": net, "optimizer": opt, "epoch": 3, "tag": "x"})
    for k in range(steps, steps + 2):  # move away from the saved state
        step(k)

    fresh = strategy.setup_module(nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(),
                                                nn.Linear(8, 1)))
    fresh_opt = strategy.setup_optimizer(torch.optim.Adam(fresh.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_opt, "epoch": 0}
    rest = strategy.load_checkpoint(path, state)
    return {
        "params_equal": _same(saved_params, full(fresh.state_dict())),
        "optimizer_equal": _same(saved_opt, full(fresh_opt.state_dict())),
        "precision_state": saved_precision,
        "precision_state_after": strategy.precision.state_dict(),
        "epoch": state["epoch"],
        "rest": rest,
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def large_result(strategy: Strategy) -> torch.Tensor:
    """Bigger than any pipe buffer (4 MB)."""
    return torch.ones(1_000_000)
