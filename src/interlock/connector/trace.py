"""`TraceStep`: one applied rule, as recorded in a Plan or a ResolutionError."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceStep:
    """One applied rule: which stage and decision, the rule id, and why."""

    stage: str
    decision: str
    rule: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {
            "stage": self.stage,
            "decision": self.decision,
            "rule": self.rule,
            "reason": self.reason,
        }
