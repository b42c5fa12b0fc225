"""interlock: training flags in, a validated distributed setup (or one clear error) out."""

from typing import TYPE_CHECKING

from interlock.checkpoints import Checkpoint, CheckpointManager
from interlock.deprecation import InterlockDeprecationWarning
from interlock.engine.errors import ERROR_CODES, ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.memory import MemoryEstimate, MemoryTraits
from interlock.engine.model import ModelShape
from interlock.engine.optimizers import OptimizerRow
from interlock.engine.parallelism import MeshLayout, Parallelism
from interlock.engine.planner import Plan, plan
from interlock.engine.registration import RegistrationError
from interlock.engine.registry import register, registered, unregister
from interlock.engine.retired_verbs import retired
from interlock.engine.specs import StrategyPreset, StrategySpec
from interlock.engine.tables import (
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PackageRow,
    PrecisionRow,
)
from interlock.engine.trace import TraceStep
from interlock.resolving import resolve
from interlock.seeding import seed_everything
from interlock.shapes import model_shape
from interlock.strategies.rank_zero import rank_zero_logger

#: the registry's verbs before 0.2.0 (``register_precision``, ``strategy_specs``, ...):
#: they still work for one release, and warn with the verb that replaces each
if not TYPE_CHECKING:  # type checkers keep refusing names the package does not have
    __getattr__ = retired(__name__)

#: The package version, ``major.minor.patch``.
__version__ = "0.1.0"

__all__ = [
    "ERROR_CODES",
    "AcceleratorRow",
    "Checkpoint",
    "CheckpointIORow",
    "CheckpointManager",
    "ClusterRow",
    "InterlockDeprecationWarning",
    "LauncherRow",
    "Machine",
    "MemoryEstimate",
    "MemoryTraits",
    "MeshLayout",
    "ModelShape",
    "OptimizerRow",
    "PackageRow",
    "Parallelism",
    "Plan",
    "PrecisionRow",
    "RegistrationError",
    "ResolutionError",
    "StrategyPreset",
    "StrategySpec",
    "TraceStep",
    "__version__",
    "model_shape",
    "plan",
    "rank_zero_logger",
    "register",
    "registered",
    "resolve",
    "seed_everything",
    "unregister",
]
