"""The conformance suite: what every strategy must do, checked in real processes.

Run it with ``interlock conformance --strategy NAME`` or ``pytest --pyargs
interlock.conformance --interlock-strategy NAME``; ``docs/conformance.md`` says what
each check guarantees.
"""

from __future__ import annotations

from interlock.conformance.table import CHECKS, Check

__all__ = ["CHECKS", "Check"]
