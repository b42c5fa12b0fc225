"""Full checkpoints: one file, written by rank 0 in the layout a DDP or single-device
run writes. An unsharded strategy writes and reads it as its ranks hold it
(`save_unsharded`, `load_unsharded`); a sharded one gathers it from the shards on save
and scatters it into them on load (`save_full`, `load_full`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from interlock.strategies.checkpointing.fit import describe_misfits, misfits, refuse_misfits
from interlock.strategies.checkpointing.rollback import restoring
from interlock.strategies.checkpointing.state import (
    SavingStrategy,
    StateKeys,
    add_state_keys,
    missing_entries,
    optimizer_owners,
    optimizer_state_by_index,
    optimizer_state_by_name,
    pipeline_stages,
    restore_plain,
    runtime_entries,
    saved_state_keys,
)
from interlock.strategies.io import CheckpointLoadError
from interlock.strategies.io.base import load_with
from interlock.strategies.module_wrapper import unwrap

#: gather full tensors onto rank 0's CPU (other ranks get empty dicts)
_FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
#: load full tensors that only rank 0 holds: broadcast, then each rank keeps its shard
_FULL_FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
#: optimizer state may lack parameters that never had a gradient (unused in forward):
#: torch's own Optimizer.load_state_dict accepts that, so the sharded loads do too
#: (the saved and current parameter groups are still matched name by name)
_OPTIMIZER_FULL_FROM_RANK0 = StateDictOptions(full_state_dict=True,
                                              broadcast_from_rank0=True, strict=False)


def save_unsharded(strategy: SavingStrategy, path: str | Path,
                   state: Mapping[str, Any]) -> None:
    """Every rank holds everything: rank 0 writes one file (atomically, through the
    checkpoint IO); every rank waits for it."""
    checkpoint = {name: unwrap(value).state_dict() if isinstance(value, nn.Module)
                  else value.state_dict() if isinstance(value, Optimizer) else value
                  for name, value in state.items()}
    checkpoint.update(runtime_entries(strategy))
    if strategy.is_global_zero:
        strategy.checkpoint_io.save_checkpoint(checkpoint, path)
    strategy.barrier()


def load_unsharded(strategy: SavingStrategy, path: str | Path, state: dict[str, Any],
                   *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
    """Read a full checkpoint on every rank into modules that are not sharded.

    Refused with :class:`CheckpointLoadError` before anything changes when the file is
    damaged, lacks an entry or does not fit the modules and optimizers (keys, shapes,
    dtypes); a restore that fails half-way is rolled back.
    """
    checkpoint = load_with(strategy.checkpoint_io, path, map_location="cpu",
                           weights_only=weights_only, verify=verify)
    problem = missing_entries(path, checkpoint, state)
    if problem is not None:
        raise CheckpointLoadError(str(path), problem)
    refuse_misfits(path, state, checkpoint)
    with restoring(strategy, path, state):
        for name, target in state.items():
            if isinstance(target, nn.Module):
                unwrap(target).load_state_dict(checkpoint[name])
        for name, target in state.items():
            if isinstance(target, Optimizer):
                target.load_state_dict(checkpoint[name])
        return restore_plain(strategy, state, {
            k: v for k, v in checkpoint.items()
            if not isinstance(state.get(k), (nn.Module, Optimizer))})


def save_full(strategy: SavingStrategy, path: str | Path, state: Mapping[str, Any]) -> None:
    """Gather sharded state to rank 0 and write one file there (a collective)."""
    owners = optimizer_owners(state)
    checkpoint: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            checkpoint[name] = get_model_state_dict(unwrap(value), options=_FULL_ON_RANK0)
        elif isinstance(value, Optimizer):
            checkpoint[name] = optimizer_state_by_index(
                get_optimizer_state_dict(owners[name], value, options=_FULL_ON_RANK0)
            )
        else:
            checkpoint[name] = value
    checkpoint.update(runtime_entries(strategy))
    if strategy.is_global_zero:
        strategy.checkpoint_io.save_checkpoint(checkpoint, path)
    strategy.barrier()


def load_full(strategy: SavingStrategy, path: str | Path, state: dict[str, Any],
              *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
    """Read a full checkpoint on rank 0 and scatter it into sharded modules (a collective).

    Every rank raises the same :class:`CheckpointLoadError` when rank 0 cannot use the
    file (damaged, or not fitting the modules and optimizers: keys, shapes, dtypes),
    before anything is restored.
    """
    stages = pipeline_stages(strategy)
    if stages > 1:
        raise CheckpointLoadError(
            str(path), f"{str(path)!r} is one full file, but under pipeline parallel "
            f"(pp={stages}) each stage holds only its own layers and loads a distributed "
            "checkpoint directory: save it with a strategy that writes one (fsdp with "
            "state_dict_type='sharded', model_parallel), or load it under a layout "
            "without pp"
        )
    owners = optimizer_owners(state)
    checkpoint: dict[str, Any] = {}
    problem: str | None = None
    not_found = False
    wanted: dict[str, StateKeys] = {}
    if strategy.is_global_zero:
        try:
            checkpoint = load_with(strategy.checkpoint_io, path, map_location="cpu",
                                   weights_only=weights_only, verify=verify)
            problem = missing_entries(path, checkpoint, state)
            if problem is None:
                # checked here, before rank 0's verdict goes out: a mismatch found
                # later on rank 0 alone would leave the others in the scatter
                problem = describe_misfits(path, misfits(state, checkpoint))
            for name, target in state.items():
                if problem is None and isinstance(target, Optimizer):
                    wanted[name] = saved_state_keys(
                        optimizer_state_by_name(checkpoint[name], target, owners[name]))
        except FileNotFoundError as error:
            problem, not_found = str(error), True
        except CheckpointLoadError as error:
            problem = str(error)
    # rank 0's verdict and the small values go to every rank first: all raise or none
    sharded = {n for n, v in state.items() if isinstance(v, (nn.Module, Optimizer))}
    # Optimizer state without per-parameter tensors (plain SGD) is small: it travels in
    # the header, since torch's sharded loader needs a tensor to find the device.
    small = {n: checkpoint[n] for n, v in state.items()
             if isinstance(v, Optimizer) and n in checkpoint and not _has_tensors(checkpoint[n])}
    header = (problem, not_found, small,
              {k: v for k, v in checkpoint.items() if k not in sharded}, wanted)
    problem, not_found, small, rest, wanted = strategy.broadcast(header)
    if not_found:
        raise FileNotFoundError(problem)
    if problem is not None:
        raise CheckpointLoadError(str(path), problem)
    with restoring(strategy, path, state):
        for name, target in state.items():
            if isinstance(target, nn.Module):
                set_model_state_dict(unwrap(target), checkpoint.get(name, {}),
                                     options=_FULL_FROM_RANK0)
        for name, target in state.items():
            if isinstance(target, Optimizer) and name in small:
                target.load_state_dict(small[name])
            elif isinstance(target, Optimizer):
                add_state_keys(target, owners[name], wanted.get(name, {}))
                by_name = (
                    optimizer_state_by_name(checkpoint[name], target, owners[name])
                    if strategy.is_global_zero else {}
                )
                set_optimizer_state_dict(owners[name], target, by_name,
                                         options=_OPTIMIZER_FULL_FROM_RANK0)
        return restore_plain(strategy, state, rest)


def _has_tensors(optimizer_state: dict[str, Any]) -> bool:
    return any(
        isinstance(v, torch.Tensor) and v.dim() > 0
        for per_param in optimizer_state.get("state", {}).values()
        for v in per_param.values()
    )
