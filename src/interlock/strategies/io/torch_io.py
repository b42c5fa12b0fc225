"""`TorchCheckpointIO`: ``torch.save``/``torch.load`` with atomic writes and safe loads."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pickle
import shutil
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Any, ClassVar, cast

import torch

from interlock.strategies.io import digest
from interlock.strategies.io.base import CheckpointIO, PathLike
from interlock.strategies.io.errors import CheckpointLoadError


@functools.cache
def _file_mode() -> int:
    # mkstemp creates files readable by the owner only; give the checkpoint the mode a
    # plain open() would. Reading the umask means setting it, so do it once.
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_directory(directory: Path) -> None:
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
    read and can be deleted. A full disk is reported as ``OSError(ENOSPC)`` saying how
    much was needed and how much is free.

    Every file ends with a digest trailer (:mod:`interlock.strategies.io.digest`): the
    SHA-256 and length of the zip archive ``torch.save`` wrote, which plain
    ``torch.load`` ignores. Loading checks it unless ``verify=False``, so a file cut
    short or damaged after saving is refused instead of loading wrong weights.

    Loading uses torch's weights-only unpickler unless ``weights_only=False`` is passed
    explicitly: checkpoints of tensors, plain containers and numbers load, while a file
    that would run code on unpickling is refused with :class:`CheckpointLoadError`.
    """

    #: the name a Plan gives this checkpoint IO (``Plan.checkpoint_io``)
    name: ClassVar[str] = "torch"

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        """Write ``checkpoint`` atomically, followed by its digest trailer.

        Raises:
            OSError: with ``errno.ENOSPC`` when the file system ran out of space (or
                quota) while writing: the message says how much was needed and how
                much is free. The previous checkpoint at ``path`` is untouched and no
                temporary file is left.
        """
        target = Path(path)
        directory = target.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        writer = _DigestWriter(fd)
        try:
            try:
                torch.save(checkpoint, cast(IO[bytes], writer))
                writer.finish()
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(temp, _file_mode())
            os.replace(temp, target)
        except BaseException as exc:
            # Any failure, KeyboardInterrupt included: the target was never touched.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            full = _out_of_space(exc, writer)
            if full is not None:
                raise _no_space(directory, checkpoint, writer.written) from full
            failed = writer.error
            if failed is not None and isinstance(exc, RuntimeError):
                # torch reports a failed write as a bare "unexpected pos": give the
                # file system's own error instead
                raise OSError(failed.errno, f"{failed.strerror} (while writing {target})",
                              str(target)) from exc
            raise
        fsync_directory(directory)

    def load_checkpoint(
        self,
        path: PathLike,
        *,
        map_location: str | torch.device | None = None,
        weights_only: bool = True,
        verify: bool = True,
    ) -> dict[str, Any]:
        """Read a checkpoint written by :meth:`save_checkpoint` (or ``torch.save``).

        With ``verify=True`` (the default) a file that carries a digest trailer is
        hashed and compared with it before anything is unpickled; a file without one
        (``torch.save``, an older interlock) loads unverified. ``verify=False`` skips
        the check: damage that still unpickles then goes unnoticed.

        Raises:
            FileNotFoundError: there is no file at ``path``.
            CheckpointLoadError: the file does not match its digest, is shorter or
                longer than written, the weights-only unpickler refused it, torch cannot
                read it, or it holds something other than a dict.
        """
        name = os.fspath(path)
        try:
            file = open(name, "rb")
        except FileNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, "no checkpoint file at this path", name) from exc
        except IsADirectoryError as exc:
            raise CheckpointLoadError(
                name, f"{name} is a directory, not a checkpoint file (a distributed "
                "checkpoint directory is loaded by a strategy's load_checkpoint)"
            ) from exc
        with file:
            if verify:
                verdict = digest.inspect_file(file, verify=True)
                if verdict.problem is not None:
                    raise CheckpointLoadError(
                        name, f"{name} is not the checkpoint that was written: "
                        f"{verdict.problem}."
                    )
                file.seek(0)
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
                raise _corrupt(name, exc, file, reason) from exc
            except (EOFError, KeyError, OSError, RuntimeError, zipfile.BadZipFile,
                    struct.error) as exc:
                # A truncated or garbage file surfaces as these from torch's zip reader
                # (a bare OSError "Invalid argument" among them) or the unpickler.
                raise _corrupt(name, exc, file) from exc
        if not isinstance(loaded, dict):
            raise CheckpointLoadError(
                name,
                f"{name} holds a {type(loaded).__name__}, not a checkpoint dictionary",
            )
        return loaded

    def remove_checkpoint(self, path: PathLike) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _corrupt(name: str, exc: BaseException, file: Any,
             reason: str = "") -> CheckpointLoadError:
    detail = reason or str(exc).split(". ", 1)[0] or "the file ended early"
    where = _what_is_wrong(file)
    return CheckpointLoadError(
        name,
        f"{name} is not a readable torch checkpoint; it may be truncated or corrupt "
        f"({type(exc).__name__}: {detail}){'; ' + where if where else ''}.",
    )


def _what_is_wrong(file: Any) -> str:
    """What the file's layout says about why torch could not read it ("" if nothing)."""
    try:
        verdict = digest.inspect_file(file, verify=False)
        if verdict.problem is not None:
            return verdict.problem
        if verdict.archive_end is None:
            return digest.describe_missing_end(file.seek(0, os.SEEK_END))
    except (OSError, ValueError):
        pass
    return ""


class _DigestWriter:
    """What ``torch.save`` writes into: every byte goes to ``fd`` (with ``os.write``,
    retried until all is written) and into the digest; :meth:`finish` appends the
    trailer. The first error of the file system is kept, since torch replaces it
    with its own message."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.hash = digest.new_hash()
        self.written = 0
        self.error: OSError | None = None

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            if self.error is None:
                self.error = exc
            raise

    def write(self, data: bytes) -> int:
        self._write_all(data)
        self.hash.update(data)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered here."""

    def finish(self) -> None:
        self._write_all(digest.trailer(self.written, self.hash.digest()))


#: what torch's zip writer says when a write came up short (a full disk, typically)
_SHORT_WRITE_MARKERS = ("unexpected pos", "enforce fail")
_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


def _out_of_space(exc: BaseException, writer: _DigestWriter) -> BaseException | None:
    """The error that says the file system is full, if ``exc`` comes from one."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return exc
    if writer.error is not None and writer.error.errno in _FULL_ERRNOS:
        return writer.error
    if (isinstance(exc, RuntimeError) and writer.error is None
            and any(m in str(exc) for m in _SHORT_WRITE_MARKERS)):
        return exc
    return None


def _megabytes(count: int) -> str:
    value = count / 1e6
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _no_space(directory: Path, checkpoint: Any, written: int) -> OSError:
    needed = max(_tensor_bytes(checkpoint), written)
    try:
        free = f"{_megabytes(shutil.disk_usage(directory).free)} MB free"
    except OSError:
        free = "free space unknown"
    return OSError(
        errno.ENOSPC,
        f"no space left on {directory}: needed about {_megabytes(needed)} MB, {free}; "
        "the previous checkpoint there is untouched",
        str(directory),
    )


def _tensor_bytes(value: Any, seen: set[int] | None = None) -> int:
    """The bytes of the tensors in ``value`` (a storage shared by several counts once)."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        try:
            key = value.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            return 0
        if key in seen and key != 0:
            return 0
        seen.add(key)
        return int(value.untyped_storage().nbytes())
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in value)
    return 0
