"""`TorchCheckpointIO`: ``torch.save``/``torch.load`` with atomic writes and safe loads."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import torch

from interlock.strategies.io.base import CheckpointIO, PathLike
from interlock.strategies.io.errors import CheckpointLoadError

#: torch's message for a file that is not a readable zip archive (truncated, corrupt).
_ZIP_READER_MARKER = "PytorchStreamReader failed"


@functools.cache
def _file_mode() -> int:
    # mkstemp creates files readable by the owner only; give the checkpoint the mode a
    # plain open() would. Reading the umask means setting it, so do it once.
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; a no-op where directories cannot be opened (Windows)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some file systems (certain network mounts) do not sync directories.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def _unpickler_reason(exc: pickle.UnpicklingError) -> str:
    """The weights-only unpickler's own reason, without the advice torch wraps around it."""
    # torch re-raises the unpickler's error with advice added and the original as context.
    inner = exc.__context__
    text = str(inner) if isinstance(inner, pickle.UnpicklingError) else str(exc)
    _, found, after = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (after if found else text).splitlines() if line.strip()]
    return lines[0].split(". ", 1)[0].rstrip(".") if lines else ""


#: Reasons that mean "an object outside tensors and plain containers", not a bad file.
_UNSAFE_REASONS = ("GLOBAL", "unrecognized function", "allowlisted")


class TorchCheckpointIO(CheckpointIO):
    """Checkpoints as ``torch.save`` files.

    Saving is atomic: the checkpoint is written to a temporary file next to the target,
    synced to disk, and renamed over the target, so a crash at any moment leaves either
    the previous checkpoint or the new one, never a partial file. A process killed
    mid-write may leave a hidden ``.<name>.*.tmp`` file beside the target; it is never
    read and can be deleted.

    Loading uses torch's weights-only unpickler unless ``weights_only=False`` is passed
    explicitly: checkpoints of tensors, plain containers and numbers load, while a file
    that would run code on unpickling is refused with :class:`CheckpointLoadError`.
    """

    #: the name a Plan gives this checkpoint IO (``Plan.checkpoint_io``)
    name: ClassVar[str] = "torch"

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        target = Path(path)
        directory = target.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(temp, _file_mode())
            os.replace(temp, target)
        except BaseException:
            # Any failure, KeyboardInterrupt included: the target was never touched.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        _fsync_directory(directory)

    def load_checkpoint(
        self,
        path: PathLike,
        *,
        map_location: str | torch.device | None = None,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Read a checkpoint written by :meth:`save_checkpoint` (or ``torch.save``).

        Raises:
            FileNotFoundError: there is no file at ``path``.
            CheckpointLoadError: the weights-only unpickler refused the file, the file
                is truncated or corrupt, or it holds something other than a dict.
        """
        name = os.fspath(path)
        try:
            file = open(name, "rb")
        except FileNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, "no checkpoint file at this path", name) from exc
        with file:
            try:
                loaded = torch.load(file, map_location=map_location, weights_only=weights_only)
            except pickle.UnpicklingError as exc:
                reason = _unpickler_reason(exc) if weights_only else ""
                if weights_only and any(m in str(exc) for m in _UNSAFE_REASONS):
                    raise CheckpointLoadError(
                        name,
                        f"refused to load {name}: it contains pickled Python objects beyond "
                        f"tensors and plain containers ({reason}), and unpickling those can "
                        "run arbitrary code. If you trust where the file came from, load it "
                        "with weights_only=False, or allow its classes with "
                        "torch.serialization.add_safe_globals([...]).",
                    ) from exc
                raise _corrupt(name, exc, reason) from exc
            except (EOFError, KeyError) as exc:
                # A truncated or garbage file surfaces as these from deep in the unpickler.
                raise _corrupt(name, exc) from exc
            except RuntimeError as exc:
                if not str(exc).startswith(_ZIP_READER_MARKER):
                    raise
                raise _corrupt(name, exc) from exc
        if not isinstance(loaded, dict):
            raise CheckpointLoadError(
                name,
                f"{name} holds a {type(loaded).__name__}, not a checkpoint dictionary",
            )
        return loaded

    def remove_checkpoint(self, path: PathLike) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _corrupt(name: str, exc: BaseException, reason: str = "") -> CheckpointLoadError:
    detail = reason or str(exc).split(". ", 1)[0] or "the file ended early"
    return CheckpointLoadError(
        name,
        f"{name} is not a readable torch checkpoint; it may be truncated or corrupt "
        f"({type(exc).__name__}: {detail}).",
    )
