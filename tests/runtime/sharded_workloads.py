"""Rank functions for the sharded strategies (FSDP, model parallel)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from workloads import FEATURES, batch, full, model, share

from interlock.strategies.base import Strategy
from interlock.strategies.module_wrapper import unwrap


def fresh_model() -> nn.Module:
    """The workload's architecture with different (seeded) weights."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))


def _step(strategy: Strategy, net: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
    x, y = batch(k)
    x = share(x, strategy)
    y = share(y, strategy)
    strategy.backward(nn.functional.mse_loss(net(x).float(), y), net)
    strategy.optimizer_step(opt)
    opt.zero_grad()


def train_and_save(strategy: Strategy, path: str, steps: int) -> dict[str, Any]:
    """Train with Adam, save, and return the full saved state."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    for k in range(steps):
        _step(strategy, net, opt, k)
    strategy.save_checkpoint(path, {"model": net, "optimizer": opt, "step": steps})
    return {"params": full(net.state_dict()), "optimizer": full(opt.state_dict())}


def load_into_fresh(strategy: Strategy, path: str, empty_init: bool = False) -> dict[str, Any]:
    """Build a fresh model (optionally on the meta device), load ``path`` into it, and
    return the full loaded state, plus what the model looked like before loading."""
    with strategy.module_init_context(empty_init=empty_init):
        raw = fresh_model()
    built_on_meta = all(p.is_meta for p in raw.parameters())
    net = strategy.setup_module(raw)
    local_numel = {
        name: (p.to_local() if isinstance(p, DTensor) else p).numel()
        for name, p in unwrap(net).named_parameters()
    }
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": net, "optimizer": opt, "step": 0}
    rest = strategy.load_checkpoint(path, state)
    return {
        "params": full(net.state_dict()),
        "optimizer": full(opt.state_dict()),
        "step": state["step"],
        "rest": rest,
        "built_on_meta": built_on_meta,
        "local_numel": strategy.collective.all_gather_object(local_numel),
        "device": {str(p.device) for p in net.parameters()},
    }


def scaler_skips_together(strategy: Strategy) -> dict[str, Any]:
    """16-mixed: an inf in one rank's gradient shard only; every rank must skip."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    before = full(net.state_dict())
    x, y = batch(0)
    x = share(x, strategy)
    y = share(y, strategy)
    strategy.backward(nn.functional.mse_loss(net(x).float(), y), net)
    if strategy.global_rank == 1:
        grad = next(net.parameters()).grad
        assert grad is not None
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        local.view(-1)[0] = float("inf")
    strategy.optimizer_step(opt)
    opt.zero_grad()
    skipped = full(net.state_dict())
    scale_after_skip = strategy.precision.state_dict()["scaler"]["scale"]
    _step(strategy, net, opt, 1)  # recovers: the next step is taken
    return {
        "unchanged": all(torch.equal(before[k], skipped[k]) for k in before),
        "scale_before": 65536.0,
        "scale_after_skip": scale_after_skip,
        "moved_after": any(not torch.equal(before[k], v)
                           for k, v in full(net.state_dict()).items()),
    }


def dtypes(strategy: Strategy) -> dict[str, Any]:
    """Parameter (shard), activation and gradient dtypes under the strategy."""
    net = strategy.setup_module(model())
    seen: dict[str, torch.dtype] = {}

    def record(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        seen.setdefault("activation", output.dtype)

    hook = net.forward_module[0].register_forward_hook(record)  # type: ignore[index]
    x, _ = batch(0)
    out = net(share(x, strategy))
    hook.remove()
    strategy.backward(out.float().sum(), net)
    p = next(net.parameters())
    assert p.grad is not None
    return {"param": p.dtype, "activation": seen["activation"], "grad": p.grad.dtype,
            "output": out.dtype}


def clip_norm(strategy: Strategy) -> torch.Tensor:
    """The total gradient norm clip_gradients_norm reports (nothing clipped)."""
    net = strategy.setup_module(model())
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = batch(0)
    x = share(x, strategy)
    y = share(y, strategy)
    strategy.backward(nn.functional.mse_loss(net(x), y), net)
    return strategy.clip_gradients_norm(net, opt, max_norm=1e6).detach().clone()


def baseline_norm() -> torch.Tensor:
    net = model()
    x, y = batch(0)
    nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
    return torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=1e6)


# ------------------------------------------------------------------ parallelize functions


def tensor_parallel(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """The workload MLP split column-wise then row-wise over the tensor-parallel ranks."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    return parallelize_module(module, mesh["tensor_parallel"], plan)


def data_parallel(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """FSDP2 over the data-parallel ranks."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(module, mesh=mesh["data_parallel"])
    return module


def not_a_module(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    return None  # type: ignore[return-value]
