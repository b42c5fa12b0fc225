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
    strategy_specs,
    unregister_strategy,
)
from interlock.resolving import resolve
from interlock.seeding import seed_everything
from interlock.strategies.rank_zero import rank_zero_logger

#: The package version, ``major.minor.patch``.
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
    "rank_zero_logger",
    "register_strategy",
    "resolve",
    "seed_everything",
    "strategy_specs",
    "unregister_strategy",
]
