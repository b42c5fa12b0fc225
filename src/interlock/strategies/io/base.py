"""`CheckpointIO`: how a strategy writes and reads checkpoint files."""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

PathLike = str | os.PathLike[str]


class CheckpointIO(ABC):
    """Saves and loads checkpoint dictionaries."""

    #: lets the engine recognise instances without importing the runtime
    interlock_part_kind: ClassVar[str] = "checkpoint_io"
    #: the marker's former name, deprecated since 0.2.0 (may be removed in 0.4.0)
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
        verify: bool = True,
    ) -> dict[str, Any]:
        """Read a checkpoint. ``weights_only=False`` is the explicit opt-in to unpickle
        arbitrary objects, which can run code: use it only for files you trust.

        ``verify=False`` asks the IO to skip checking the file against a digest written
        with it (an IO that writes none may ignore it). An IO written before this
        keyword existed keeps working: strategies call it through
        :func:`load_with`, which passes ``verify`` only to an IO that accepts it.
        """

    @abstractmethod
    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete a checkpoint written by :meth:`save_checkpoint`."""

    def teardown(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Release anything the IO holds."""


def accepts_verify(io: CheckpointIO) -> bool:
    """Whether ``io.load_checkpoint`` takes the ``verify`` keyword (an IO written
    against the older signature does not)."""
    try:
        parameters = inspect.signature(io.load_checkpoint).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume the current one
        return True
    return any(p.name == "verify" or p.kind is inspect.Parameter.VAR_KEYWORD
               for p in parameters)


def load_with(io: CheckpointIO, path: PathLike, *,
              map_location: str | torch.device | None = None,
              weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
    """``io.load_checkpoint(...)``, passing ``verify`` only to an IO that accepts it
    (one without the keyword never verified anything, so it is called as before)."""
    if accepts_verify(io):
        return io.load_checkpoint(path, map_location=map_location,
                                  weights_only=weights_only, verify=verify)
    return io.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
