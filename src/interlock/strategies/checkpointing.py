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
moved into place once every rank has finished. The directory's manifest (every file's
size and SHA-256, written last) lets a load refuse a directory damaged after saving.

A load is all or nothing: the checkpoint is checked against the live modules and
optimizers (keys, shapes, dtypes) before anything changes, and a restore that still
fails half-way is rolled back before the error is raised.
"""

from __future__ import annotations

import copy
import shutil
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from interlock.strategies import random_state
from interlock.strategies.io import CheckpointLoadError, digest
from interlock.strategies.io.base import load_with
from interlock.strategies.io.torch_io import fsync_directory
from interlock.strategies.module_wrapper import unwrap
from interlock.strategies.random_state import RANDOM_KEY, RankedStrategy

if TYPE_CHECKING:
    from interlock.strategies.collectives import Collective
    from interlock.strategies.io.base import CheckpointIO
    from interlock.strategies.precision.base import Precision

T = TypeVar("T")


class SavingStrategy(RankedStrategy, Protocol):
    """What checkpoint files need of a strategy (`interlock.strategies.base.Strategy`,
    which calls these functions, and so is not imported here): its ranks, collectives,
    precision and checkpoint IO."""

    @property
    def collective(self) -> Collective: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def checkpoint_io(self) -> CheckpointIO: ...

    def barrier(self) -> None: ...

    def broadcast(self, obj: T, src: int = 0) -> T: ...

#: checkpoint key under which the precision's state (the grad scaler's) travels
PRECISION_KEY = "interlock/precision"
#: the entries a checkpoint carries besides the state it was given
RUNTIME_KEYS = frozenset((PRECISION_KEY, RANDOM_KEY))
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


def save(strategy: SavingStrategy, path: str | Path, state: Mapping[str, Any],
         *, distributed: bool) -> None:
    """A sharded strategy's save: a distributed directory, or one full file."""
    (save_distributed if distributed else save_full)(strategy, path, state)


