"""Content digests that let a checkpoint prove it is the one that was written.

A checkpoint file written by :class:`~interlock.strategies.io.TorchCheckpointIO` is the
zip archive ``torch.save`` makes, followed by a fixed-size trailer::

    offset  size  field
    0       8     magic, b"ILCKSUM\\x00"
    8       4     format version (little-endian unsigned), currently 1
    12      8     length of the zip archive before the trailer, in bytes
    20      32    SHA-256 of those bytes

``torch.load`` finds a zip archive by its end record and ignores bytes after it, so a
file with a trailer still loads with plain torch. A file without one (written by
``torch.save`` or an older interlock) is read unverified.

A distributed checkpoint directory carries a manifest (:data:`MANIFEST_FILE`, JSON)
listing every other file in it with its size and SHA-256, plus the SHA-256 of that
listing itself, so a damaged manifest is told apart from a damaged shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MAGIC = b"ILCKSUM\x00"
VERSION = 1
_LAYOUT = struct.Struct("<8sIQ32s")
#: bytes a trailer adds to a file
TRAILER_SIZE = _LAYOUT.size
#: the manifest of a distributed checkpoint directory
MANIFEST_FILE = "interlock.manifest.json"
_MANIFEST_FORMAT = "interlock-manifest"
_CHUNK = 8 << 20
#: a zip archive's end record: its signature and its fixed size (a comment may follow)
_END_RECORD = b"PK\x05\x06"
_END_RECORD_SIZE = 22
_LONGEST_COMMENT = 0xFFFF


def new_hash() -> Any:
    """The hash that digests are computed with (SHA-256)."""
    return hashlib.sha256()


def trailer(length: int, digest: bytes) -> bytes:
    """The trailer for ``length`` bytes of archive whose SHA-256 is ``digest``."""
    return _LAYOUT.pack(MAGIC, VERSION, length, digest)


@dataclass(frozen=True)
class Verdict:
    """What a file's trailer says about it.

    Attributes:
        has_trailer: whether the file carries an interlock digest at all.
        problem: why the file is not what was written (None when it is, or when it has
            no trailer and nothing else is known to be wrong).
        archive_end: where the zip archive ends (the trailer's start), when known.
    """

    has_trailer: bool
    problem: str | None = None
    archive_end: int | None = None


def _chunks(file: IO[bytes], start: int, length: int) -> Iterator[bytes]:
    file.seek(start)
    left = length
    while left > 0:
        chunk = file.read(min(_CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def _digest_of(file: IO[bytes], start: int, length: int) -> bytes:
    hashed = new_hash()
    for chunk in _chunks(file, start, length):
        hashed.update(chunk)
    digest: bytes = hashed.digest()
    return digest


def _archive_end(file: IO[bytes], size: int) -> int | None:
    """Where the zip archive in ``file`` ends, found from its end record; None when
    there is no end record (the archive's end is missing)."""
    window = min(size, _END_RECORD_SIZE + _LONGEST_COMMENT + TRAILER_SIZE + 4096)
    file.seek(size - window)
    tail = file.read(window)
    at = len(tail)
    while (at := tail.rfind(_END_RECORD, 0, at)) >= 0:
        if at + _END_RECORD_SIZE <= len(tail):
            comment = int.from_bytes(tail[at + 20:at + 22], "little")
            end = size - window + at + _END_RECORD_SIZE + comment
            if end <= size:
                return end
    return None


def _bytes(count: int) -> str:
    return f"{count} byte{'s' if count != 1 else ''}"


def _shorter(missing: int) -> str:
    return f"it is {_bytes(missing)} shorter than written"


def inspect_file(file: IO[bytes], *, verify: bool = True) -> Verdict:
    """Check ``file`` (open for binary reading) against its trailer.

    With ``verify=False`` only the trailer's place is found, nothing is hashed. The
    file position is left anywhere: seek before reading it again.
    """
    size = file.seek(0, os.SEEK_END)
    if size >= TRAILER_SIZE:
        file.seek(size - TRAILER_SIZE)
        raw = file.read(TRAILER_SIZE)
        if raw.startswith(MAGIC):
            return _check_trailer(file, raw, size - TRAILER_SIZE, size, verify)
    # No trailer where it belongs: find the archive's end and look at what follows it.
    end = _archive_end(file, size)
    if end is None:
        return Verdict(False, None, None)
    file.seek(end)
    after = file.read(size - end)
    if not after:
        return Verdict(False, None, end)  # a plain torch.save file
    if after.startswith(MAGIC):
        if len(after) > TRAILER_SIZE:
            extra = len(after) - TRAILER_SIZE
            return Verdict(True, f"{_bytes(extra)} {'was' if extra == 1 else 'were'} added "
                           "after its digest trailer", end)
        if len(after) >= _LAYOUT.size - 32:  # the length field survived
            (_, _, length, _) = _LAYOUT.unpack(after.ljust(TRAILER_SIZE, b"\0"))
            return Verdict(True, _shorter(length + TRAILER_SIZE - size), end)
        return Verdict(True, _shorter(TRAILER_SIZE - len(after)), end)
    if MAGIC.startswith(after):
        return Verdict(True, _shorter(TRAILER_SIZE - len(after)), end)
    return Verdict(False, f"{_bytes(len(after))} that are not an interlock digest trailer "
                   "follow its zip archive (a damaged trailer, or bytes added to the file)",
                   end)


def _check_trailer(file: IO[bytes], raw: bytes, at: int, size: int,
                   verify: bool) -> Verdict:
    _, version, length, digest = _LAYOUT.unpack(raw)
    if version != VERSION:
        return Verdict(True, f"its digest trailer has format version {version}, which this "
                       f"interlock does not know (it reads version {VERSION}); it was "
                       "written by a newer interlock, or the trailer is damaged", at)
    if length != at:
        return Verdict(True, f"its zip archive is {_bytes(abs(length - at))} "
                       f"{'shorter' if length > at else 'longer'} than its digest trailer "
                       "records (bytes were removed or inserted, or the trailer is damaged)",
                       at)
    if verify and _digest_of(file, 0, length) != digest:
        return Verdict(True, "its content does not match the digest written with it "
                       "(damaged after saving)", at)
    return Verdict(True, None, at)


def describe_missing_end(size: int) -> str:
    """What to say about a file without a trailer whose zip archive has no end record."""
    if size == 0:
        return "the file is empty"
    return ("the end of its zip archive is missing: the file was cut short (truncated) "
            "or is not a torch checkpoint")


# ------------------------------------------------------------------ manifests


def digest_file(path: Path) -> tuple[int, str]:
    """The size and SHA-256 (hex) of the file at ``path``."""
    with path.open("rb") as file:
        size = file.seek(0, os.SEEK_END)
        return size, _digest_of(file, 0, size).hex()


def _listing_digest(files: dict[str, Any]) -> str:
    text = json.dumps(files, sort_keys=True, separators=(",", ":"))
    hashed = new_hash()
    hashed.update(text.encode())
    digest: str = hashed.hexdigest()
    return digest


def _files_under(directory: Path) -> list[str]:
    return sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST_FILE
    )


def build_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of every file under ``directory`` (but the manifest itself)."""
    files: dict[str, Any] = {}
    for name in _files_under(directory):
        size, digest = digest_file(directory / name)
        files[name] = {"size": size, "sha256": digest}
    return {"format": _MANIFEST_FORMAT, "version": VERSION, "files": files,
            "files_sha256": _listing_digest(files)}


def check_manifest(directory: Path) -> str | None:
    """Why the files under ``directory`` are not the ones its manifest lists, or None
    when they are. A directory without a manifest (written before interlock kept one)
    passes unverified.

    The messages name the file that is wrong.
    """
    manifest_path = directory / MANIFEST_FILE
    try:
        text = manifest_path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"its manifest {MANIFEST_FILE} cannot be read ({error})"
    try:
        manifest = json.loads(text)
        files = manifest["files"]
        if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("not an interlock manifest")
        if manifest.get("version") != VERSION:
            return (f"its manifest {MANIFEST_FILE} has format version "
                    f"{manifest.get('version')!r}; this interlock reads version {VERSION}")
        if manifest.get("files_sha256") != _listing_digest(files):
            raise ValueError("its listing does not match the digest written with it")
        listed = {str(name): (int(entry["size"]), str(entry["sha256"]))
                  for name, entry in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"its manifest {MANIFEST_FILE} is damaged ({type(error).__name__}: {error})"
    present = set(_files_under(directory))
    for name, (size, digest) in sorted(listed.items()):
        if name not in present:
            return f"{name} is missing (the manifest lists it, {size} bytes)"
        try:
            actual_size, actual_digest = digest_file(directory / name)
        except OSError as error:
            return f"{name} cannot be read ({error})"
        if actual_size < size:
            return f"{name}: {_shorter(size - actual_size)}"
        if actual_size > size:
            return f"{name} is {_bytes(actual_size - size)} longer than written"
        if actual_digest != digest:
            return (f"{name}: its content does not match the digest written with it "
                    "(damaged after saving)")
    extra = sorted(present - set(listed))
    if extra:
        return (f"{extra[0]} is not one of the files it was written with"
                + (f" (nor are {len(extra) - 1} more)" if len(extra) > 1 else ""))
    return None


def write_manifest(directory: Path) -> None:
    """Write the manifest of ``directory`` atomically (temporary file, sync, rename)."""
    data = json.dumps(build_manifest(directory), indent=1, sort_keys=True).encode()
    temp = directory / f".{MANIFEST_FILE}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, directory / MANIFEST_FILE)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
