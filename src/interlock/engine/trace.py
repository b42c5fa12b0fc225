"""`TraceStep`: one applied rule, as recorded in a Plan or a ResolutionError."""

from __future__ import annotations

from typing import NamedTuple


class TraceStep(NamedTuple):
    """One applied rule: which stage and decision, the rule id, and why.

    A named tuple rather than a dataclass: a plan records about twenty of these, and
    building a tuple costs a fraction of a frozen dataclass.
    """

    stage: str
    decision: str
    rule: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return dict(self._asdict())
