"""Reading cluster variables, with errors that name the variable and the cluster."""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from interlock.engine.errors import ResolutionError

#: Ports derived from a job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's
#: ephemeral range (32768-60999), so an outgoing connection is unlikely to hold one.
PORT_BASE = 15000
PORT_SPAN = 5000


def _invalid(cluster: str, name: str, raw: str | None, why: str) -> ResolutionError:
    value = f"{name} (unset)" if raw is None else f"{name}={raw}"
    return ResolutionError(
        "invalid-environment",
        flag="environment",
        value=value,
        reason=f"the {cluster} environment reads {name}, but {why}.",
    )


def read_str(cluster: str, environ: Mapping[str, str], name: str) -> str:
    """The value of ``name``; ``invalid-environment`` when it is unset or empty."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        raise _invalid(cluster, name, raw, "it is not set" if raw is None else "it is empty")
    return raw.strip()


def read_int(
    cluster: str,
    environ: Mapping[str, str],
    name: str,
    default: int | None = None,
    *,
    minimum: int = 0,
) -> int:
    """The value of ``name`` as an int >= ``minimum``, or ``default`` when it is unset.

    Raises:
        ResolutionError: ``invalid-environment`` when the value is not such an integer,
            or when it is unset and there is no default.
    """
    raw = environ.get(name)
    if raw is None:
        if default is None:
            raise _invalid(cluster, name, raw, "it is not set")
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise _invalid(cluster, name, raw, "it is not a non-negative integer")
    if int(text) < minimum:
        raise _invalid(cluster, name, raw, f"it must be at least {minimum}")
    return int(text)


def read_port(
    cluster: str, environ: Mapping[str, str], name: str, default: int | None = None
) -> int:
    """Like :func:`read_int`, for a TCP port (0-65535)."""
    port = read_int(cluster, environ, name, default)
    if port > 65535:
        raise _invalid(cluster, name, environ.get(name), "a TCP port is at most 65535")
    return port


def port_from_job(cluster: str, environ: Mapping[str, str], name: str) -> int:
    """A rendezvous port derived from the job identifier in ``name``.

    Every task of a job reads the same identifier, so all agree on the port without
    communicating; different jobs sharing a node most likely get different ports.
    Numeric ids map to ``PORT_BASE + id % PORT_SPAN`` (consecutive jobs get consecutive
    ports); other ids through CRC-32, because ``hash()`` is salted per process.
    """
    job = read_str(cluster, environ, name)
    key = int(job) if job.isascii() and job.isdigit() else zlib.crc32(job.encode())
    return PORT_BASE + key % PORT_SPAN


def refuse_change(cluster: str, what: str, current: int, new: int) -> None:
    """Accept ``new`` only when it equals ``current``: the cluster owns that value.

    Raises:
        ValueError: ``new`` differs from what the cluster's launcher decided.
    """
    if new != current:
        raise ValueError(
            f"the {cluster} launcher decided the {what} ({current}); interlock cannot "
            f"change it to {new}. Make the job's launch command and the flags agree."
        )
