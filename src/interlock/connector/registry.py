"""The strategy registry: built-in rows, registered rows and entry-point rows."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType

from interlock.connector.builtin import BUILTIN_STRATEGIES
from interlock.connector.specs import StrategySpec, spec_problems
from interlock.connector.tables import WITHDRAWN_ROWS

#: Entry point group third-party packages use to register a StrategySpec (or a
#: callable returning one or several).
ENTRY_POINT_GROUP = "interlock.strategies"


class RegistrationError(ValueError):
    """A strategy spec that cannot be registered, and why."""


_specs: dict[str, StrategySpec] = {spec.name: spec for spec in BUILTIN_STRATEGIES}
_view: Mapping[str, StrategySpec] = MappingProxyType(_specs)
_lock = threading.Lock()
_entry_points_loaded = False
_version = 0


def registry_version() -> int:
    """A number that changes whenever the set of strategies changes."""
    return _version


def register_strategy(spec: StrategySpec, *, source: str = "register_strategy()") -> None:
    """Add a strategy to the registry so that `plan()` and the docs know it.

    Args:
        spec: the strategy's declaration.
        source: where the spec comes from, named in errors.

    Raises:
        RegistrationError: the spec is malformed or its name is taken.
    """
    _register(spec, source)


def _register(spec: object, source: str) -> None:
    global _version
    problems = spec_problems(spec)
    if problems or not isinstance(spec, StrategySpec):
        name = getattr(spec, "name", "?")
        raise RegistrationError(
            f"cannot register strategy {name!r} from {source}: " + "; ".join(problems)
        )
    with _lock:
        if spec.name in WITHDRAWN_ROWS:
            raise RegistrationError(
                f"cannot register strategy {spec.name!r} from {source}: the name is "
                "withdrawn on purpose; choose another"
            )
        existing = _specs.get(spec.name)
        if existing is not None and existing != spec:
            raise RegistrationError(
                f"cannot register strategy {spec.name!r} from {source}: the name is "
                f"already taken by {existing.factory}"
            )
        if existing is None:
            _specs[spec.name] = spec
            _version += 1


def unregister_strategy(name: str) -> None:
    """Remove a non-built-in strategy (for tests and plugin reloads)."""
    if any(spec.name == name for spec in BUILTIN_STRATEGIES):
        raise RegistrationError(f"cannot unregister built-in strategy {name!r}")
    global _version
    with _lock:
        if _specs.pop(name, None) is not None:
            _version += 1


def strategy_specs() -> Mapping[str, StrategySpec]:
    """A read-only view of every known strategy, entry points included."""
    if not _entry_points_loaded:
        _load_entry_points()
    return _view


def _load_entry_points() -> None:
    # A broken plugin raises on every call until it is fixed or uninstalled, so
    # that it is never silently missing from plans.
    global _entry_points_loaded
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        source = f"entry point {ep.name!r} ({ep.value})"
        try:
            loaded = ep.load()
            found = loaded() if callable(loaded) else loaded
        except Exception as exc:
            raise RegistrationError(f"cannot load {source}: {exc!r}") from exc
        specs = found if isinstance(found, (list, tuple)) else (found,)
        for spec in specs:
            _register(spec, source)
    _entry_points_loaded = True
