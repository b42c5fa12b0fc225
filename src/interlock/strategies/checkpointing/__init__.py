"""What a strategy's checkpoint holds: full files and distributed (directory) checkpoints.

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

The modules, one concept each: `state` (what a checkpoint holds besides the tensors,
and how its entries map onto the live objects), `fit` (whether it fits them),
`rollback` (all or nothing), `full` and `distributed` (the two formats).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interlock.strategies.checkpointing.distributed import (
    is_distributed_checkpoint,
    load_distributed,
    save_distributed,
    split_state,
)
from interlock.strategies.checkpointing.full import (
    load_full,
    load_unsharded,
    save_full,
    save_unsharded,
)
from interlock.strategies.checkpointing.rollback import restoring
from interlock.strategies.checkpointing.state import (
    PLAIN_FILE,
    PRECISION_KEY,
    RUNTIME_KEYS,
    SavingStrategy,
    missing_entries,
    runtime_entries,
)


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


__all__ = [
    "PLAIN_FILE",
    "PRECISION_KEY",
    "RUNTIME_KEYS",
    "SavingStrategy",
    "is_distributed_checkpoint",
    "load",
    "load_distributed",
    "load_full",
    "load_unsharded",
    "missing_entries",
    "restoring",
    "runtime_entries",
    "save",
    "save_distributed",
    "save_full",
    "save_unsharded",
    "split_state",
]
