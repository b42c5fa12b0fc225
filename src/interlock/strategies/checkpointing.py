"""Checkpoints of sharded modules: full files and distributed (directory) checkpoints.

Two formats, both loadable by every strategy:

- **full**: one file, written by rank 0 with the strategy's checkpoint IO, in exactly
  the layout a DDP or single-device run writes (module state dicts keyed like the
  unwrapped module's, optimizer state dicts keyed by parameter index). Sharded
  parameters are gathered to rank 0 on the CPU first; loading reads the file on rank 0
  and broadcasts each tensor while it is scattered into the shards.
- **distributed**: a directory written by ``torch.distributed.checkpoint`` (every rank
  writes its own shards) plus ``interlock.pt`` for plain values and the precision's
  state. It can be loaded at another world size or by an unsharded strategy: each rank
  reads the slices it needs.

A save never leaves a half-written checkpoint under the final name: files are written
atomically by the checkpoint IO, and a directory is written under a staging name and
moved into place once every rank has finished.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from interlock.strategies.io import CheckpointLoadError
from interlock.strategies.module_wrapper import unwrap

if TYPE_CHECKING:
    from interlock.strategies.base import Strategy

#: checkpoint key under which the precision's state (the grad scaler's) travels
PRECISION_KEY = "interlock/precision"
#: the file in a distributed checkpoint directory that holds the plain values
PLAIN_FILE = "interlock.pt"
_STAGING_SUFFIX = ".interlock-staging"
_OLD_SUFFIX = ".interlock-old"

#: gather full tensors onto rank 0's CPU (other ranks get empty dicts)
_FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
#: load full tensors that only rank 0 holds: broadcast, then each rank keeps its shard
_FULL_FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
#: optimizer state may lack parameters that never had a gradient (unused in forward):
#: torch's own Optimizer.load_state_dict accepts that, so the sharded loads do too
#: (the saved and current parameter groups are still matched name by name)
_OPTIMIZER_FULL_FROM_RANK0 = StateDictOptions(full_state_dict=True,
                                              broadcast_from_rank0=True, strict=False)
_OPTIMIZER_SHARDED = StateDictOptions(strict=False)


def save(strategy: Strategy, path: str | Path, state: Mapping[str, Any],
         *, distributed: bool) -> None:
    """A sharded strategy's save: a distributed directory, or one full file."""
    (save_distributed if distributed else save_full)(strategy, path, state)


def load(strategy: Strategy, path: str | Path, state: dict[str, Any],
         *, weights_only: bool = True) -> dict[str, Any]:
    """A sharded strategy's load: a distributed directory (any world size) or a full
    file (read on rank 0, scattered)."""
    loader = load_distributed if is_distributed_checkpoint(path) else load_full
    return loader(strategy, path, state, weights_only=weights_only)


