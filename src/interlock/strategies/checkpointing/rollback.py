"""A load is all or nothing: what it may change is copied first, and a restore that
fails half-way is rolled back before the error is raised."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from interlock.strategies.checkpointing.state import SavingStrategy
from interlock.strategies.io import CheckpointLoadError
from interlock.strategies.module_wrapper import unwrap


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class Snapshot:
    """What a load may change, copied before it starts, so that a restore that fails
    half-way can be undone: module tensors (this rank's shards, in host memory),
    optimizer state and settings, the precision's state and the plain values."""

    def __init__(self, strategy: SavingStrategy, state: Mapping[str, Any]) -> None:
        self.strategy = strategy
        self.modules: dict[str, dict[str, torch.Tensor]] = {}
        self.optimizers: dict[str, tuple[dict[Any, dict[str, Any]],
                                         list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self.plain: dict[str, Any] = {}
        for name, value in state.items():
            if isinstance(value, nn.Module):
                self.modules[name] = {
                    key: _local(t).detach().to("cpu", copy=True)
                    for key, t in unwrap(value).state_dict().items()
                    if isinstance(t, torch.Tensor) and not _local(t).is_meta
                }
            elif isinstance(value, Optimizer):
                self.optimizers[name] = (
                    {param: {k: v.detach().clone() if isinstance(v, torch.Tensor)
                             else copy.deepcopy(v) for k, v in per_param.items()}
                     for param, per_param in value.state.items()},
                    [{k: v if k == "params" else copy.deepcopy(v) for k, v in group.items()}
                     for group in value.param_groups],
                    list(value.param_groups),
                )
            else:
                self.plain[name] = value
        self.precision = copy.deepcopy(strategy.precision.state_dict())

    def roll_back(self, state: dict[str, Any]) -> None:
        """Put everything back as it was when the snapshot was taken."""
        with torch.no_grad():
            for name, tensors in self.modules.items():
                live = unwrap(state[name]).state_dict()
                for key, saved in tensors.items():
                    target = live.get(key)
                    if isinstance(target, torch.Tensor):
                        _local(target).copy_(saved)
        for name, (per_param, settings, groups) in self.optimizers.items():
            optimizer: Optimizer = state[name]
            for group, saved_group in zip(groups, settings, strict=True):
                group.clear()
                group.update(saved_group)
            optimizer.param_groups = groups
            optimizer.state = defaultdict(dict, per_param)
        if self.precision:
            self.strategy.precision.load_state_dict(copy.deepcopy(self.precision))
        state.update(self.plain)


@contextmanager
def restoring(strategy: SavingStrategy, path: str | Path, state: dict[str, Any]) -> Iterator[None]:
    """Run a restore into ``state``; if it fails half-way, roll everything it may have
    changed back and raise :class:`CheckpointLoadError` (a KeyboardInterrupt is rolled
    back and re-raised as itself)."""
    snapshot = Snapshot(strategy, state)
    try:
        yield
    except BaseException as error:
        try:
            snapshot.roll_back(state)
        except Exception as again:  # nothing more can be done: say so
            raise CheckpointLoadError(
                str(path), f"restoring {str(path)!r} failed half-way ({type(error).__name__}: "
                f"{error}), and putting the previous state back failed too "
                f"({type(again).__name__}: {again}): the modules and optimizers given may "
                "hold a mix of both"
            ) from error
        if not isinstance(error, Exception) or isinstance(error, CheckpointLoadError):
            raise
        raise CheckpointLoadError(
            str(path), f"restoring {str(path)!r} failed half-way ({type(error).__name__}: "
            f"{error}); everything it had changed was put back as it was before the load"
        ) from error
