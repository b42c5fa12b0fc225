"""Files the command line writes: checked before the work, written whole or not at all.

A destination is checked by making (and at once removing) a file where the output
will go: ``os.access`` is not enough, because root passes it even on /proc. A write
goes to a temporary file in the same directory, renamed over the destination, so an
interrupted or failed write never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def unwritable_reason(path: str) -> str | None:
    """Why no file can be written at ``path``, as a phrase that follows the path in a
    one-line error, or None when one can (missing parent directories are fine: the
    writer creates them)."""
    if not path:
        return "is empty; give a file path"
    target = Path(path)
    if target.is_dir():
        return "is a directory; give a file path"
    if target.exists() and not target.is_file():
        # a device or a pipe (/dev/null, /dev/stdout): written in place, never replaced
        return None if os.access(target, os.W_OK) else "cannot be written"
    real = Path(os.path.realpath(target))
    existing = next((p for p in (real.parent, *real.parent.parents) if p.exists()),
                    Path("."))
    if not existing.is_dir() or not can_create_in(existing):
        return f"cannot be written ({existing} is not a writable directory)"
    return None


def can_create_in(directory: Path) -> bool:
    """Whether a file can be made in ``directory``; the probe file is removed at once."""
    if not os.access(directory, os.W_OK):
        return False
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".interlock-probe-"):
            return True
    except OSError:
        return False


def write_text(path: str | Path, text: str, newline: str | None = None) -> Path:
    """Write ``text`` (UTF-8, line ends as ``open``'s ``newline`` makes them) to ``path``
    whole or not at all, creating missing parent directories; returns the path written.

    A regular file (or a link to one) is replaced by renaming a temporary file from
    the same directory over it, keeping the old file's permissions; a device or a pipe
    is written in place.

    Raises:
        OSError: when the file cannot be written; no partial file is left behind.
    """
    target = Path(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        with open(target, "w", encoding="utf-8", newline=newline) as out:
            out.write(text)
        return target
    real = Path(os.path.realpath(target))
    real.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as out:
            out.write(text)
        os.chmod(tmp, _mode_for(real))
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def _mode_for(path: Path) -> int:
    """The permissions the written file gets: the replaced file's, else what a plain
    ``open(path, "w")`` would give (mkstemp makes files private to the owner)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask
