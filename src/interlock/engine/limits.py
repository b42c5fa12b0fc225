"""Upper bounds on the numbers a plan may hold, and why each is where it is.

Every count the engine accepts (devices per node, device ids, nodes, the world size,
a simulated `Machine`'s device counts) is checked against these bounds before
anything is enumerated, so a mistyped or
hostile number (``devices=10**100``, ``num_nodes=2**62``, a 5,000-digit string) is
refused in microseconds with an error naming the bound, instead of exhausting memory
or time. The bounds sit well above the largest machines that exist today; raising
one later is a one-line change that refuses nothing that used to work.
"""

from __future__ import annotations

import math
import reprlib

#: Devices (processes) on one node, and one more than the highest device id.
#:
#: The largest accelerator hosts have tens of devices (8 or 16 GPUs per server; a TPU
#: host addresses 4 to 8 chips). On ``cpu`` the devices flag counts processes, and the
#: largest single-system-image hosts have a few thousand hardware threads (a 32-socket
#: server with 896 cores runs 1,792 threads), so the bound is set by them: 4,096, with
#: room to spare.
MAX_DEVICES_PER_NODE = 4096

#: Nodes in one job.
#:
#: The machine with the most nodes is Fugaku, with 158,976; the largest GPU clusters
#: have a few tens of thousands of nodes. 262,144 (2**18) is above all of them.
MAX_NUM_NODES = 262_144

#: Processes in one job (devices per node x nodes).
#:
#: One process per core on all of Fugaku would be 7,630,848 processes, more than any
#: training job has used; 8,388,608 (2**23) is above that. Both factors can be within
#: their own bounds while the product is not (4,096 x 262,144 = 2**30), so the
#: product has a bound of its own.
MAX_WORLD_SIZE = 8_388_608

#: Characters in a devices string. The list of every id below the bound on devices
#: per node ("0,1,...,4095") has 19,369; a string over three times as long holds more
#: ids, or padding no one types, and is refused by its length before it is read.
MAX_DEVICES_TEXT = 65_536


def int_in(value: object, lo: int, hi: float = math.inf) -> bool:
    """Whether ``value`` is an int (a bool is not one) from ``lo`` to ``hi``."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


class _ShortRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 64:
            return f"<{'-' if x < 0 else ''}int of about {int(x.bit_length() * 0.30103)} digits>"
        return repr(x)


_REPR = _ShortRepr()
_REPR.maxstring = _REPR.maxother = 200
_REPR.maxlist = _REPR.maxtuple = 32


def short_repr(value: object) -> str:
    """``repr(value)`` for messages that quote a value, cut short when it is long.

    Ordinary values read as their ``repr``. An absurd value (a list of a million ids,
    a 5,000-digit int or string) is shown by its start and its size, never converted
    in full: Python refuses to turn an int of more than 4,300 digits into text at all.
    """
    kind = type(value)
    if kind is int and -(1 << 63) < value < (1 << 63):  # type: ignore[operator]
        return repr(value)  # what reprlib gives, without its dispatch
    if kind is str and len(value) <= _REPR.maxstring:  # type: ignore[arg-type]
        text = repr(value)
        if len(text) <= _REPR.maxstring:
            return text  # reprlib cuts only a longer repr
    text = _REPR.repr(value)
    if isinstance(value, (str, list, tuple)) and len(value) > (
            _REPR.maxstring if isinstance(value, str) else _REPR.maxlist):
        text += f" (length {len(value)})"
    return text


__all__ = [
    "MAX_DEVICES_PER_NODE",
    "MAX_DEVICES_TEXT",
    "MAX_NUM_NODES",
    "MAX_WORLD_SIZE",
    "short_repr",
]
