"""The rendezvous store: bound once by the launching process, never re-picked.

Choosing a free port by binding, closing and handing the number on races with every
other process on the machine (and with pytest-xdist workers). Instead the launching
process binds a TCPStore to port 0 and keeps it open; the kernel's choice is handed to
the workers, which connect as clients.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

_HOSTED: dict[int, tuple[int, dist.TCPStore]] = {}


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
    return dist.TCPStore(host, port, None, serve, timeout=timeout, wait_for_workers=False)


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
