"""Distributed checkpoints: a directory written by ``torch.distributed.checkpoint``
(every rank its own shards) with ``interlock.pt`` for the plain values, staged and
swapped into place, verified by its manifest, loadable at any world size."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
from torch.optim import Optimizer

from interlock.strategies.checkpointing.fit import describe_misfits, distributed_misfits
from interlock.strategies.checkpointing.rollback import restoring
from interlock.strategies.checkpointing.state import (
    PLAIN_FILE,
    SavingStrategy,
    StateKeys,
    add_state_keys,
    missing_entries,
    optimizer_owners,
    pipeline_stages,
    restore_plain,
    runtime_entries,
)
from interlock.strategies.io import CheckpointLoadError, digest
from interlock.strategies.io.base import load_with
from interlock.strategies.io.torch_io import fsync_directory
from interlock.strategies.module_wrapper import unwrap

_STAGING_SUFFIX = ".interlock-staging"
_OLD_SUFFIX = ".interlock-old"

_OPTIMIZER_SHARDED = StateDictOptions(strict=False)


def is_distributed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by :func:`save_distributed` (its
    ``.metadata`` or its manifest is there)."""
    return Path(path, ".metadata").is_file() or Path(path, digest.MANIFEST_FILE).is_file()


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
        problem = describe_misfits(path, distributed_misfits(
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
        return restore_plain(strategy, state, plain)


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
