"""The resolution engine: typed rule stages over the compatibility tables."""

from interlock.connector.errors import ERROR_CODES, ResolutionError
from interlock.connector.machine import Machine
from interlock.connector.planner import STAGES, Plan, plan, resolve
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
    "resolve",
    "strategy_specs",
    "unregister_strategy",
]
