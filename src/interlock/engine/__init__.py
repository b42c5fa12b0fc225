"""The resolution engine: typed rule stages over the compatibility tables.

It knows the strategies only as their rows' ``"module:Class"`` factory strings and never
imports the runtime; :func:`interlock.resolve` hands its `Plan` to the builder that
lives with the strategies.
"""

from interlock.engine.errors import ERROR_CODES, ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.memory import MemoryEstimate, MemoryTraits
from interlock.engine.model import ModelShape
from interlock.engine.optimizers import OptimizerRow
from interlock.engine.parallelism import MeshLayout, Parallelism
from interlock.engine.planner import STAGES, Plan, plan
from interlock.engine.registration import RegistrationError
from interlock.engine.registry import register, registered, unregister
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

__all__ = [
    "ERROR_CODES",
    "STAGES",
    "AcceleratorRow",
    "CheckpointIORow",
    "ClusterRow",
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
    "plan",
    "register",
    "registered",
    "unregister",
]
