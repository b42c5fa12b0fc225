"""`CheckpointIO`: how a strategy writes and reads checkpoint files."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

PathLike = str | os.PathLike[str]


class CheckpointIO(ABC):
    """Saves and loads checkpoint dictionaries."""

    interlock_plugin_kind: ClassVar[str] = "checkpoint_io"

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        """Write ``checkpoint`` to ``path`` so that a crash never leaves a partial file."""

    @abstractmethod
    def load_checkpoint(
        self,
        path: PathLike,
        *,
        map_location: str | torch.device | None = None,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Read a checkpoint. ``weights_only=False`` is the explicit opt-in to unpickle
        arbitrary objects, which can run code: use it only for files you trust."""

    @abstractmethod
    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete a checkpoint written by :meth:`save_checkpoint`."""

    def teardown(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Release anything the IO holds."""
