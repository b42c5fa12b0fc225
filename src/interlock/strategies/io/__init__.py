"""Checkpoint IO: how a strategy writes and reads checkpoint files."""

from __future__ import annotations

from interlock.engine.tables import CheckpointIORow
from interlock.strategies.factories import load_part, row_named
from interlock.strategies.io.base import CheckpointIO
from interlock.strategies.io.errors import CheckpointLoadError
from interlock.strategies.io.torch_io import TorchCheckpointIO


def checkpoint_io_for(name: str | CheckpointIORow) -> CheckpointIO:
    """A new checkpoint IO for a checkpoint IO row (or a registered row's name: a
    Plan's ``checkpoint_io``), built from the row's factory.

    Raises:
        ValueError: no checkpoint IO row has that name.
        ImportError: the row's factory cannot be imported (naming what to install).
    """
    row = name if isinstance(name, CheckpointIORow) else row_named(CheckpointIORow, name)
    made = load_part("checkpoint IO", row.name, row.factory, row.requires)()
    if not isinstance(made, CheckpointIO):
        raise TypeError(f"checkpoint IO {row.name!r}: {row.factory} made a "
                        f"{type(made).__name__}, not an interlock CheckpointIO")
    return made


__all__ = [
    "CheckpointIO",
    "CheckpointLoadError",
    "TorchCheckpointIO",
    "checkpoint_io_for",
]
