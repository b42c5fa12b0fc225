"""Whether a checkpoint fits the live modules and optimizers (keys, shapes, dtypes),
checked before anything is restored, and the refusal that lists why not."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.optim import Optimizer

from interlock.strategies.io import CheckpointLoadError
from interlock.strategies.module_wrapper import unwrap

#: how many problems a refusal lists before it counts the rest
_SHOWN_PROBLEMS = 5
#: per-parameter optimizer states that have the parameter's shape (torch's optimizers'
#: names); other tensors (factored or flat ones, e.g. Adafactor's, LBFGS's) are
#: compared only with what the live optimizer already holds
_PARAMETER_SHAPED = frozenset({
    "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
    "acc_delta", "sum", "ax", "prev", "step_size", "grad_avg",
})


def _shape(size: Any) -> str:
    return str(tuple(int(n) for n in size))


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def module_misfits(name: str, saved: object, live: Mapping[str, Any]) -> list[str]:
    """Why the saved state dict ``saved`` does not fit a module whose state dict is
    ``live``: missing and unexpected keys, other shapes, other dtypes."""
    where = f"module {name!r}"
    if not isinstance(saved, Mapping):
        return [f"{where}: the checkpoint holds a {type(saved).__name__}, not a state dict"]
    problems = [f"{where}: {key}: not in the checkpoint" for key in live if key not in saved]
    problems += [f"{where}: {key}: in the checkpoint, not in this model"
                 for key in saved if key not in live]
    for key, mine in live.items():
        theirs = saved.get(key)
        if not (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)):
            continue
        if tuple(theirs.shape) != tuple(mine.shape):
            problems.append(f"{where}: {key}: saved shape {_shape(theirs.shape)}, this model "
                            f"has {_shape(mine.shape)}")
        elif theirs.dtype != mine.dtype:
            problems.append(f"{where}: {key}: saved as {_dtype(theirs.dtype)}, this model "
                            f"has {_dtype(mine.dtype)}")
    return problems


def optimizer_misfits(name: str, saved: object, optimizer: Optimizer) -> list[str]:
    """Why ``saved`` (``Optimizer.state_dict``'s layout) does not fit ``optimizer``:
    other numbers of parameter groups or of parameters per group, per-parameter state
    of another shape than its parameter (scalars such as Adam's ``step`` are fine)."""
    where = f"optimizer {name!r}"
    if not (isinstance(saved, Mapping) and isinstance(saved.get("state"), Mapping)
            and isinstance(saved.get("param_groups"), list)):
        return [f"{where}: the checkpoint holds no optimizer state dict"]
    groups, mine = saved["param_groups"], optimizer.param_groups
    if len(groups) != len(mine):
        return [f"{where}: saved with {len(groups)} parameter group(s), this optimizer has "
                f"{len(mine)}"]
    problems: list[str] = []
    params: dict[Any, torch.Tensor] = {}
    for i, (theirs, ours) in enumerate(zip(groups, mine, strict=True)):
        indices = theirs.get("params", []) if isinstance(theirs, Mapping) else []
        if len(indices) != len(ours["params"]):
            problems.append(f"{where}: parameter group {i}: saved with {len(indices)} "
                            f"parameters, this optimizer has {len(ours['params'])}")
        params.update(zip(indices, ours["params"], strict=False))
    if problems:
        return problems
    for index, per_param in saved["state"].items():
        param = params.get(index)
        if param is None:
            problems.append(f"{where}: state for parameter {index!r}, which no saved "
                            "parameter group lists")
            continue
        held = optimizer.state.get(param, {})
        for key, value in (per_param.items() if isinstance(per_param, Mapping) else ()):
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            current = held.get(key)
            if isinstance(current, torch.Tensor) and current.dim() > 0:
                expected, whose = current.shape, "this optimizer holds"
            elif key in _PARAMETER_SHAPED:
                expected, whose = param.shape, "its parameter has"
            else:
                continue
            if tuple(value.shape) != tuple(expected):
                problems.append(f"{where}: parameter {index} {key}: saved shape "
                                f"{_shape(value.shape)}, {whose} {_shape(expected)}")
    return problems


def misfits(state: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> list[str]:
    """Why the modules and optimizers of a full checkpoint do not fit those of
    ``state`` (empty when they fit). Entries the checkpoint lacks are not reported
    here (:func:`missing_entries` does)."""
    problems: list[str] = []
    for name, target in state.items():
        if name not in checkpoint:
            continue
        if isinstance(target, nn.Module):
            problems += module_misfits(name, checkpoint[name], unwrap(target).state_dict())
        elif isinstance(target, Optimizer):
            problems += optimizer_misfits(name, checkpoint[name], target)
    return problems


def describe_misfits(path: str | Path, problems: list[str]) -> str | None:
    """The refusal for ``problems`` (None when there are none)."""
    if not problems:
        return None
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = len(problems) - _SHOWN_PROBLEMS
    return (f"checkpoint {str(path)!r} does not fit the modules and optimizers given, so "
            f"nothing was restored: {shown}"
            + (f"; and {more} more problem{'s' if more != 1 else ''}" if more > 0 else ""))


def refuse_misfits(path: str | Path, state: Mapping[str, Any],
                   checkpoint: Mapping[str, Any]) -> None:
    """Raise :class:`CheckpointLoadError` when the full ``checkpoint`` does not fit the
    modules and optimizers of ``state``."""
    problem = describe_misfits(path, misfits(state, checkpoint))
    if problem is not None:
        raise CheckpointLoadError(str(path), problem)


def distributed_misfits(metadata: Metadata, targets: Mapping[str, Any],
                         state: Mapping[str, Any],
                         elsewhere: Mapping[str, set[str]]) -> list[str]:
    """Why a distributed checkpoint's tensors (as its metadata describes them) do not
    fit ``targets``, the modules' and optimizers' state dicts they would be read into
    (``elsewhere``: per module, keys that other pipeline stages hold)."""
    saved = metadata.state_dict_metadata
    problems: list[str] = []

    def compare(where: str, key: str, flat: str, tensor: torch.Tensor, *,
                whose: str, dtype: bool) -> None:
        entry = saved.get(flat)
        if entry is None:
            problems.append(f"{where}: {key}: not in the checkpoint")
        elif not isinstance(entry, TensorStorageMetadata):
            problems.append(f"{where}: {key}: the checkpoint holds a value, not a tensor")
        elif tuple(entry.size) != tuple(tensor.shape):
            problems.append(f"{where}: {key}: saved shape {_shape(entry.size)}, {whose} "
                            f"{_shape(tensor.shape)}")
        elif dtype and entry.properties.dtype != tensor.dtype:
            problems.append(f"{where}: {key}: saved as {_dtype(entry.properties.dtype)}, "
                            f"{whose} {_dtype(tensor.dtype)}")

    for name, target in targets.items():
        if isinstance(state[name], nn.Module):
            where = f"module {name!r}"
            for key, tensor in target.items():
                if isinstance(tensor, torch.Tensor):
                    compare(where, key, f"{name}.{key}", tensor, whose="this model has",
                            dtype=True)
            others = elsewhere.get(name, set())
            problems += [f"{where}: {flat.removeprefix(name + '.')}: in the checkpoint, "
                         "not in this model" for flat in saved
                         if flat.startswith(f"{name}.") and
                         flat.removeprefix(f"{name}.") not in target
                         and flat.removeprefix(f"{name}.") not in others]
        else:
            where = f"optimizer {name!r}"
            for fqn, values in target.get("state", {}).items():
                for key, tensor in values.items():
                    if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                        compare(where, f"{fqn} {key}", f"{name}.state.{fqn}.{key}", tensor,
                                whose="this optimizer has", dtype=False)
    return problems
