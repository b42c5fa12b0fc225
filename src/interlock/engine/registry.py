"""The registry: every kind of row the engine plans with, in one place.

=================  ================================  ===========================
kind               row                               entry point group
=================  ================================  ===========================
``packages``       `PackageRow`                      ``interlock.packages``
``precisions``     `PrecisionRow`                    ``interlock.precisions``
``checkpoint_io``  `CheckpointIORow`                 ``interlock.checkpoint_io``
``accelerators``   `AcceleratorRow`                  ``interlock.accelerators``
``environments``   `ClusterRow`                      ``interlock.environments``
``launchers``      `LauncherRow`                     ``interlock.launchers``
``optimizers``     `OptimizerRow`                    ``interlock.optimizers``
``strategies``     `StrategySpec`, `StrategyPreset`  ``interlock.strategies``
=================  ================================  ===========================

Three verbs serve every kind, keyed by the row's type: ``register(row)``,
``unregister(RowType, name)`` and ``registered(RowType)``, a read-only view of the
rows, built-in first, then registered ones in registration order. A kind is declared
by import strings (its row types, its built-in rows, the function that checks a row),
read on first use, so that the registry imports none of the modules that read it.

Built-in rows and entry points load together, on the first read of any kind, in the
order of the table, so that a row may refer to the rows of the kinds before it (an
accelerator names its precisions, a strategy its accelerators, precisions and
launcher). An entry point's object is a row, a list or tuple of rows, or a callable
taking no arguments that returns either; its rows are registered all or none, and a
broken one is recorded with the reason (`entry_points`), warned about once, and named
by the refusals it may explain.

One lock guards every kind and one counter, `registry_version`, changes whenever a row
of any kind is added or removed: the plan memo and the snapshot the rules read
(`current_parts`) are keyed by it.

Where the registered rows go:

* a registered accelerator comes after the built-in device kinds in
  ``accelerator='auto'`` (xla, mps, cuda, *registered in registration order*, cpu), so
  installing a plugin never changes what ``'auto'`` picks on a machine where a built-in
  accelerator is present; ``accelerator='<name>'`` asks for it directly. Its devices are
  counted in ``Machine.extra_devices[<name>]`` and placed like CUDA devices.
* a registered cluster environment with a ``detect`` predicate is tried after the
  built-in detectors of specific clusters (torchelastic, SLURM, Kubeflow, LSF, MPI) and
  before the catch-alls (``external``, the SLURM fallbacks and ``local``), in
  registration order. A plugin environment that must win is passed as a cluster
  environment plugin instance.
* a registered optional package may be named in the ``requires`` of the rows that
  come after it; a strategy that needs it is refused with ``missing-package`` and the
  row's install hint where it is absent.
* a registered precision runs on the accelerators its row names and on the
  accelerators whose row names it; it is taken by the strategies its row names (a
  preset or variant follows the strategy it names) and by those whose spec lists it.
* a registered launcher that names strategies may be chosen for them with
  ``launcher=``; a `StrategyPreset` names a strategy under a launcher.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, TypeVar, cast

from interlock.engine.limits import short_repr
from interlock.engine.part_problems import Known
from interlock.engine.part_tables import PartTables, take_snapshot
from interlock.engine.registration import (
    EntryPointStatus,
    RegistrationError,
    load_entry_point,
    scan_entry_points,
)

R = TypeVar("R")


def _load(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


class RowKind:
    """The rows of one kind: its declaration (import strings, read on first use) and
    its rows, built-in first, then registered ones in registration order."""

    def __init__(self, *, kind: str, noun: str, row_types: tuple[str, ...], builtin: str,
                 check: str, planned_as: str | None, expand: str | None = None,
                 plural: str | None = None) -> None:
        self.kind = kind
        #: the `Plan` attribute that names the row a plan chose (`Plan.rows` reads
        #: it); None for a kind no plan chooses a row of
        self.planned_as = planned_as
        #: what one row is, in messages ("precision", "cluster environment")
        self.noun = noun
        self.plural = plural or f"{noun}s"
        #: the entry point group
        self.group = f"interlock.{kind}"
        #: ``"module:Class"`` of each type a row of this kind may have; the first is the
        #: type `registered` returns (the others expand into it)
        self.row_types = row_types
        self._builtin = builtin
        self._check = check
        self._expand = expand
        self.rows: dict[str, Any] = {}
        #: a read-only view of every row, entry points included
        self.view: Mapping[str, Any] = MappingProxyType(self.rows)
        self.builtin_names: frozenset[str] = frozenset()
        #: what became of each entry point of the group
        self.entry_points: tuple[EntryPointStatus, ...] = ()

    def types(self) -> tuple[type, ...]:
        return tuple(_load(reference) for reference in self.row_types)

    def load_builtin(self) -> None:
        """Put the built-in rows first (once; rows registered meanwhile keep their
        place after them)."""
        builtin: tuple[Any, ...] = _load(self._builtin)
        added = {n: r for n, r in self.rows.items() if n not in self.builtin_names}
        self.rows.clear()
        self.rows.update({row.name: row for row in builtin})
        self.rows.update({n: r for n, r in added.items() if n not in self.rows})
        self.builtin_names = frozenset(row.name for row in builtin)

    def added(self) -> tuple[Any, ...]:
        """The registered (not built-in) rows, in registration order."""
        return tuple(r for n, r in self.rows.items() if n not in self.builtin_names)

    def admit(self, row: object, source: str, taken: Mapping[str, Any]
              ) -> tuple[Any, str | None]:
        """``row`` as it is registered (a preset expanded), with None; or None with why
        it cannot join the rows in ``taken``."""
        name = getattr(row, "name", "?")
        prefix = f"cannot register {self.noun} {name!r} from {source}: "
        types = self.types()
        if not isinstance(row, types):
            expected = " or ".join(t.__name__ for t in types)
            return None, prefix + f"expected a {expected}, got {type(row).__name__}"
        if self._expand is not None:
            full, problems = _load(self._expand)(row, taken)
            if full is None:
                return None, prefix + "; ".join(problems)
            row = full
        problems = _load(self._check)(row, _known(self, taken))
        if problems:
            return None, prefix + "; ".join(problems)
        existing = taken.get(getattr(row, "name", ""))
        if existing is not None and existing != row:
            owner = "a built-in" if existing.name in self.builtin_names else "another"
            where = getattr(existing, "factory", None) or getattr(existing, "install", "")
            return None, prefix + (f"the name is already taken by {owner} {self.noun} "
                                   f"({where})")
        return row, None

    def add(self, rows: Sequence[object], source: str) -> None:
        """Register ``rows``, all or none (the caller holds the lock).

        Raises:
            RegistrationError: every problem of every row, in one message.
        """
        global _version
        taken: dict[str, Any] = dict(self.rows)
        problems: list[str] = []
        for row in rows:
            full, problem = self.admit(row, source, taken)
            if problem is not None:
                problems.append(problem)
                continue
            taken.setdefault(full.name, full)
        if problems:
            raise RegistrationError("; ".join(problems))
        added = {n: r for n, r in taken.items() if n not in self.rows}
        if added:
            self.rows.update(added)
            _version += 1


_PARTS = "interlock.engine.tables"
_CHECKS = "interlock.engine.part_problems"

#: Every kind, in loading order.
KINDS: Mapping[str, RowKind] = MappingProxyType({k.kind: k for k in (
    RowKind(kind="packages", noun="optional package", row_types=(f"{_PARTS}:PackageRow",),
            builtin=f"{_PARTS}:PACKAGES", check=f"{_CHECKS}:package_problems",
            planned_as=None),
    RowKind(kind="precisions", noun="precision", row_types=(f"{_PARTS}:PrecisionRow",),
            builtin=f"{_PARTS}:PRECISIONS", check=f"{_CHECKS}:precision_problems",
            planned_as="precision"),
    RowKind(kind="checkpoint_io", noun="checkpoint IO",
            row_types=(f"{_PARTS}:CheckpointIORow",), builtin=f"{_PARTS}:CHECKPOINT_IOS",
            check=f"{_CHECKS}:checkpoint_io_problems", planned_as="checkpoint_io"),
    RowKind(kind="accelerators", noun="accelerator",
            row_types=(f"{_PARTS}:AcceleratorRow",), builtin=f"{_PARTS}:ACCELERATORS",
            check=f"{_CHECKS}:accelerator_problems", planned_as="accelerator"),
    RowKind(kind="environments", noun="cluster environment",
            row_types=(f"{_PARTS}:ClusterRow",), builtin=f"{_PARTS}:CLUSTERS",
            check=f"{_CHECKS}:environment_problems", planned_as="cluster_environment"),
    RowKind(kind="launchers", noun="launcher", row_types=(f"{_PARTS}:LauncherRow",),
            builtin=f"{_PARTS}:LAUNCHERS", check=f"{_CHECKS}:launcher_problems",
            planned_as="launcher"),
    RowKind(kind="optimizers", noun="optimizer",
            row_types=("interlock.engine.optimizers:OptimizerRow",),
            builtin="interlock.engine.optimizers:OPTIMIZERS",
            check="interlock.engine.optimizers:optimizer_problems", planned_as="optimizer"),
    RowKind(kind="strategies", noun="strategy", plural="strategies",
            row_types=("interlock.engine.specs:StrategySpec",
                       "interlock.engine.specs:StrategyPreset"),
            builtin="interlock.engine.builtin:BUILTIN_STRATEGIES",
            check="interlock.engine.spec_problems:strategy_problems",
            expand="interlock.engine.spec_problems:expanded", planned_as="strategy"),
)})

_lock = threading.RLock()
_version = 0
_loaded = False
_snapshot: PartTables | None = None


def _known(adding: RowKind, taken: Mapping[str, Any]) -> Known:
    """What a new row may refer to: every kind's rows, with ``taken`` standing for the
    rows of the kind being added."""
    return {kind: taken if row_kind is adding else row_kind.rows
            for kind, row_kind in KINDS.items()}


def registry_version() -> int:
    """A number that changes whenever a row of any kind is added or removed."""
    return _version


# --------------------------------------------------------------------------- loading


def load_entry_points() -> None:
    """Load every kind's built-in rows and entry points, in `KINDS` order (once per
    process; the first read of any kind does it)."""
    global _loaded, _version
    with _lock:
        if _loaded:
            return
        # set first: a plugin's module that reads the registry while it is imported
        # must not start the loading again
        _loaded = True
        for row_kind in KINDS.values():
            row_kind.load_builtin()
        found = scan_entry_points(tuple(k.group for k in KINDS.values()))
        for row_kind in KINDS.values():
            row_kind.entry_points = tuple(
                load_entry_point(ep, group=row_kind.group, noun=row_kind.plural,
                                 add=row_kind.add)
                for ep in found.get(row_kind.group, ())
            )
        _version += 1


def _ensure_loaded() -> None:
    if not _loaded:
        load_entry_points()


def forget_entry_points() -> None:
    """Make the next read load every entry point group again (rows already registered
    stay; for tests that install a distribution, and for plugin reloads)."""
    global _loaded
    with _lock:
        _loaded = False


@contextmanager
def isolated() -> Iterator[None]:
    """Whatever is registered or loaded inside, the registry as it was afterwards (for
    tests, and for tools that try a plugin's rows without keeping them)."""
    global _loaded, _version
    _ensure_loaded()
    with _lock:
        saved = {k: (dict(r.rows), r.entry_points, r.builtin_names) for k, r in KINDS.items()}
    try:
        yield
    finally:
        with _lock:
            for kind, (rows, entry_points, builtin_names) in saved.items():
                row_kind = KINDS[kind]
                row_kind.rows.clear()
                row_kind.rows.update(rows)
                row_kind.entry_points = entry_points
                row_kind.builtin_names = builtin_names
            _loaded = True
            _version += 1


def entry_points(kind: str | None = None) -> tuple[EntryPointStatus, ...]:
    """Every entry point found in one kind's group (None: in every group, in loading
    order), loaded or broken."""
    _ensure_loaded()
    kinds = tuple(KINDS) if kind is None else (_kind(kind).kind,)
    return tuple(ep for k in kinds for ep in KINDS[k].entry_points)


def broken_entry_points(kind: str | None = None) -> tuple[EntryPointStatus, ...]:
    """The entry points of one kind's group (None: of every group) that failed to load
    (their rows are unavailable)."""
    if kind is not None:  # plan() asks for one kind, whose group is usually empty
        _ensure_loaded()
        found = _kind(kind).entry_points
        return tuple(ep for ep in found if ep.broken) if found else ()
    return tuple(ep for ep in entry_points() if ep.broken)


# --------------------------------------------------------------------------- the verbs


def _kind(kind: str) -> RowKind:
    found = KINDS.get(kind)
    if found is None:
        raise ValueError(f"unknown kind of row {kind!r}; known: {', '.join(KINDS)}")
    return found


def _row_type_names() -> str:
    return ", ".join(ref.partition(":")[2] for k in KINDS.values() for ref in k.row_types)


#: `kind_of`'s answers by row type (the kinds are fixed at import): `registered()` runs
#: in every `plan()` call, and finding a kind by its import strings costs a microsecond
_KIND_OF: dict[type, RowKind] = {}


def kind_of(row_type: object) -> RowKind:
    """The kind whose rows have type ``row_type`` (or a base class of it)."""
    known = _KIND_OF.get(row_type) if isinstance(row_type, type) else None
    if known is not None:
        return known
    for cls in getattr(row_type, "__mro__", ()):
        reference = f"{cls.__module__}:{cls.__qualname__}"
        for row_kind in KINDS.values():
            if reference in row_kind.row_types:
                if isinstance(row_type, type):
                    _KIND_OF[row_type] = row_kind
                return row_kind
    named = row_type.__name__ if isinstance(row_type, type) else short_repr(row_type)
    raise RegistrationError(f"{named} is no kind of row; the row types are "
                            f"{_row_type_names()}")


def register(row: object, *, source: str = "register()") -> None:
    """Add a row of any kind so that `plan()`, `resolve()` and the docs know it: a
    `StrategySpec` or `StrategyPreset`, `PrecisionRow`, `AcceleratorRow`, `ClusterRow`,
    `LauncherRow`, `CheckpointIORow`, `PackageRow` or `OptimizerRow`.

    Registering a row equal to one already registered does nothing.

    Args:
        row: the row.
        source: where it comes from, named in errors.

    Raises:
        RegistrationError: the row is of no kind, malformed, refers to rows that are
            not registered, or its name is taken by another row of its kind.
    """
    try:
        row_kind = kind_of(type(row))
    except RegistrationError:
        raise RegistrationError(f"cannot register {short_repr(row)} from {source}: expected "
                                f"a {_row_type_names()}; got {type(row).__name__}") from None
    _ensure_loaded()
    with _lock:
        row_kind.add([row], source)


def unregister(row_type: type, name: str) -> None:
    """Remove a registered row (for tests and plugin reloads): ``unregister(PrecisionRow,
    "fp8-mine")``. Removing a name that is not registered does nothing.

    Raises:
        RegistrationError: the row is built in, or other registered rows still refer to
            it (their refusals or plans would lose it): unregister those first.
    """
    global _version
    row_kind = kind_of(row_type)
    _ensure_loaded()
    with _lock:
        if name in row_kind.builtin_names:
            raise RegistrationError(f"cannot unregister built-in {row_kind.noun} {name!r}")
        why = _still_used(row_kind, name)
        if why:
            raise RegistrationError(f"cannot unregister {row_kind.noun} {name!r}: {why}")
        if row_kind.rows.pop(name, None) is not None:
            _version += 1


def _still_used(row_kind: RowKind, name: str) -> str | None:
    """Why registered rows would lose what they refer to without ``name``, or None."""
    if name not in row_kind.rows:
        return None
    if row_kind.kind == "packages":
        users = sorted(f"{k.noun} {row.name!r}" for k in KINDS.values()
                       for row in k.rows.values() if name in getattr(row, "requires", ()))
        return (f"{', '.join(users)} require it (their refusals could no longer say how to "
                "install it); unregister those first") if users else None
    if row_kind.kind == "checkpoint_io":
        users = sorted(row.name for row in KINDS["accelerators"].rows.values()
                       if row.checkpoint_io == name)
        return (f"the accelerator {', '.join(users)} saves through it; unregister that "
                "first") if users else None
    return None


def registered(row_type: type[R]) -> Mapping[str, R]:
    """A read-only view of every row of one kind by name, built-in first, entry points
    included: ``registered(PrecisionRow)``, ``registered(StrategySpec)`` (presets
    appear expanded, as the specs they stand for).

    Raises:
        RegistrationError: ``row_type`` is no kind of row, or is `StrategyPreset`
            (presets are kept as the specs they expand to: ask for `StrategySpec`).
    """
    view = _VIEW_OF.get(row_type) if isinstance(row_type, type) else None
    if view is None:
        row_kind = kind_of(row_type)
        if getattr(row_type, "__qualname__", None) != row_kind.row_types[0].partition(":")[2]:
            kept = row_kind.row_types[0].partition(":")[2]
            raise RegistrationError(f"{row_type.__name__} rows are kept as {kept} rows: "
                                    f"use registered({kept})")
        view = row_kind.view
        if isinstance(row_type, type):
            _VIEW_OF[row_type] = view
    if not _loaded:
        load_entry_points()
    return cast("Mapping[str, R]", view)


#: `registered`'s answer by row type, checked once: each kind's view is one object for
#: the life of the process (it shows the rows as they change)
_VIEW_OF: dict[type, Mapping[str, Any]] = {}


# --------------------------------------------------------------------------- helpers


def install_hint(package: str) -> str:
    """How to install an optional package, for messages (``pip install <name>`` for a
    name no row knows)."""
    return current_parts().install_hint(package)


def load_reference(noun: str, name: str, reference: str,
                   requires: tuple[str, ...] = ()) -> Any:
    """Import what a row's ``"package.module:attribute"`` names (a strategy's or a
    part's factory, an accelerator's device counter): the one loader of every row.

    Raises:
        ImportError: the module or attribute cannot be imported, naming the ``noun`` row
            ``name``, the reference and, for rows that need optional packages, how to
            install them.
    """
    module_name, _, attribute = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        hints = "; ".join(install_hint(p) for p in requires)
        raise ImportError(
            f"{noun} {name!r} is implemented by {reference}, which cannot be imported: "
            f"{exc}" + (f" (install: {hints})" if hints else "")
        ) from exc
    return target


def current_parts() -> PartTables:
    """The snapshot of every kind at the current version (entry points loaded)."""
    global _snapshot
    _ensure_loaded()
    snapshot = _snapshot
    if snapshot is not None and snapshot.version == _version:
        return snapshot
    with _lock:
        snapshot = take_snapshot(
            _version,
            rows={kind: dict(row_kind.rows) for kind, row_kind in KINDS.items()},
            builtin={kind: row_kind.builtin_names for kind, row_kind in KINDS.items()},
            broken={kind: tuple(ep for ep in row_kind.entry_points if ep.broken)
                    for kind, row_kind in KINDS.items()},
        )
        _snapshot = snapshot
    return snapshot

