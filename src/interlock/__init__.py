"""interlock: training flags in, a validated distributed setup (or one clear error) out."""

from interlock.connector import (
    ERROR_CODES,
    Machine,
    Plan,
    RegistrationError,
    ResolutionError,
    StrategySpec,
    TraceStep,
    plan,
    register_strategy,
    resolve,
    strategy_specs,
    unregister_strategy,
)

__version__ = "0.1.0"

__all__ = [
    "ERROR_CODES",
    "Machine",
    "Plan",
    "RegistrationError",
    "ResolutionError",
    "StrategySpec",
    "TraceStep",
    "__version__",
    "plan",
    "register_strategy",
    "resolve",
    "strategy_specs",
    "unregister_strategy",
]
