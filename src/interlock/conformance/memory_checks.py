"""The memory check: what a rank holds after a real optimizer step, against what its
plan says (`interlock.Plan.memory`).

Every rank sets up an MLP large enough that a few bytes of bookkeeping do not matter
(about 263,000 parameters), takes one AdamW step and measures the bytes of the storages
behind its own parameter, gradient and optimizer-state tensors (local shards only,
each storage once: a shard padded by FSDP counts padded, gradients that are views
into one buffer count that buffer). The largest rank must match the plan's
``model_state_bytes`` within `TOLERANCE`, and no rank may hold more; what the strategy
allocates itself, where it can be observed (DDP's gradient buckets, the parameters
FSDP gathers), must stay within the plan's ``buffer_bytes``. A strategy declaring
``engine_gradients`` keeps gradients and float32 master weights in buffers of its own
(DeepSpeed's ZeRO): its parameters and optimizer state are compared, without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from interlock.conformance import reference
from interlock.conformance.checks import CheckFailed, Expect, RankContext
from interlock.strategies.module_wrapper import unwrap

#: how far the largest rank's bytes may be from the plan's (alignment padding of flat
#: buffers, a step counter per group instead of per tensor)
TOLERANCE = 0.02
#: the check's model: in, hidden and out features (each weight over 100,000 elements:
#: ZeRO-3 keeps smaller tensors whole on every rank, its persistence threshold; an odd
#: output size, so that FSDP pads the last layer's shards, while tensor parallel, which
#: splits the hidden size, splits evenly as DTensor's matmuls need)
IN, HIDDEN, OUT = 512, 256, 511
#: the optimizer the plan is asked about, and the check steps
OPTIMIZER = "adamw"


def memory_model() -> nn.Module:
    """The check's MLP, always initialised the same way (its layers named as the
    suite's tensor-parallel plan expects)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


class _Storages:
    """Bytes of distinct storages, each counted the first time it is seen."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()

    def bytes(self, tensors: Iterable[Any]) -> int:
        total = 0
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            if isinstance(tensor, DTensor):
                tensor = tensor.to_local()
            partition = getattr(tensor, "ds_tensor", None)  # DeepSpeed ZeRO-3's own shard
            if isinstance(partition, torch.Tensor) and tensor.numel() == 0:
                tensor = partition
            try:
                storage = tensor.untyped_storage()
                key, size = (str(tensor.device), storage.data_ptr()), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # a device without storages (XLA)
                key, size = (str(tensor.device), id(tensor)), tensor.numel() * tensor.element_size()
            if size and key not in self.seen:
                self.seen.add(key)
                total += size
        return total


def _optimizers(optimizer: Any) -> list[Any]:
    """``optimizer`` and the optimizers it wraps (``.optimizer``, as most wrappers keep
    theirs)."""
    found: list[Any] = []
    while optimizer is not None and len(found) < 8:
        found.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return found


def _state_tensors(value: Any) -> Iterable[Any]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _state_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _state_tensors(item)


def held_bytes(module: nn.Module, optimizer: Any) -> dict[str, int]:
    """The bytes of the storages behind this rank's parameters, gradients and optimizer
    state, each storage once: ``state`` is the tensors in ``optimizer.state``, ``masters``
    the optimizer's own parameters that are not the module's (float32 master copies),
    ``optimizer`` the two together."""
    storages = _Storages()
    # the set-up module's: the user's module inside it may hold none (torch_xla's FSDP)
    params = list(dict.fromkeys(module.parameters()))
    held = {"parameters": storages.bytes(params),
            "gradients": storages.bytes(p.grad for p in params if p.grad is not None)}
    own = {id(p) for p in params}
    held["masters"] = held["state"] = 0
    for level in _optimizers(optimizer):
        groups = getattr(level, "param_groups", None) or []
        held["masters"] += storages.bytes(p for g in groups for p in g.get("params", [])
                                          if id(p) not in own)
        held["state"] += storages.bytes(_state_tensors(dict(getattr(level, "state", {}))))
    held["optimizer"] = held["masters"] + held["state"]
    return held


def observed_buffers(module: nn.Module) -> tuple[int, str] | None:
    """What the strategy allocated itself, where it can be observed: DDP's gradient
    buckets (as DDP reports them), or the parameters an FSDP2 root gathers (measured
    by gathering them once). None: nothing observable."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    for sub in module.modules():
        if isinstance(sub, DistributedDataParallel):
            data = sub._get_ddp_logging_data()  # type: ignore[no-untyped-call]
            sizes = str(data.get("bucket_sizes", ""))
            total = sum(int(s) for s in sizes.split(",") if s.strip().isdigit())
            return total, "DDP's gradient buckets"
    root = unwrap(module)
    if isinstance(root, FSDPModule):
        root.unshard()
        try:
            gathered = _Storages().bytes(p for p in root.parameters()
                                         if not isinstance(p, DTensor))
        finally:
            root.reshard()
        return gathered, "the parameters FSDP gathers"
    return None


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = output.float().sub(target).pow(2).mean()
    return loss


