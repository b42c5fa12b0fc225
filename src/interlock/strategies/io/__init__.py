"""Checkpoint IO: how a strategy writes and reads checkpoint files."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType

from interlock.strategies.io.base import CheckpointIO
from interlock.strategies.io.errors import CheckpointLoadError
from interlock.strategies.io.torch_io import TorchCheckpointIO
from interlock.strategies.io.xla_io import XLACheckpointIO

#: The class for each checkpoint IO name the engine gives a Plan when no checkpoint IO
#: plugin was passed (``Plan.checkpoint_io``).
CHECKPOINT_IOS: Mapping[str, type[TorchCheckpointIO]] = MappingProxyType(
    {cls.name: cls for cls in (TorchCheckpointIO, XLACheckpointIO)}
)


def checkpoint_io_for(name: str) -> CheckpointIO:
    """A new checkpoint IO for one of the engine's names (a Plan's ``checkpoint_io``).

    Raises:
        ValueError: ``name`` is not a checkpoint IO name the engine gives.
    """
    cls = CHECKPOINT_IOS.get(name)
    if cls is None:
        close = difflib.get_close_matches(name, list(CHECKPOINT_IOS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown checkpoint IO {name!r}.{hint} Choices: {', '.join(CHECKPOINT_IOS)}."
        )
    return cls()


__all__ = [
    "CHECKPOINT_IOS",
    "CheckpointIO",
    "CheckpointLoadError",
    "TorchCheckpointIO",
    "checkpoint_io_for",
]
