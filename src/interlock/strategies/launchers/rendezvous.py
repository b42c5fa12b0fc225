"""The rendezvous store: bound once by the launching process, never re-picked.

Choosing a free port by binding, closing and handing the number on races with every
other process on the machine (and with pytest-xdist workers). Instead the launching
process binds a TCPStore to port 0 and keeps it open; the kernel's choice is handed to
the workers, which connect as clients.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

import torch.distributed as dist

_HOSTED: dict[int, tuple[int, dist.TCPStore]] = {}

#: A counter in the store: how many worker processes have connected to it as clients.
ARRIVALS_KEY = "interlock/arrivals"


def host_store(host: str = "127.0.0.1",
               timeout: datetime.timedelta = datetime.timedelta(minutes=5)) -> str:
    """Bind a store server in this process; returns ``"host:port"`` for the workers."""
    store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
    _HOSTED[int(store.port)] = (os.getpid(), store)
    return f"{host}:{store.port}"


def release_store(rendezvous: str) -> None:
    """Close a store this process hosts (a no-op for unknown addresses)."""
    _, _, port = rendezvous.rpartition(":")
    entry = _HOSTED.pop(int(port), None) if port.isdigit() else None
    del entry  # dropping the last reference shuts the server down


def connect_store(rendezvous: str, timeout: datetime.timedelta,
                  serve: bool = False) -> dist.Store:
    """The store at ``"host:port"``: the server itself when this process hosts it
    (a forked child inherits the dict, hence the pid check), else a client. With
    ``serve`` (rank 0 of a multi-node job on a fixed port) this process serves it."""
    host, _, port_text = rendezvous.rpartition(":")
    port = int(port_text)
    hosted = _HOSTED.get(port)
    if hosted is not None and hosted[0] == os.getpid():
        return hosted[1]
    store = dist.TCPStore(host, port, None, serve, timeout=timeout, wait_for_workers=False)
    if not serve:
        store.add(ARRIVALS_KEY, 1)  # for await_arrivals in the process hosting it
    return store


def await_arrivals(rendezvous: str, count: int, stop: Callable[[], bool],
                   poll: float = 0.05) -> bool:
    """Wait until ``count`` workers have connected to the store this process hosts.

    Creating a process group waits for the peers inside C++, where Python runs no
    signal handlers: a SIGINT that arrives while the other ranks are still starting
    (importing torch takes seconds, more on a busy machine) would wait with it. This
    wait is a Python loop instead, so a signal raises at once, and it ends early when
    ``stop()`` is true (a worker exited before connecting).

    Returns whether they all arrived: false when ``stop()`` ended the wait, when the
    store's own timeout passed first, or when this process hosts no store at
    ``rendezvous``.
    """
    _, _, port = rendezvous.rpartition(":")
    hosted = _HOSTED.get(int(port)) if port.isdigit() else None
    if hosted is None or hosted[0] != os.getpid():
        return False
    store = hosted[1]
    timeout: datetime.timedelta = store.timeout  # type: ignore[attr-defined]  # not in the stubs
    deadline = time.monotonic() + timeout.total_seconds()
    while store.add(ARRIVALS_KEY, 0) < count:
        if stop() or time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def choose_rendezvous(num_nodes: int, main_address: str, main_port: int) -> tuple[str, bool]:
    """``("host:port", hosted)`` for a launch: one node hosts a store here on a port the
    kernel picks; several nodes must agree on a fixed address, served by global rank 0.
    """
    if num_nodes > 1:
        if not main_port:
            from interlock.strategies.launchers.base import LaunchError

            raise LaunchError(
                "a multi-node job started without a cluster launcher needs MASTER_ADDR and "
                "MASTER_PORT set identically on every node"
            )
        return f"{main_address}:{main_port}", False
    return host_store(main_address), True
