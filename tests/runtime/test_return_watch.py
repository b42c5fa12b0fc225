"""The return watcher (strategies/uneven.py) never outlives its rank's teardown.

A watcher thread still inside a store operation when the interpreter shuts down ends
the process with SIGABRT as that operation returns: a rank that finished its work
would be reported as killed by a signal. So teardown waits for the watcher, and the
watcher stops by itself when the main thread ends without a teardown."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
import torch.distributed as dist

from interlock.strategies import uneven


def _serve(conn: Connection) -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, True,
                          timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    conn.send(int(store.port))
    time.sleep(120)


@pytest.fixture
def server() -> Iterator[tuple[int, int]]:
    """A store served by another process: ``(pid, port)``; the process can be stopped."""
    parent, child = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=_serve, args=(child,),
                                                          daemon=True)
    process.start()
    pid = process.pid
    assert pid is not None
    try:
        assert parent.poll(30), "the store server did not start"
        yield pid, int(parent.recv())
    finally:
        os.kill(pid, signal.SIGCONT)
        process.kill()
        process.join(10)


@pytest.mark.timeout(60)
def test_teardown_waits_for_a_watcher_whose_store_is_slow_to_answer(
        server: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    pid, port = server
    # the process group's store (the watcher makes its own client of it)
    store = dist.TCPStore("127.0.0.1", port, None, False,
                          timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(uneven, "POLL_S", 0.05)
    watch = uneven.ReturnWatch(rank=0, world_size=2)
    watch.start()
    watcher = watch._thread
    assert watcher is not None and watcher.is_alive()
    time.sleep(0.3)  # it polls the store a few times
    os.kill(pid, signal.SIGSTOP)  # its next poll waits for an answer
    time.sleep(0.3)
    teardown = threading.Thread(target=watch.stop)
    teardown.start()
    teardown.join(3 * uneven.POLL_S + 3)
    stopped_early = not teardown.is_alive()
    os.kill(pid, signal.SIGCONT)  # the answer comes
    teardown.join(30)
    assert not stopped_early, "teardown returned while the watcher waited in the store"
    assert not teardown.is_alive(), "teardown did not return once the store answered"
    assert not watcher.is_alive()
    store.set("still", "usable")  # the process group's own client was not disturbed
    assert store.get("still") == b"usable"


#: a rank that sets up the watcher and ends without tearing down
_UNTORN = """
import datetime, sys
import torch.distributed as dist
from interlock.strategies import uneven
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False,
                      timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
dist.distributed_c10d._get_default_store = lambda: store
uneven.POLL_S = 0.05
uneven.ReturnWatch(rank=0, world_size=2).start()
"""


@pytest.mark.timeout(60)
def test_a_rank_that_ends_without_teardown_exits_cleanly(server: tuple[int, int]) -> None:
    """The interpreter waits for the watcher (not a daemon, see above); the watcher
    must notice that the main thread has ended and stop."""
    _, port = server
    done = subprocess.run([sys.executable, "-c", _UNTORN, str(port)], capture_output=True,
                          text=True, timeout=45)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
