"""The error raised when a checkpoint file cannot be loaded as asked."""

from __future__ import annotations


class CheckpointLoadError(ValueError):
    """A checkpoint file that was refused or could not be read.

    Attributes:
        path: the file that was being loaded.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        # Two-argument constructor: rebuild explicitly so the error pickles across ranks.
        return (type(self), (self.path, str(self)))
