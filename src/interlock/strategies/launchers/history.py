"""Which launch of the script this is, and what rank 0's earlier launches returned.

The script launcher starts ranks 1..N-1 by running the user's script again. Such a
child runs the script from the top, so it meets every ``launch()`` that came before
the one it was started for, whatever strategy or launcher those used. It must not run
them (they were served by their own processes), and the script must see the same
values it saw in rank 0, or the child could take another path through the script and
never reach its own launch. So every launch in a process is numbered, rank 0 hands
its children the outcomes of its earlier launches (results, or the exceptions they
raised), and a child replays those instead of running them.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

from interlock.strategies.launchers.base import RENDEZVOUS_ENV, LaunchError

#: the index of the launch a script-launcher child was started for
LAUNCH_INDEX_ENV = "INTERLOCK_LAUNCH_INDEX"
#: a file with the outcomes of rank 0's launches before that one
LAUNCH_HISTORY_ENV = "INTERLOCK_LAUNCH_HISTORY"

#: rank 0's outcome of a launch: ("returned", pickled value), ("raised", pickled
#: exception) or ("unavailable", why), pickled when the launch ends, so a later change
#: to the returned object is not replayed, and no traceback keeps frames alive
Outcome = tuple[str, Any]

#: a returned value larger than this, pickled, is not kept for replay
MAX_KEPT_BYTES = 64 * 2**20

_outcomes: list[tuple[str, bytes | str]] = []
_current: int | None = None
_replayed: list[tuple[str, bytes | str]] | None = None


def begin() -> int:
    """Number the launch that starts now (0 for the process's first)."""
    global _current
    _current = len(_outcomes)
    _outcomes.append(("unavailable", "the launch did not finish"))
    return _current


def in_progress() -> int | None:
    """The index of the launch in progress, or None outside any launch."""
    return _current


def finish(index: int, outcome: Outcome) -> None:
    """Record how launch ``index`` ended, for the children of later launches."""
    global _current
    kind, value = outcome
    kept: tuple[str, bytes | str]
    if kind in ("returned", "raised"):
        try:
            data = pickle.dumps(value)
        except Exception as error:  # a value that does not pickle
            kept = ("unavailable", f"{type(value).__name__} does not pickle: {error}")
        else:
            kept = (kind, data) if kind == "raised" or len(data) <= MAX_KEPT_BYTES else (
                "unavailable", f"the result is {len(data)} bytes pickled, more than the "
                f"{MAX_KEPT_BYTES} kept for replay")
    else:
        kept = ("unavailable", str(value))
    _outcomes[index] = kept
    if _current == index:
        _current = None


def is_script_child() -> bool:
    """Whether this process is a rank the script launcher started by re-running the
    script (it knows the launch it was started for)."""
    return (LAUNCH_INDEX_ENV in os.environ and RENDEZVOUS_ENV in os.environ
            and "LOCAL_RANK" in os.environ)


def target() -> int:
    """The launch this script-launcher child was started for."""
    return int(os.environ.get(LAUNCH_INDEX_ENV, "0"))


def replay(index: int) -> Any:
    """What rank 0's launch ``index`` returned (or raise what it raised)."""
    global _replayed
    if _replayed is None:
        path = os.environ.get(LAUNCH_HISTORY_ENV)
        _replayed = pickle.loads(Path(path).read_bytes()) if path else []
    kind, value = _replayed[index] if index < len(_replayed) else ("unavailable", "")
    if kind == "returned" and isinstance(value, bytes):
        return pickle.loads(value)
    if kind == "raised" and isinstance(value, bytes):
        try:
            error = pickle.loads(value)
        except Exception as problem:  # an exception class that cannot be rebuilt
            raise LaunchError(
                f"rank 0's launch {index} raised an exception that cannot be rebuilt in "
                f"this rank ({type(problem).__name__}: {problem})"
            ) from None
        raise error
    why = value if isinstance(value, str) and value else "unknown"
    print(f"interlock: rank 0's launch {index} result cannot be handed to this rank "
          f"({why}); the script sees None here", file=sys.stderr)
    return None


def write(directory: Path, upto: int) -> Path:
    """Write the outcomes of launches ``0..upto-1`` for children to replay."""
    path = directory / "launch-history.pkl"
    path.write_bytes(pickle.dumps(_outcomes[:upto]))
    return path
