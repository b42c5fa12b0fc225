"""Checkpoint IO: how a strategy writes and reads checkpoint files."""

from __future__ import annotations

from interlock.strategies.io.base import CheckpointIO
from interlock.strategies.io.errors import CheckpointLoadError
from interlock.strategies.io.torch_io import TorchCheckpointIO

__all__ = ["CheckpointIO", "CheckpointLoadError", "TorchCheckpointIO"]
