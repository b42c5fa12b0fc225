"""The resolution engine: typed rule stages over the compatibility tables.

It knows the strategies only as their rows' ``"module:Class"`` factory strings and never
imports the runtime; :func:`interlock.resolve` hands its `Plan` to the builder that
lives with the strategies.
"""

from interlock.connector.errors import ERROR_CODES, ResolutionError
from interlock.connector.machine import Machine
from interlock.connector.planner import STAGES, Plan, plan
from interlock.connector.registry import (
    RegistrationError,
    register_strategy,
    strategy_specs,
    unregister_strategy,
)
from interlock.connector.specs import StrategySpec
from interlock.connector.trace import TraceStep

__all__ = [
    "ERROR_CODES",
    "STAGES",
    "Machine",
    "Plan",
    "RegistrationError",
    "ResolutionError",
    "StrategySpec",
    "TraceStep",
    "plan",
    "register_strategy",
    "strategy_specs",
    "unregister_strategy",
]
