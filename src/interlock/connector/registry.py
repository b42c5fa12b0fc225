"""The strategy registry: built-in rows, registered rows and entry-point rows.

The part kinds (precisions, accelerators, cluster environments, launchers) have
registries of their own that work the same way
(:mod:`interlock.connector.parts_registry`); `registry_version` covers them all.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from interlock.connector import parts_registry
from interlock.connector.builtin import BUILTIN_STRATEGIES
from interlock.connector.registration import STRATEGY_GROUP, load_entry_point, scan_entry_points
from interlock.connector.registration import EntryPointStatus as EntryPointStatus
from interlock.connector.registration import RegistrationError as RegistrationError
from interlock.connector.spec_problems import expanded, spec_problems
from interlock.connector.specs import StrategyPreset, StrategySpec
from interlock.connector.tables import WITHDRAWN_ROWS

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

#: Entry point group third-party packages use to register strategies. The entry
#: point's object is a StrategySpec or StrategyPreset, a list or tuple of them, or a
#: callable taking no arguments that returns either.
ENTRY_POINT_GROUP = STRATEGY_GROUP


_specs: dict[str, StrategySpec] = {spec.name: spec for spec in BUILTIN_STRATEGIES}
_view: Mapping[str, StrategySpec] = MappingProxyType(_specs)
_lock = threading.Lock()
_entry_points_loaded = False
_entry_points: tuple[EntryPointStatus, ...] = ()
_version = 0


def registry_version() -> int:
    """A number that changes whenever the set of strategies, or the rows of any part
    kind (`interlock.connector.parts_registry.parts_version`), change."""
    return _version + parts_registry.parts_version()


def register_strategy(spec: StrategySpec | StrategyPreset, *,
                      source: str = "register_strategy()") -> None:
    """Add a strategy to the registry so that `plan()` and the docs know it.

    Args:
        spec: the strategy's declaration, or a preset: a name for a registered
            strategy under a launcher and options (expanded into a full row).
        source: where the spec comes from, named in errors.

    Raises:
        RegistrationError: the spec is malformed or its name is taken.
    """
    _register(spec, source)


def _register(row: object, source: str) -> None:
    global _version
    with _lock:
        spec, problem = _checked(row, source, _specs)
        if spec is None:
            raise RegistrationError(problem)
        if spec.name not in _specs:
            _specs[spec.name] = spec
            _version += 1


def _checked(row: object, source: str, taken: Mapping[str, StrategySpec]
             ) -> tuple[StrategySpec | None, str]:
    """``row`` as the spec it registers (a preset expanded), or None with why it
    cannot be registered next to the specs in ``taken``."""
    spec, problems = expanded(row, taken)
    name = getattr(row, "name", "?")
    if spec is None:
        problems = problems or [f"expected a StrategySpec or StrategyPreset, got "
                                f"{type(row).__name__}"]
        return None, f"cannot register strategy {name!r} from {source}: " + "; ".join(problems)
    problem = _refusal(spec, source, taken)
    return (None, problem) if problem is not None else (spec, "")


def _refusal(spec: StrategySpec, source: str, taken: Mapping[str, StrategySpec]
             ) -> str | None:
    """Why ``spec`` cannot be registered next to the specs in ``taken``, or None."""
    problems = spec_problems(spec)
    if problems:
        return f"cannot register strategy {spec.name!r} from {source}: " + "; ".join(problems)
    if spec.name in WITHDRAWN_ROWS:
        return (f"cannot register strategy {spec.name!r} from {source}: the name is "
                "withdrawn on purpose; choose another")
    existing = taken.get(spec.name)
    if existing is not None and existing != spec:
        return (f"cannot register strategy {spec.name!r} from {source}: the name is "
                f"already taken by {existing.factory}")
    return None


def unregister_strategy(name: str) -> None:
    """Remove a non-built-in strategy (for tests and plugin reloads)."""
    if any(spec.name == name for spec in BUILTIN_STRATEGIES):
        raise RegistrationError(f"cannot unregister built-in strategy {name!r}")
    global _version
    with _lock:
        if _specs.pop(name, None) is not None:
            _version += 1


def strategy_specs() -> Mapping[str, StrategySpec]:
    """A read-only view of every known strategy, entry points included (a broken
    entry point contributes nothing; see `strategy_entry_points`)."""
    if not _entry_points_loaded:
        _load_entry_points()
    return _view


def strategy_entry_points() -> tuple[EntryPointStatus, ...]:
    """Every ``interlock.strategies`` entry point found, loaded or broken."""
    if not _entry_points_loaded:
        _load_entry_points()
    return _entry_points


def broken_entry_points() -> tuple[EntryPointStatus, ...]:
    """The entry points that failed to load (their strategies are unavailable)."""
    return tuple(ep for ep in strategy_entry_points() if ep.broken)


def _load_entry_points() -> None:
    # A broken plugin is contained, not hidden: its entry point is recorded with the
    # error, a warning is emitted once, and plan() refuses the names it stands for with
    # that error (`broken-entry-point`); every other strategy still resolves.
    global _entry_points_loaded, _entry_points, _version
    # one scan finds the part groups too: they load first, so that a strategy may
    # declare the precisions, accelerators and launchers a plugin registers
    groups = (*parts_registry.ENTRY_POINT_GROUPS.values(), ENTRY_POINT_GROUP)
    scanned = scan_entry_points(groups)
    parts_registry.load_entry_points(scanned)
    found = tuple(_load_entry_point(ep) for ep in scanned[ENTRY_POINT_GROUP])
    with _lock:
        _entry_points = found
        _entry_points_loaded = True
        _version += 1


def _load_entry_point(ep: EntryPoint) -> EntryPointStatus:
    """Load one entry point and register its specs, all or none.

    Never raises for the plugin's faults: a failure to import it, an exception from
    its callable, a malformed spec or a name clash comes back as a broken status, and
    is warned about (once: entry points are loaded once per process).
    """
    return load_entry_point(ep, group=ENTRY_POINT_GROUP, noun="strategies", add=_add_all)


def _add_all(found: Sequence[object], source: str) -> None:
    """Register the specs of one entry point, all or none."""
    global _version
    with _lock:
        taken = dict(_specs)
        problems: list[str] = []
        for row in found:
            spec, problem = _checked(row, source, taken)
            if spec is None:
                problems.append(problem)
                continue
            taken.setdefault(spec.name, spec)
        if problems:
            raise RegistrationError("; ".join(problems))
        added = {n: s for n, s in taken.items() if n not in _specs}
        _specs.update(added)
        _version += bool(added)


# the part registries check the strategies a row names against the registered ones
parts_registry.use_strategies(lambda: _view)
