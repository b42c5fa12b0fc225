"""The resolution engine: typed rule stages over the compatibility tables.

It knows the strategies only as their rows' ``"module:Class"`` factory strings and never
imports the runtime; :func:`interlock.resolve` hands its `Plan` to the builder that
lives with the strategies.
"""

from interlock.connector.errors import ERROR_CODES, ResolutionError
from interlock.connector.machine import Machine
from interlock.connector.memory import MemoryEstimate, MemoryTraits
from interlock.connector.model import ModelShape
from interlock.connector.optimizers import OptimizerRow
from interlock.connector.parallelism import MeshLayout, Parallelism
from interlock.connector.parts_registry import (
    accelerator_rows,
    checkpoint_io_rows,
    environment_rows,
    launcher_rows,
    optimizer_rows,
    package_rows,
    precision_rows,
    register_accelerator,
    register_checkpoint_io,
    register_environment,
    register_launcher,
    register_optimizer,
    register_package,
    register_precision,
    unregister_accelerator,
    unregister_checkpoint_io,
    unregister_environment,
    unregister_launcher,
    unregister_optimizer,
    unregister_package,
    unregister_precision,
)
from interlock.connector.planner import STAGES, Plan, plan
from interlock.connector.registry import (
    RegistrationError,
    register_strategy,
    strategy_specs,
    unregister_strategy,
)
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
    "accelerator_rows",
    "checkpoint_io_rows",
    "environment_rows",
    "launcher_rows",
    "optimizer_rows",
    "package_rows",
    "plan",
    "precision_rows",
    "register_accelerator",
    "register_checkpoint_io",
    "register_environment",
    "register_launcher",
    "register_optimizer",
    "register_package",
    "register_precision",
    "register_strategy",
    "strategy_specs",
    "unregister_accelerator",
    "unregister_checkpoint_io",
    "unregister_environment",
    "unregister_launcher",
    "unregister_optimizer",
    "unregister_package",
    "unregister_precision",
    "unregister_strategy",
]