def measure(strategy: Any, *, engine: bool) -> dict[str, Any]:
    """In every rank: the check's MLP set up with AdamW, one step through
    ``forward_backward`` (pipelines included) and the optimizer, then what this rank
    holds, what its plan says, and what the strategy allocated where it can be seen.
    ``engine``: the strategy declares ``engine_gradients`` (its gradients and master
    weights are not compared)."""
    from interlock import model_shape, plan

    base = strategy.plan
    if base is None:
        raise CheckFailed("the strategy has no plan: the suite resolves every strategy "
                          "through interlock.resolve")
    net = memory_model()
    shape = model_shape(net, units=(), tensor_parallel=(
        reference.MLP_TENSOR_PARALLEL if int(base.parallelism.tp) > 1 else None))
    # the machine's memory is left out: the check compares, it does not refuse
    planned = plan(accelerator=base.accelerator, devices=base.devices,
                   strategy=base.strategy, precision=base.precision,
                   num_nodes=base.num_nodes, parallelism=base.parallelism,
                   machine=dataclasses.replace(base.machine, device_memory=None,
                                               host_memory=None),
                   model=shape, optimizer=OPTIMIZER)
    estimate = planned.memory
    assert estimate is not None  # planned with model=
    plain: torch.optim.Optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    module, (opt,) = strategy.setup_module_and_optimizers(net, [plain])
    torch.manual_seed(1 + strategy.global_rank)
    x, y = strategy.batch_to_device((torch.randn(BATCH, IN), torch.zeros(BATCH, OUT)))
    strategy.forward_backward(module, x, y, _loss)
    strategy.optimizer_step(opt)  # gradients are kept: a loop frees them after the step
    held = held_bytes(module, opt)
    observed = observed_buffers(module)
    opt.zero_grad()
    counted = ("parameters", "state") if engine else ("parameters", "gradients", "optimizer")
    # an engine's gradients and float32 master copies live in buffers of its own, which
    # no public attribute shows: its parameters and optimizer state are compared
    expected = (estimate.parameter_bytes + estimate.optimizer_state_bytes
                - estimate.master_bytes if engine else estimate.model_state_bytes)
    return {"rank": strategy.global_rank, "held": held,
            "total": sum(held[k] for k in counted), "expected": expected,
            "estimate": estimate.to_dict(), "observed": observed}


#: samples each rank steps on (divisible by the micro-batches a pipeline cuts it into)
BATCH = 8


def memory_problems(measured: list[dict[str, Any]], *, engine: bool, what: str) -> list[str]:
    """Where the ranks' measurements (`measure`) and their plan disagree."""
    expected = measured[0]["expected"]
    estimate = measured[0]["estimate"]
    largest = max(m["total"] for m in measured)
    kind = ("parameters and optimizer state (the engine keeps gradients and master "
            "weights in buffers of its own)" if engine else "model state")
    per_rank = ", ".join(f"rank {m['rank']} {m['total']:,} ({m['held']})" for m in measured)
    problems = []
    if abs(largest - expected) > TOLERANCE * expected:
        problems.append(
            f"{what}: the largest rank holds {largest:,} bytes of {kind}; the plan says "
            f"{expected:,} ({estimate['rank']}; parameters {estimate['parameter_bytes']:,}, "
            f"gradients {estimate['gradient_bytes']:,}, optimizer "
            f"{estimate['optimizer_state_bytes']:,}), more than {TOLERANCE:.0%} apart. "
            f"Held: {per_rank}")
    for m in measured:
        if m["observed"] is not None and m["observed"][0] > estimate["buffer_bytes"]:
            size, seen = m["observed"]
            problems.append(f"{what}: {seen} take {size:,} bytes on rank {m['rank']}, "
                            f"beyond the plan's strategy buffers of "
                            f"{estimate['buffer_bytes']:,}")
    return problems


def check_memory(ctx: RankContext) -> None:
    """Run for every precision (see the module docstring)."""
    e = Expect()
    engine = "engine_gradients" in ctx.spec.capabilities
    mine = measure(ctx.strategy, engine=engine)
    everyone = ctx.strategy.collective.all_gather_object(mine)
    for problem in memory_problems(everyone, engine=engine, what=ctx.precision):
        e(False, problem)
    e.done()
