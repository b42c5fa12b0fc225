"""The resolution engine: typed rule stages over the compatibility tables.

It knows the strategies only as their rows' ``"module:Class"`` factory strings and never
imports the runtime; :func:`interlock.resolve` hands its `Plan` to the builder that
lives with the strategies.
"""

from typing import TYPE_CHECKING

from interlock.connector.errors import ERROR_CODES, ResolutionError
from interlock.connector.machine import Machine
from interlock.connector.memory import MemoryEstimate, MemoryTraits
from interlock.connector.model import ModelShape
from interlock.connector.optimizers import OptimizerRow
from interlock.connector.parallelism import MeshLayout, Parallelism
from interlock.connector.planner import STAGES, Plan, plan
from interlock.connector.registration import RegistrationError
from interlock.connector.registry import register, registered, unregister
from interlock.connector.retired_verbs import retired
from interlock.connector.specs import StrategyPreset, StrategySpec
from interlock.connector.tables import (
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PackageRow,
    PrecisionRow,
)
from interlock.connector.trace import TraceStep

#: the registry's verbs before 0.2.0: they still work for one release, and warn
if not TYPE_CHECKING:  # type checkers keep refusing names the package does not have
    __getattr__ = retired(__name__)

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
