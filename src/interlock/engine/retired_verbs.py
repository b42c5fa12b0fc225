"""The registry's verbs before 0.2.0, one set per kind of row, kept for one release.

``interlock.register_precision(row)`` and its 23 siblings still work and warn
(`interlock.InterlockDeprecationWarning`) when read from `interlock`; each says which
of the three verbs replaces it: ``interlock.register(row)``,
``interlock.unregister(RowType, name)`` or ``interlock.registered(RowType)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from interlock.engine.deprecation import deprecated_names
from interlock.engine.optimizers import OptimizerRow
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

#: each kind's word in the old verbs, and its row type
_NOUNS: tuple[tuple[str, type, str], ...] = (
    ("strategy", StrategySpec, "strategy_specs"),
    ("precision", PrecisionRow, "precision_rows"),
    ("accelerator", AcceleratorRow, "accelerator_rows"),
    ("checkpoint_io", CheckpointIORow, "checkpoint_io_rows"),
    ("environment", ClusterRow, "environment_rows"),
    ("launcher", LauncherRow, "launcher_rows"),
    ("package", PackageRow, "package_rows"),
    ("optimizer", OptimizerRow, "optimizer_rows"),
)


def _register_as(noun: str, row_type: type) -> Callable[..., None]:
    accepted = (row_type, StrategyPreset) if row_type is StrategySpec else (row_type,)

    def register_row(row: object, *, source: str = f"register_{noun}()") -> None:
        if not isinstance(row, accepted):
            raise RegistrationError(
                f"cannot register {noun} {getattr(row, 'name', '?')!r} from {source}: "
                f"expected a {' or '.join(t.__name__ for t in accepted)}, got "
                f"{type(row).__name__}")
        register(row, source=source)

    register_row.__name__ = register_row.__qualname__ = f"register_{noun}"
    return register_row


def _unregister_as(noun: str, row_type: type) -> Callable[[str], None]:
    def unregister_row(name: str) -> None:
        unregister(row_type, name)

    unregister_row.__name__ = unregister_row.__qualname__ = f"unregister_{noun}"
    return unregister_row


def _view_of(view: str, row_type: type) -> Callable[[], Mapping[str, Any]]:
    def rows() -> Mapping[str, Any]:
        return registered(row_type)

    rows.__name__ = rows.__qualname__ = view
    return rows


#: every retired verb: the function, and what replaces it
RETIRED: Mapping[str, tuple[Callable[..., Any], str]] = {
    name: entry
    for noun, row_type, view in _NOUNS
    for name, entry in (
        (f"register_{noun}", (_register_as(noun, row_type), "interlock.register(row)")),
        (f"unregister_{noun}", (_unregister_as(noun, row_type),
                                f"interlock.unregister({row_type.__name__}, name)")),
        (view, (_view_of(view, row_type), f"interlock.registered({row_type.__name__})")),
    )
}

SINCE = "0.2.0"


def retired(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that hands out the retired verbs, warning with the verb
    that replaces each."""
    return deprecated_names(module, RETIRED.get, since=SINCE)