def is_distributed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by :func:`save_distributed`."""
    return Path(path, ".metadata").is_file()


def optimizer_owners(state: Mapping[str, Any]) -> dict[str, nn.Module]:
    """For each optimizer in ``state``, the (unwrapped) module whose parameters it steps.

    Sharded state dicts name optimizer state by parameter name, so every optimizer
    must travel with its module.

    Raises:
        ValueError: for an optimizer whose parameters no module in ``state`` owns.
    """
    modules = {name: unwrap(v) for name, v in state.items() if isinstance(v, nn.Module)}
    owned = {name: {id(p) for p in m.parameters()} for name, m in modules.items()}
    owners: dict[str, nn.Module] = {}
    for name, value in state.items():
        if not isinstance(value, Optimizer):
            continue
        params = {id(p) for group in value.param_groups for p in group["params"]}
        owner = next((m for m, ids in owned.items() if params <= ids), None)
        if owner is None:
            raise ValueError(
                f"the parameters of optimizer {name!r} belong to none of the modules in the "
                f"checkpoint state ({', '.join(map(repr, modules)) or 'none'}); a sharded "
                "strategy names optimizer state by parameter, so save the module with it"
            )
        owners[name] = modules[owner]
    return owners


# ------------------------------------------------------------------ optimizer layouts


def optimizer_state_by_index(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name turned into ``Optimizer.state_dict``'s
    layout (parameters numbered in ``param_groups`` order)."""
    if not state:
        return state
    order = [name for group in state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def optimizer_state_by_name(state: dict[str, Any], optimizer: Optimizer,
                            module: nn.Module) -> dict[str, Any]:
    """The inverse of :func:`optimizer_state_by_index` for ``optimizer`` over ``module``.

    Raises:
        CheckpointLoadError: when the saved groups do not match the optimizer's.
    """
    names = {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = [i for group in state.get("param_groups", ()) for i in group["params"]]
    if sorted(saved) != list(range(len(order))):
        raise CheckpointLoadError(
            "", f"the optimizer state holds {len(saved)} parameters but the optimizer "
            f"steps {len(order)}; it was saved from a different model or optimizer"
        )
    for mine, theirs in zip(optimizer.param_groups, state.get("param_groups", ()),
                            strict=False):
        if set(mine) != set(theirs):
            raise CheckpointLoadError(
                "", f"the saved optimizer's settings are {sorted(set(theirs) - {'params'})}, "
                f"this {type(optimizer).__name__}'s are {sorted(set(mine) - {'params'})}: it "
                "was saved from a different optimizer"
            )
    return {
        "state": {order[i]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }


# ------------------------------------------------------------------ full checkpoints


def save_full(strategy: Strategy, path: str | Path, state: Mapping[str, Any]) -> None:
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
    precision_state = strategy.precision.state_dict()
    if precision_state:
        checkpoint[PRECISION_KEY] = precision_state
    if strategy.is_global_zero:
        strategy.checkpoint_io.save_checkpoint(checkpoint, path)
    strategy.barrier()


def load_full(strategy: Strategy, path: str | Path, state: dict[str, Any],
              *, weights_only: bool = True) -> dict[str, Any]:
    """Read a full checkpoint on rank 0 and scatter it into sharded modules (a collective).

    Every rank raises the same :class:`CheckpointLoadError` when rank 0 cannot use the
    file, before anything is restored.
    """
    owners = optimizer_owners(state)
    checkpoint: dict[str, Any] = {}
    problem: str | None = None
    not_found = False
    if strategy.is_global_zero:
        try:
            checkpoint = strategy.checkpoint_io.load_checkpoint(
                path, map_location="cpu", weights_only=weights_only
            )
            problem = missing_entries(path, checkpoint, state)
            for name, target in state.items():
                # checked here, before rank 0's verdict goes out: a mismatch found
                # later on rank 0 alone would leave the others in the scatter
                if problem is None and isinstance(target, Optimizer):
                    optimizer_state_by_name(checkpoint[name], target, owners[name])
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
              {k: v for k, v in checkpoint.items() if k not in sharded})
    problem, not_found, small, rest = strategy.broadcast(header)
    if not_found:
        raise FileNotFoundError(problem)
    if problem is not None:
        raise CheckpointLoadError(str(path), problem)
    for name, target in state.items():
        if isinstance(target, nn.Module):
            set_model_state_dict(unwrap(target), checkpoint.get(name, {}),
                                 options=_FULL_FROM_RANK0)
        elif isinstance(target, Optimizer) and name in small:
            target.load_state_dict(small[name])
        elif isinstance(target, Optimizer):
            by_name = (
                optimizer_state_by_name(checkpoint[name], target, owners[name])
                if strategy.is_global_zero else {}
            )
            set_optimizer_state_dict(owners[name], target, by_name,
                                     options=_OPTIMIZER_FULL_FROM_RANK0)
    return _restore_plain(strategy, state, rest)


def _has_tensors(optimizer_state: dict[str, Any]) -> bool:
    return any(
        isinstance(v, torch.Tensor) and v.dim() > 0
        for per_param in optimizer_state.get("state", {}).values()
        for v in per_param.values()
    )


def missing_entries(path: str | Path, saved: Mapping[str, Any] | set[str],
                    state: Mapping[str, Any]) -> str | None:
    """The error message for names of ``state`` that the checkpoint lacks, or None."""
    missing = sorted(name for name in state if name not in saved)
    if not missing:
        return None
    present = sorted(k for k in saved if k != PRECISION_KEY)
    return (
        f"checkpoint {str(path)!r} has no entr{'y' if len(missing) == 1 else 'ies'} "
        f"{', '.join(map(repr, missing))}; it has {', '.join(map(repr, present))}"
    )


def _restore_plain(strategy: Strategy, state: dict[str, Any],
                   rest: dict[str, Any]) -> dict[str, Any]:
    precision_state = rest.pop(PRECISION_KEY, None)
    if precision_state is not None:
        strategy.precision.load_state_dict(precision_state)
    for name, target in state.items():
        if not isinstance(target, (nn.Module, Optimizer)):
            state[name] = rest.pop(name)
    return rest


# ------------------------------------------------------------------ distributed checkpoints


def save_distributed(strategy: Strategy, path: str | Path, state: Mapping[str, Any]) -> None:
    """Write a distributed checkpoint directory at ``path`` (a collective).

    Every rank writes its own shards into a staging directory; rank 0 adds the plain
    values and then swaps the staging directory in. An interrupted save leaves the
    previous checkpoint at ``path`` untouched.
    """
    path = Path(path)
    owners = optimizer_owners(state)
    tensors: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            tensors[name] = get_model_state_dict(unwrap(value))
        elif isinstance(value, Optimizer):
            tensors[name] = get_optimizer_state_dict(owners[name], value)
        else:
            plain[name] = value
    precision_state = strategy.precision.state_dict()
    if precision_state:
        plain[PRECISION_KEY] = precision_state
    staging = path.with_name(path.name + _STAGING_SUFFIX)
    if strategy.is_global_zero:
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save left
        staging.mkdir(parents=True)
    strategy.barrier()
    dcp.save(tensors, checkpoint_id=staging)
    strategy.barrier()
    if strategy.is_global_zero:
        strategy.checkpoint_io.save_checkpoint(plain, staging / PLAIN_FILE)
        _swap_in(staging, path)
    strategy.barrier()


def _swap_in(staging: Path, path: Path) -> None:
    """Move ``staging`` to ``path``, replacing what is there; the old one is deleted
    only after the new one is in place."""
    old = path.with_name(path.name + _OLD_SUFFIX)
    if old.exists():
        _remove(old)
    if path.exists():
        path.rename(old)
    staging.rename(path)
    _fsync_directory(path.parent)
    if old.exists():
        _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_distributed(strategy: Strategy, path: str | Path, state: dict[str, Any],
                     *, weights_only: bool = True) -> dict[str, Any]:
    """Load a distributed checkpoint into ``state``, at any world size (a collective
    when a process group exists). Returns the plain entries ``state`` did not name."""
    path = Path(path)
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as error:  # the reader raises whatever the file system gives it
        raise CheckpointLoadError(
            str(path), f"{str(path)!r} is not a readable distributed checkpoint "
            f"directory ({type(error).__name__}: {error})"
        ) from error
    plain: dict[str, Any] = strategy.checkpoint_io.load_checkpoint(
        path / PLAIN_FILE, map_location="cpu", weights_only=weights_only
    )
    saved = {key.split(".", 1)[0] for key in metadata.state_dict_metadata} | set(plain)
    problem = missing_entries(path, saved, state)
    if problem is not None:
        raise CheckpointLoadError(str(path), problem)
    owners = optimizer_owners(state)
    targets: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            targets[name] = get_model_state_dict(unwrap(value))
        elif isinstance(value, Optimizer):
            targets[name] = get_optimizer_state_dict(owners[name], value)
    saved_keys = set(metadata.state_dict_metadata)
    for name, target in targets.items():
        if isinstance(state[name], Optimizer):
            # a parameter that never had a gradient has no saved optimizer state: what
            # the optimizer holds for it (nothing, or torch's zeros) stays; everything
            # else, state keys and group settings alike, must be in the checkpoint
            kept = {fqn: values for fqn, values in target.get("state", {}).items()
                    if any(k.startswith(f"{name}.state.{fqn}.") for k in saved_keys)}
            target["state"] = kept
    try:
        dcp.load(targets, checkpoint_id=path)
    except (Exception, CheckpointException) as error:  # dcp's is a BaseException
        raise CheckpointLoadError(
            str(path), f"it does not match the modules and optimizers given (saved from "
            f"a different model or optimizer?): {type(error).__name__}: {error}"
        ) from error
    for name, value in state.items():
        if isinstance(value, nn.Module):
            set_model_state_dict(unwrap(value), targets[name])
        elif isinstance(value, Optimizer):
            set_optimizer_state_dict(owners[name], value, targets[name],
                                     options=_OPTIMIZER_SHARDED)
    return _restore_plain(strategy, state, plain)