def load(strategy: SavingStrategy, path: str | Path, state: dict[str, Any],
         *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
    """A sharded strategy's load: a distributed directory (any world size) or a full
    file (read on rank 0, scattered)."""
    loader = load_distributed if is_distributed_checkpoint(path) else load_full
    return loader(strategy, path, state, weights_only=weights_only, verify=verify)


def is_distributed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by :func:`save_distributed` (its
    ``.metadata`` or its manifest is there)."""
    return Path(path, ".metadata").is_file() or Path(path, digest.MANIFEST_FILE).is_file()


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
    # a tied parameter (a head sharing the embedding's weight) goes by its first name,
    # the canonical one torch's state-dict functions use, not by its alias
    names: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
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
    present = sorted(k for k in saved if k not in RUNTIME_KEYS)
    return (
        f"checkpoint {str(path)!r} has no entr{'y' if len(missing) == 1 else 'ies'} "
        f"{', '.join(map(repr, missing))}; it has {', '.join(map(repr, present))}"
    )


def runtime_entries(strategy: SavingStrategy) -> dict[str, Any]:
    """What every checkpoint carries besides the state given: the precision's state
    (a grad scaler's), and every rank's random state (a collective where there are
    several ranks; see `interlock.strategies.random_state`)."""
    entries: dict[str, Any] = {}
    precision_state = strategy.precision.state_dict()
    if precision_state:
        entries[PRECISION_KEY] = precision_state
    entries[RANDOM_KEY] = random_state.gather(strategy)
    return entries


def _restore_plain(strategy: SavingStrategy, state: dict[str, Any],
                   rest: dict[str, Any]) -> dict[str, Any]:
    precision_state = rest.pop(PRECISION_KEY, None)
    if precision_state is not None:
        strategy.precision.load_state_dict(precision_state)
    saved_random = rest.pop(RANDOM_KEY, None)
    for name, target in list(state.items()):
        if not isinstance(target, (nn.Module, Optimizer)):
            state[name] = rest.pop(name)
    random_state.restore(strategy, saved_random)  # last: after nothing else can fail
    return rest


# ------------------------------------------------------------------ fitting the live objects

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


# ------------------------------------------------------------------ rolling back


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


# ------------------------------------------------------------------ distributed checkpoints


def split_state(strategy: SavingStrategy, state: Mapping[str, Any]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a distributed checkpoint holds: the modules' and optimizers' state dicts
    (sharded tensors, for ``torch.distributed.checkpoint``) and the plain values with
    the precision's state (for ``interlock.pt``)."""
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
    plain.update(runtime_entries(strategy))
    return tensors, plain


def save_distributed(strategy: SavingStrategy, path: str | Path, state: Mapping[str, Any]) -> None:
    """Write a distributed checkpoint directory at ``path`` (a collective).

    Every rank writes its own shards into a staging directory; rank 0 adds the plain
    values, then the manifest (every file's size and SHA-256), and then swaps the
    staging directory in. An interrupted save leaves the previous checkpoint at
    ``path`` untouched.
    """
    path = Path(path)
    tensors, plain = split_state(strategy, state)
    staging = path.with_name(path.name + _STAGING_SUFFIX)
    if strategy.is_global_zero:
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save left
        staging.mkdir(parents=True)
    strategy.barrier()
    dcp.save(tensors, checkpoint_id=staging)
    strategy.barrier()
    if strategy.is_global_zero:
        strategy.checkpoint_io.save_checkpoint(plain, staging / PLAIN_FILE)
        digest.write_manifest(staging)  # last: it lists every file written before it
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
    fsync_directory(path.parent)
    if old.exists():
        _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()



def load_distributed(strategy: SavingStrategy, path: str | Path, state: dict[str, Any],
                     *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
    """Load a distributed checkpoint into ``state``, at any world size (a collective
    when a process group exists). Returns the plain entries ``state`` did not name.

    Unless ``verify=False``, rank 0 first checks every file against the directory's
    manifest and every rank raises the same :class:`CheckpointLoadError` when one is
    missing, added, shorter or changed (a directory without a manifest, written by an
    older interlock, loads unverified). The saved shapes and dtypes (from the
    checkpoint's metadata) are checked against the modules and optimizers before
    anything is read into them.
    """
    path = Path(path)
    if verify:
        problem: str | None = None
        if strategy.is_global_zero:
            try:
                problem = digest.check_manifest(path)
            except Exception as error:  # any failure is the verdict, for every rank
                problem = f"its files cannot be checked ({type(error).__name__}: {error})"
        problem = strategy.broadcast(problem)
        if problem is not None:
            raise CheckpointLoadError(
                str(path), f"{str(path)!r} is not the checkpoint that was written: {problem}"
            )
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as error:  # the reader raises whatever the file system gives it
        raise CheckpointLoadError(
            str(path), f"{str(path)!r} is not a readable distributed checkpoint "
            f"directory ({type(error).__name__}: {error})"
        ) from error
    plain: dict[str, Any] = load_with(strategy.checkpoint_io, path / PLAIN_FILE,
                                      map_location="cpu", weights_only=weights_only,
                                      verify=verify)
    saved = {key.split(".", 1)[0] for key in metadata.state_dict_metadata} | set(plain)
    problem = missing_entries(path, saved, state)
    if problem is not None:
        raise CheckpointLoadError(str(path), problem)
    owners = optimizer_owners(state)
    # taken before the targets are made: torch fills a fresh optimizer's state then
    with restoring(strategy, path, state):
        for name, value in state.items():
            if isinstance(value, Optimizer):
                add_state_keys(value, owners[name], _metadata_state_keys(metadata, name))
        targets, _ = split_state(strategy, state)
        saved_keys = set(metadata.state_dict_metadata)
        for name, target in targets.items():
            if isinstance(state[name], Optimizer):
                # a parameter that never had a gradient has no saved optimizer state:
                # what the optimizer holds for it (nothing, or torch's zeros) stays;
                # everything else, state keys and group settings alike, must be in the
                # checkpoint
                kept = {fqn: values for fqn, values in target.get("state", {}).items()
                        if any(k.startswith(f"{name}.state.{fqn}.") for k in saved_keys)}
                target["state"] = kept
        # the module targets are the live tensors: dcp.load writes into them
        problem = describe_misfits(path, _distributed_misfits(
            metadata, targets, state, _held_elsewhere(strategy, targets, state)))
        if problem is not None:
            raise CheckpointLoadError(str(path), problem)
        try:
            dcp.load(targets, checkpoint_id=path)
        except (Exception, CheckpointException) as error:  # dcp's is a BaseException
            raise CheckpointLoadError(
                str(path), f"it does not match the modules and optimizers given (saved "
                f"from a different model or optimizer?): {type(error).__name__}: {error}"
            ) from error
        for name, value in state.items():
            if isinstance(value, nn.Module):
                set_model_state_dict(unwrap(value), targets[name])
            elif isinstance(value, Optimizer):
                set_optimizer_state_dict(owners[name], value, targets[name],
                                         options=_OPTIMIZER_SHARDED)
        return _restore_plain(strategy, state, plain)


#: per parameter (by fully qualified name), the state keys a checkpoint holds for it,
#: each with its dtype and shape
StateKeys = dict[str, dict[str, tuple[torch.dtype, tuple[int, ...]]]]


def saved_state_keys(by_name: Mapping[str, Any]) -> StateKeys:
    """The per-parameter tensor keys of an optimizer state dict keyed by name."""
    return {fqn: {key: (value.dtype, tuple(value.shape)) for key, value in values.items()
                  if isinstance(value, torch.Tensor)}
            for fqn, values in by_name.get("state", {}).items()}


def _metadata_state_keys(metadata: Metadata, name: str) -> StateKeys:
    """`saved_state_keys` of optimizer ``name`` as a distributed checkpoint's metadata
    describes it."""
    prefix = f"{name}.state."
    found: StateKeys = {}
    for key, saved in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(saved, TensorStorageMetadata):
            fqn, _, state_key = key[len(prefix):].rpartition(".")
            if fqn:
                found.setdefault(fqn, {})[state_key] = (saved.properties.dtype,
                                                        tuple(saved.size))
    return found


def add_state_keys(optimizer: Optimizer, owner: nn.Module, wanted: StateKeys) -> None:
    """Give a fresh optimizer the per-parameter state keys a checkpoint holds that its
    own step does not create, before the checkpoint is loaded into it.

    torch loads an optimizer's sharded state into what the optimizer holds after one
    step with zero gradients (``exp_avg``, ``momentum_buffer``): a key a precision keeps
    beside those (a Kahan compensation buffer) would be dropped, or on other ranks than
    0 never arrive. Each such key gets zeros shaped and sharded like its parameter, in
    the saved dtype (a scalar key, a plain scalar), for the load to fill."""
    if not any(wanted.values()):
        return
    # torch's own loaders initialise a fresh optimizer's state this way first
    groups: list[dict[str, Any]] = list(
        get_optimizer_state_dict(owner, optimizer)["param_groups"])  # type: ignore[arg-type]
    names = [str(fqn) for group in groups for fqn in group["params"]]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    for fqn, param in zip(names, params, strict=True):
        for key, (dtype, shape) in wanted.get(fqn, {}).items():
            state = optimizer.state[param]
            if key in state:
                continue
            if shape == ():
                state[key] = torch.zeros((), dtype=dtype)
            elif tuple(param.shape) == shape:
                state[key] = torch.zeros_like(param.detach(), dtype=dtype)


def pipeline_stages(strategy: SavingStrategy) -> int:
    """How many pipeline stages ``strategy`` splits models into (1 for most)."""
    degrees = getattr(strategy, "parallelism", None)
    return int(getattr(degrees, "pp", 1))


def _held_elsewhere(strategy: SavingStrategy, targets: Mapping[str, Any],
                    state: Mapping[str, Any]) -> dict[str, set[str]]:
    """Per module, the keys other ranks hold and this one does not: a pipeline stage
    has only its own layers, and a checkpoint's other layers are the other stages'
    (a collective under pipeline parallel; empty otherwise)."""
    if pipeline_stages(strategy) == 1:
        return {}
    mine = {name: sorted(target) for name, target in targets.items()
            if isinstance(state[name], nn.Module)}
    held: dict[str, set[str]] = {name: set() for name in mine}
    for theirs in strategy.collective.all_gather_object(mine):
        for name, keys in theirs.items():
            held.setdefault(name, set()).update(keys)
    return {name: keys - set(mine.get(name, ())) for name, keys in held.items()}


def _distributed_misfits(metadata: Metadata, targets: Mapping[str, Any],
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
