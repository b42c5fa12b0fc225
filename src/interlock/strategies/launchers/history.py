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
from pathlib import Path
from typing import Any

from interlock.strategies.launchers.base import RENDEZVOUS_ENV

#: the index of the launch a script-launcher child was started for
LAUNCH_INDEX_ENV = "INTERLOCK_LAUNCH_INDEX"
#: a file with the outcomes of rank 0's launches before that one
LAUNCH_HISTORY_ENV = "INTERLOCK_LAUNCH_HISTORY"

#: an outcome: ("returned", value), ("raised", the pickled exception) or
#: ("unavailable", reason)
Outcome = tuple[str, Any]

_outcomes: list[Outcome] = []
_current: int | None = None
_replayed: list[Outcome] | None = None


def begin() -> int:
    """Number the launch that starts now (0 for the process's first)."""
    global _current
    _current = len(_outcomes)
    _outcomes.append(("unavailable", "the launch did not finish"))
    return _current


def current() -> int:
    """The index of the launch in progress; a launcher used directly, not through
    ``Strategy.launch``, begins one."""
    if _current is None:
        return begin()
    return _current


def finish(index: int, outcome: Outcome) -> None:
    """Record how launch ``index`` ended, for the children of later launches.

    An exception is kept pickled: the object itself would keep its traceback's frames
    (and whatever they reference) alive for the rest of the process.
    """
    kind, value = outcome
    if kind == "raised":
        try:
            value = pickle.dumps(value)
        except Exception as error:  # an exception that does not pickle
            kind, value = "unavailable", f"{type(value).__name__} does not pickle: {error}"
    _outcomes[index] = (kind, value)
    global _current
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
    kind, value = _replayed[index] if index < len(_replayed) else ("unavailable", None)
    if kind == "returned":
        return value
    if kind == "raised" and isinstance(value, bytes):
        raise pickle.loads(value)
    return None  # rank 0's outcome could not be handed over; the script sees None


def write(directory: Path, upto: int) -> Path:
    """Write the outcomes of launches ``0..upto-1`` for children to replay."""
    outcomes: list[Outcome] = []
    for kind, value in _outcomes[:upto]:
        if kind == "returned":
            try:
                pickle.dumps(value)
            except Exception as error:  # any value that does not pickle
                kind, value = "unavailable", f"{type(value).__name__} does not pickle: {error}"
        outcomes.append((kind, value))
    path = directory / "launch-history.pkl"
    path.write_bytes(pickle.dumps(outcomes))
    return path
