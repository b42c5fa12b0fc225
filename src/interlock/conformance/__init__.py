"""The conformance suite: what every strategy must do, checked in real processes.

Run it with ``interlock conformance --strategy NAME`` or ``pytest --pyargs
interlock.conformance --interlock-strategy NAME``; ``docs/conformance.md`` says what
each check guarantees.

The check table is imported on first use: comparing two reports
(`interlock.conformance.compare`) imports neither torch nor pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interlock.conformance.table import CHECKS, Check

__all__ = ["CHECKS", "Check"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from interlock.conformance import table

        return getattr(table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
