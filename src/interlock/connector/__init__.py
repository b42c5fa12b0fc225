"""The engine's import path before 0.2.0: the engine is `interlock.engine` now.

``import interlock.connector`` and ``import interlock.connector.<module>`` keep working
for one release and warn once (`interlock.InterlockDeprecationWarning`). Each old module
name gives the very module of the new path (``parts`` is ``runtime_queries`` now), so
classes, registries and memos are shared: ``interlock.connector.errors.ResolutionError
is interlock.engine.errors.ResolutionError``. The registry's verbs before 0.2.0
(``register_precision`` and the rest) still answer here too, with their own warning, and
``python -m interlock.connector.<module>`` runs the new module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import TYPE_CHECKING

from interlock.engine.deprecation import warn_deprecated
from interlock.engine.errors import ERROR_CODES, ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.memory import MemoryEstimate, MemoryTraits
from interlock.engine.model import ModelShape
from interlock.engine.optimizers import OptimizerRow
from interlock.engine.parallelism import MeshLayout, Parallelism
from interlock.engine.planner import STAGES, Plan, plan
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

_OLD, _NEW = __name__, "interlock.engine"
#: modules that also changed their own name when the engine moved: old -> new
_RENAMED = {"parts": "runtime_queries"}


def _new_name(old: str) -> str:
    """``interlock.engine.<module>`` for ``interlock.connector.<module>``."""
    head, dot, tail = old[len(_OLD) + 1:].partition(".")
    return f"{_NEW}.{_RENAMED.get(head, head)}{dot}{tail}"


class _SameModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``interlock.connector.<name>`` as the module ``interlock.engine.<name>``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD + "."):
            return None
        new = _new_name(fullname)
        if importlib.util.find_spec(new) is None:
            return None  # no such module: the usual ModuleNotFoundError
        return importlib.machinery.ModuleSpec(fullname, self, loader_state=new)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(str(spec.loader_state))
        spec.loader_state = module.__spec__  # the import system replaces it: put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and isinstance(spec.loader_state, importlib.machinery.ModuleSpec):
            module.__spec__ = spec.loader_state

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code: what ``python -m interlock.connector.<module>`` runs."""
        spec = importlib.util.find_spec(_new_name(fullname))
        loader = spec.loader if spec is not None else None
        if isinstance(loader, importlib.abc.InspectLoader):
            return loader.get_code(_new_name(fullname))
        return None


if not any(isinstance(finder, _SameModule) for finder in sys.meta_path):
    sys.meta_path.insert(0, _SameModule())  # before the path finder, or it loads a copy

warn_deprecated("interlock.connector", replacement="interlock.engine", since="0.2.0")

if not TYPE_CHECKING:  # type checkers keep refusing names the package does not have
    __getattr__ = retired(__name__)

#: the names the old path exported, as before
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
