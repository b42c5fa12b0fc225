"""One registry per part kind: precisions, accelerators, cluster environments, launchers.

Each works like the strategy registry (:mod:`interlock.connector.registry`): built-in
rows (the tables of :mod:`interlock.connector.tables`), rows added with
``register_<kind>(row)`` and removed with ``unregister_<kind>(name)``, a read-only view,
and an entry point group loaded lazily on first use:

=================  ==========================  =================================
kind               row                         entry point group
=================  ==========================  =================================
``precisions``     `PrecisionRow`              ``interlock.precisions``
``accelerators``   `AcceleratorRow`            ``interlock.accelerators``
``environments``   `ClusterRow`                ``interlock.environments``
``launchers``      `LauncherRow`               ``interlock.launchers``
``packages``       `PackageRow`                ``interlock.packages``
``optimizers``     `OptimizerRow`              ``interlock.optimizers``
=================  ==========================  =================================

An entry point's object is a row, a list or tuple of rows, or a callable taking no
arguments that returns either; its rows are registered all or none, and a broken one
is recorded with the reason (`part_entry_points`), warned about once, and named by the
refusals it may explain. The packages load first, then the groups in the order above,
then the strategies, so that a row may refer to the rows of the groups before it (see
:mod:`interlock.connector.part_problems`).

Every registration of any kind changes `parts_version`, which
`interlock.connector.registry.registry_version` (the plan memo's key) includes.

The rules read one snapshot of all kinds per `plan()` call, `current_parts`, rebuilt
only when the version changes. Where the registered rows go:

* a registered accelerator comes after the built-in device kinds in
  ``accelerator='auto'`` (xla, mps, cuda, *registered in registration order*, cpu), so
  installing a plugin never changes what ``'auto'`` picks on a machine where a built-in
  accelerator is present; ``accelerator='<name>'`` asks for it directly. Its devices are
  counted in ``Machine.extra_devices[<name>]`` and placed like CUDA devices (``'auto'``
  and -1: all; N: the first N; ids as given).
* a registered cluster environment with a ``detect`` predicate is tried after the
  built-in detectors of specific clusters (torchelastic, SLURM, Kubeflow, LSF, MPI) and
  before the catch-alls (``external``, which any launcher exporting torch's variables
  matches, the SLURM fallbacks and ``local``), in registration order. Built-in
  detection of the clusters interlock knows is never overridden by a plugin; a plugin
  environment that must win is passed as a cluster environment plugin instance.
* a registered optional package (a `PackageRow`: an importable module name and how to
  install it) may be named in the ``requires`` of the rows that come after it;
  ``Machine.probe()`` looks for it and ``Machine.packages`` may list it, so a strategy
  that needs it is refused with ``missing-package`` and the row's install hint where
  it is absent.
* a registered precision runs on the accelerators its row names and on the
  accelerators whose row names it; it is taken by the strategies its row names (a
  preset, ``variant_of``, follows the strategy it presets) and by those whose spec
  lists it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from interlock.connector.optimizers import OPTIMIZERS, OptimizerRow
from interlock.connector.registration import (
    EntryPointStatus,
    RegistrationError,
    load_entry_point,
    scan_entry_points,
)
from interlock.connector.tables import (
    ACCELERATOR_CHOOSERS,
    ACCELERATORS,
    CHECKPOINT_IOS,
    CLUSTERS,
    DETECTION_VARIABLE,
    LAUNCHERS,
    PACKAGES,
    PRECISIONS,
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PackageRow,
    PrecisionRow,
    accelerator_inputs,
)

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from interlock.connector.part_problems import Known

R = TypeVar("R", PackageRow, PrecisionRow, CheckpointIORow, AcceleratorRow, ClusterRow,
            LauncherRow, OptimizerRow)

#: The part kinds, in the order their entry point groups load (an accelerator row may
#: name a checkpoint IO row, which loads first; any row may require a package).
PART_KINDS: tuple[str, ...] = ("packages", "precisions", "checkpoint_io", "accelerators",
                               "environments", "launchers", "optimizers")


class PartRegistry(Generic[R]):
    """The rows of one part kind: the built-in ones first, then registered ones in
    registration order."""

    def __init__(self, *, kind: str, noun: str, row_type: type[R],
                 builtin: tuple[R, ...]) -> None:
        self.kind = kind
        #: what one row is, in messages ("precision", "cluster environment")
        self.noun = noun
        self.plural = f"{noun}s"
        #: the entry point group
        self.group = f"interlock.{kind}"
        self.row_type: type[R] = row_type
        #: the built-in rows, in table order
        self.builtin: tuple[R, ...] = builtin
        self.builtin_names: frozenset[str] = frozenset(r.name for r in builtin)
        self.rows: dict[str, R] = {r.name: r for r in builtin}
        #: a read-only view of every row, entry points included
        self.view: Mapping[str, R] = MappingProxyType(self.rows)
        #: what became of each entry point of the group
        self.entry_points: tuple[EntryPointStatus, ...] = ()

    def added(self) -> tuple[R, ...]:
        """The registered (not built-in) rows, in registration order."""
        return tuple(r for n, r in self.rows.items() if n not in self.builtin_names)

    def refusal(self, row: object, source: str, taken: Mapping[str, R],
                known: Known) -> str | None:
        """Why ``row`` cannot join the rows in ``taken``, or None."""
        # imported here: checking is for registration, not for every import of the engine
        from interlock.connector.part_problems import CHECKS

        problems = CHECKS[self.kind](row, known)
        name = getattr(row, "name", "?")
        prefix = f"cannot register {self.noun} {name!r} from {source}: "
        if problems or not isinstance(row, self.row_type):
            return prefix + "; ".join(problems or [f"expected a {self.row_type.__name__}"])
        existing = taken.get(row.name)
        if existing is not None and existing != row:
            owner = "a built-in" if row.name in self.builtin_names else "another"
            where = getattr(existing, "factory", None) or getattr(existing, "install", "")
            return (prefix + f"the name is already taken by {owner} {self.noun} "
                    f"({where})")
        return None

    def add(self, rows: Sequence[object], source: str) -> None:
        """Register ``rows``, all or none (the caller holds the lock).

        Raises:
            RegistrationError: every problem of every row, in one message.
        """
        global _version
        taken: dict[str, R] = dict(self.rows)
        problems: list[str] = []
        for row in rows:
            problem = self.refusal(row, source, taken, _known(taken_by=self, taken=taken))
            if problem is not None or not isinstance(row, self.row_type):
                problems.append(problem or f"{row!r} is not a {self.row_type.__name__}")
                continue
            taken.setdefault(row.name, row)
        if problems:
            raise RegistrationError("; ".join(problems))
        added = {n: r for n, r in taken.items() if n not in self.rows}
        if added:
            self.rows.update(added)
            _version += 1

    def remove(self, name: str) -> None:
        global _version
        if name in self.builtin_names:
            raise RegistrationError(f"cannot unregister built-in {self.noun} {name!r}")
        with _lock:
            if self.rows.pop(name, None) is not None:
                _version += 1


PACKAGE_REGISTRY = PartRegistry(kind="packages", noun="optional package",
                                row_type=PackageRow, builtin=PACKAGES)
PRECISION_REGISTRY = PartRegistry(kind="precisions", noun="precision",
                                  row_type=PrecisionRow, builtin=PRECISIONS)
CHECKPOINT_IO_REGISTRY = PartRegistry(kind="checkpoint_io", noun="checkpoint IO",
                                      row_type=CheckpointIORow, builtin=CHECKPOINT_IOS)
ACCELERATOR_REGISTRY = PartRegistry(kind="accelerators", noun="accelerator",
                                    row_type=AcceleratorRow, builtin=ACCELERATORS)
ENVIRONMENT_REGISTRY = PartRegistry(kind="environments", noun="cluster environment",
                                    row_type=ClusterRow, builtin=CLUSTERS)
LAUNCHER_REGISTRY = PartRegistry(kind="launchers", noun="launcher",
                                 row_type=LauncherRow, builtin=LAUNCHERS)
OPTIMIZER_REGISTRY = PartRegistry(kind="optimizers", noun="optimizer",
                                  row_type=OptimizerRow, builtin=OPTIMIZERS)

#: Each kind's registry, in loading order.
REGISTRIES: Mapping[str, PartRegistry[Any]] = MappingProxyType({
    "packages": PACKAGE_REGISTRY,
    "precisions": PRECISION_REGISTRY,
    "checkpoint_io": CHECKPOINT_IO_REGISTRY,
    "accelerators": ACCELERATOR_REGISTRY,
    "environments": ENVIRONMENT_REGISTRY,
    "launchers": LAUNCHER_REGISTRY,
    "optimizers": OPTIMIZER_REGISTRY,
})

#: Each kind's entry point group.
ENTRY_POINT_GROUPS: Mapping[str, str] = MappingProxyType(
    {kind: registry.group for kind, registry in REGISTRIES.items()}
)

_lock = threading.RLock()
_version = 0
_loaded = False
_snapshot: PartTables | None = None


def _no_strategies() -> Mapping[str, Any]:
    return {}


#: Where the registered strategies are read from when a row names strategies: set
#: by the strategy registry, which depends on this module rather than the reverse.
_strategy_source: Callable[[], Mapping[str, Any]] = _no_strategies


def use_strategies(source: Callable[[], Mapping[str, Any]]) -> None:
    """Tell the part registries where the registered strategy specs are (the strategy
    registry calls this once, at import)."""
    global _strategy_source
    _strategy_source = source


def _known(*, taken_by: PartRegistry[Any] | None = None,
           taken: Mapping[str, Any] | None = None) -> Known:
    from interlock.connector.part_problems import Known

    def rows(registry: PartRegistry[Any]) -> Mapping[str, Any]:
        return taken if registry is taken_by and taken is not None else registry.rows

    return Known(precisions=rows(PRECISION_REGISTRY), accelerators=rows(ACCELERATOR_REGISTRY),
                 checkpoint_ios=rows(CHECKPOINT_IO_REGISTRY), packages=rows(PACKAGE_REGISTRY),
                 environments=rows(ENVIRONMENT_REGISTRY), strategies=_strategy_source())


def parts_version() -> int:
    """A number that changes whenever the rows of any part kind change."""
    return _version


# --------------------------------------------------------------------------- entry points


def load_entry_points(found: Mapping[str, Sequence[EntryPoint]] | None = None) -> None:
    """Load every part group's entry points, in `PART_KINDS` order (once per process;
    the first read of any registry does it).

    Args:
        found: the entry points by group, when the caller has scanned them already
            (the strategy registry scans its group and these in one pass).
    """
    global _loaded, _version
    with _lock:
        if _loaded:
            return
        # set first: a plugin's module that reads a registry while it is imported must
        # not start the loading again
        _loaded = True
        if found is None:
            found = scan_entry_points(tuple(ENTRY_POINT_GROUPS.values()))
        for registry in REGISTRIES.values():
            registry.entry_points = tuple(
                load_entry_point(ep, group=registry.group, noun=registry.plural,
                                 add=registry.add)
                for ep in found.get(registry.group, ())
            )
        _version += 1


def _ensure_loaded() -> None:
    if not _loaded:
        load_entry_points()


def part_entry_points(kind: str | None = None) -> tuple[EntryPointStatus, ...]:
    """Every entry point found in one part group (None: in all of them, in loading
    order), loaded or broken."""
    _ensure_loaded()
    kinds = PART_KINDS if kind is None else (_kind(kind),)
    return tuple(ep for k in kinds for ep in REGISTRIES[k].entry_points)


def broken_part_entry_points(kind: str | None = None) -> tuple[EntryPointStatus, ...]:
    """The part entry points that failed to load (their rows are unavailable)."""
    return tuple(ep for ep in part_entry_points(kind) if ep.broken)


# --------------------------------------------------------------------------- registration


def _kind(kind: str) -> str:
    if kind not in REGISTRIES:
        raise ValueError(f"unknown part kind {kind!r}; known: {', '.join(PART_KINDS)}")
    return kind


def _register(registry: PartRegistry[Any], row: object, source: str) -> None:
    _ensure_loaded()
    with _lock:
        registry.add([row], source)


def register_part(row: object, *, source: str = "register_part()") -> None:
    """Register a row of whichever kind it is (a `PackageRow`, `PrecisionRow`,
    `CheckpointIORow`, `AcceleratorRow`, `ClusterRow`, `LauncherRow` or `OptimizerRow`).

    Raises:
        RegistrationError: the row is of no part kind, malformed, or its name is taken.
    """
    for registry in REGISTRIES.values():
        if isinstance(row, registry.row_type):
            _register(registry, row, source)
            return
    raise RegistrationError(
        f"cannot register {row!r} from {source}: expected a PackageRow, PrecisionRow, "
        f"CheckpointIORow, AcceleratorRow, ClusterRow, LauncherRow or OptimizerRow, got "
        f"{type(row).__name__}"
    )


def unregister_part(kind: str, name: str) -> None:
    """Remove a registered row of a kind (for tests and plugin reloads).

    Raises:
        RegistrationError: the row is built in.
    """
    _ensure_loaded()
    REGISTRIES[_kind(kind)].remove(name)


def register_package(row: PackageRow, *, source: str = "register_package()") -> None:
    """Add an optional package that the rows registered after it may require.

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(PACKAGE_REGISTRY, row, source)


def unregister_package(name: str) -> None:
    """Remove a registered optional package (built-in ones cannot be removed).

    Raises:
        RegistrationError: it is built in, or a registered row still requires it (its
            refusals could no longer say how to install it): unregister those first.
    """
    _ensure_loaded()
    users = sorted(
        [f"{registry.noun} {row.name!r}" for registry in REGISTRIES.values()
         for row in registry.rows.values() if name in getattr(row, "requires", ())]
        + [f"strategy {spec.name!r}" for spec in _strategy_source().values()
           if name in getattr(spec, "requires", ())])
    if users and name not in PACKAGE_REGISTRY.builtin_names:
        raise RegistrationError(f"cannot unregister optional package {name!r}: "
                                f"{', '.join(users)} require it; unregister those first")
    unregister_part("packages", name)


def package_rows() -> Mapping[str, PackageRow]:
    """A read-only view of every optional package the engine consults, built-in first."""
    _ensure_loaded()
    return PACKAGE_REGISTRY.view


def install_hint(package: str) -> str:
    """How to install an optional package, for messages (``pip install <name>`` for a
    name no row knows)."""
    row = package_rows().get(package)
    return row.install if row is not None else f"pip install {package}"


def register_precision(row: PrecisionRow, *, source: str = "register_precision()") -> None:
    """Add a precision so that `plan()` accepts it where its row says it runs.

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(PRECISION_REGISTRY, row, source)


def unregister_precision(name: str) -> None:
    """Remove a registered precision (built-in ones cannot be removed)."""
    unregister_part("precisions", name)


def precision_rows() -> Mapping[str, PrecisionRow]:
    """A read-only view of every precision, built-in first."""
    _ensure_loaded()
    return PRECISION_REGISTRY.view


def register_accelerator(row: AcceleratorRow, *,
                         source: str = "register_accelerator()") -> None:
    """Add an accelerator (its devices counted in ``Machine.extra_devices``).

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(ACCELERATOR_REGISTRY, row, source)


def unregister_accelerator(name: str) -> None:
    """Remove a registered accelerator (built-in ones cannot be removed)."""
    unregister_part("accelerators", name)


def accelerator_rows() -> Mapping[str, AcceleratorRow]:
    """A read-only view of every accelerator, built-in first."""
    _ensure_loaded()
    return ACCELERATOR_REGISTRY.view


def register_environment(row: ClusterRow, *, source: str = "register_environment()") -> None:
    """Add a cluster environment (detected from its ``detect`` predicate, if any).

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(ENVIRONMENT_REGISTRY, row, source)


def unregister_environment(name: str) -> None:
    """Remove a registered cluster environment (built-in ones cannot be removed)."""
    unregister_part("environments", name)


def environment_rows() -> Mapping[str, ClusterRow]:
    """A read-only view of every cluster environment, built-in first (see
    `PartTables.detection_order` for the order they are detected in)."""
    _ensure_loaded()
    return ENVIRONMENT_REGISTRY.view


def register_checkpoint_io(row: CheckpointIORow, *,
                           source: str = "register_checkpoint_io()") -> None:
    """Add a checkpoint IO that accelerator rows may name as their default.

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(CHECKPOINT_IO_REGISTRY, row, source)


def unregister_checkpoint_io(name: str) -> None:
    """Remove a registered checkpoint IO (built-in ones cannot be removed).

    Raises:
        RegistrationError: it is built in, or an accelerator row still names it (its
            plans would silently save another way): unregister that accelerator first.
    """
    users = sorted(row.name for row in ACCELERATOR_REGISTRY.rows.values()
                   if row.checkpoint_io == name)
    if users and name not in CHECKPOINT_IO_REGISTRY.builtin_names:
        raise RegistrationError(f"cannot unregister checkpoint IO {name!r}: the accelerator "
                                f"{', '.join(users)} saves through it; unregister that first")
    unregister_part("checkpoint_io", name)


def checkpoint_io_rows() -> Mapping[str, CheckpointIORow]:
    """A read-only view of every checkpoint IO, built-in first."""
    _ensure_loaded()
    return CHECKPOINT_IO_REGISTRY.view


def register_launcher(row: LauncherRow, *, source: str = "register_launcher()") -> None:
    """Add a launcher that strategy specs may name.

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(LAUNCHER_REGISTRY, row, source)


def unregister_launcher(name: str) -> None:
    """Remove a registered launcher (built-in ones cannot be removed)."""
    unregister_part("launchers", name)


def launcher_rows() -> Mapping[str, LauncherRow]:
    """A read-only view of every launcher, built-in first."""
    _ensure_loaded()
    return LAUNCHER_REGISTRY.view


def register_optimizer(row: OptimizerRow, *, source: str = "register_optimizer()") -> None:
    """Add an optimizer that ``plan(optimizer=...)`` may name for the memory estimate.

    Raises:
        RegistrationError: the row is malformed or its name is taken.
    """
    _register(OPTIMIZER_REGISTRY, row, source)


def unregister_optimizer(name: str) -> None:
    """Remove a registered optimizer (built-in ones cannot be removed)."""
    unregister_part("optimizers", name)


def optimizer_rows() -> Mapping[str, OptimizerRow]:
    """A read-only view of every optimizer, built-in first."""
    _ensure_loaded()
    return OPTIMIZER_REGISTRY.view


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


# --------------------------------------------------------------------------- snapshot


class SpecLike(Protocol):
    """What the snapshot reads of a strategy spec."""

    @property
    def name(self) -> str: ...

    @property
    def variant_of(self) -> str | None: ...

    @property
    def preset_of(self) -> str | None: ...

    @property
    def launcher(self) -> str | None: ...

    @property
    def launchers(self) -> frozenset[str]: ...

    @property
    def precisions(self) -> frozenset[str]: ...

    @property
    def accelerators(self) -> frozenset[str]: ...


_EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PartTables:
    """Every part kind's rows at one registry version, with what the rules derive from
    them. One snapshot serves every `plan()` call until a registration changes the
    version. Compared and hashed by identity: one snapshot stands for one version, so
    stage inputs that hold it can key a memo.

    Attributes:
        version: the `parts_version` it was taken at.
        packages: the optional packages by name, built-in first.
        precisions, accelerators, environments, launchers, checkpoint_ios, optimizers:
            the rows by name, built-in first, then registered in registration order.
        precision_names: the precision names in that order.
        accelerator_names: the accelerator names in that order.
        accelerator_inputs: every name the accelerator flag accepts.
        added_accelerators: the registered accelerators.
        added_environments: the registered cluster environments.
        detection_order: the cluster environments in the order they are detected.
        accelerator_precisions: per accelerator, the precisions it runs: its row's,
            and those of registered precisions that name it.
        environment_variables: every environment variable the engine reads;
            `Machine.probe` keeps only these.
        broken: per part kind, its entry points that failed to load.
        cache: per decision id, its rules with the registered rows' rules in place.
    """

    version: int
    packages: Mapping[str, PackageRow]
    precisions: Mapping[str, PrecisionRow]
    accelerators: Mapping[str, AcceleratorRow]
    environments: Mapping[str, ClusterRow]
    launchers: Mapping[str, LauncherRow]
    checkpoint_ios: Mapping[str, CheckpointIORow]
    optimizers: Mapping[str, OptimizerRow]
    precision_names: tuple[str, ...]
    accelerator_names: tuple[str, ...]
    accelerator_inputs: tuple[str, ...]
    added_accelerators: tuple[AcceleratorRow, ...]
    added_environments: tuple[ClusterRow, ...]
    detection_order: tuple[ClusterRow, ...]
    accelerator_precisions: Mapping[str, frozenset[str]]
    environment_variables: tuple[str, ...]
    broken: Mapping[str, tuple[EntryPointStatus, ...]]
    _precisions_by_strategy: Mapping[str, frozenset[str]]
    _accelerators_by_strategy: Mapping[str, frozenset[str]]
    _launchers_by_strategy: Mapping[str, frozenset[str]]
    cache: dict[str, tuple[object, ...]] = field(default_factory=dict, compare=False)

    def strategy_precisions(self, spec: SpecLike) -> frozenset[str]:
        """The precisions a strategy takes: those its spec declares, and the registered
        precisions that name it (or the strategy it is a variant or preset of)."""
        return spec.precisions | _named(self._precisions_by_strategy, spec,
                                        spec.variant_of, spec.preset_of)

    def strategy_accelerators(self, spec: SpecLike) -> frozenset[str]:
        """The accelerators a strategy runs on: those its spec declares, and the
        registered accelerators that name it (or the strategy it is a variant or preset
        of)."""
        return spec.accelerators | _named(self._accelerators_by_strategy, spec,
                                          spec.variant_of, spec.preset_of)

    def strategy_launchers(self, spec: SpecLike) -> frozenset[str]:
        """The launchers ``launcher=`` may choose for a strategy: its own, those its
        spec lists, and the registered launchers that name it (or the strategy it is a
        variant of, or a preset of when the preset does not pin its launcher). Empty
        for a strategy that runs in the calling process."""
        if spec.launcher is None:
            return _EMPTY
        pinned = not spec.launchers and spec.preset_of is not None
        return (frozenset((spec.launcher,)) | spec.launchers
                | _named(self._launchers_by_strategy, spec, spec.variant_of,
                         None if pinned else spec.preset_of))

    def install_hint(self, package: str) -> str:
        """How to install an optional package, for ``missing-package`` refusals."""
        row = self.packages.get(package)
        return row.install if row is not None else f"pip install {package}"

    def chooser_order(self, chooser: str) -> tuple[str, ...]:
        """The accelerators an input such as ``'auto'`` tries, in order: for
        ``'auto'``, the registered ones come just before the cpu."""
        order = ACCELERATOR_CHOOSERS[chooser]
        if chooser != "auto" or not self.added_accelerators:
            return order
        added = tuple(r.name for r in self.added_accelerators)
        return (*order[:-1], *added, order[-1])


def _named(by: Mapping[str, frozenset[str]], spec: SpecLike,
           *more: str | None) -> frozenset[str]:
    """The rows of ``by`` (rows by the strategy names they name) that name the
    strategy or one of ``more``."""
    if not by:
        return _EMPTY
    found = by.get(spec.name, _EMPTY)
    for name in more:
        if name:
            found = found | by.get(name, _EMPTY)
    return found


def _by_strategy(rows: Sequence[PrecisionRow | AcceleratorRow | LauncherRow]
                 ) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for row in rows:
        for strategy in row.strategies:
            found.setdefault(strategy, set()).add(row.name)
    return {k: frozenset(v) for k, v in found.items()}


def _take_snapshot() -> PartTables:
    precisions = dict(PRECISION_REGISTRY.rows)
    accelerators = dict(ACCELERATOR_REGISTRY.rows)
    environments = dict(ENVIRONMENT_REGISTRY.rows)
    added_precisions = PRECISION_REGISTRY.added()
    added_environments = ENVIRONMENT_REGISTRY.added()
    accelerator_precisions = {
        name: row.precisions | frozenset(p.name for p in added_precisions
                                         if name in p.accelerators)
        for name, row in accelerators.items()
    }
    builtin = ENVIRONMENT_REGISTRY.builtin
    cut = next(i for i, row in enumerate(builtin) if row.name == "external")
    variables = (*(v for row in environments.values() for v in row.variables),
                 DETECTION_VARIABLE)
    return PartTables(
        version=_version,
        packages=MappingProxyType(dict(PACKAGE_REGISTRY.rows)),
        precisions=MappingProxyType(precisions),
        accelerators=MappingProxyType(accelerators),
        environments=MappingProxyType(environments),
        launchers=MappingProxyType(dict(LAUNCHER_REGISTRY.rows)),
        checkpoint_ios=MappingProxyType(dict(CHECKPOINT_IO_REGISTRY.rows)),
        optimizers=MappingProxyType(dict(OPTIMIZER_REGISTRY.rows)),
        precision_names=tuple(precisions),
        accelerator_names=tuple(accelerators),
        accelerator_inputs=accelerator_inputs(accelerators),
        added_accelerators=ACCELERATOR_REGISTRY.added(),
        added_environments=added_environments,
        detection_order=(*builtin[:cut], *added_environments, *builtin[cut:]),
        accelerator_precisions=MappingProxyType(accelerator_precisions),
        environment_variables=tuple(dict.fromkeys(variables)),
        broken=MappingProxyType({kind: tuple(ep for ep in registry.entry_points if ep.broken)
                                 for kind, registry in REGISTRIES.items()}),
        _precisions_by_strategy=MappingProxyType(_by_strategy(added_precisions)),
        _accelerators_by_strategy=MappingProxyType(_by_strategy(ACCELERATOR_REGISTRY.added())),
        _launchers_by_strategy=MappingProxyType(_by_strategy(LAUNCHER_REGISTRY.added())),
    )


def current_parts() -> PartTables:
    """The snapshot of every part kind at the current version (entry points loaded)."""
    global _snapshot
    if not _loaded:
        load_entry_points()
    snapshot = _snapshot
    if snapshot is not None and snapshot.version == _version:
        return snapshot
    with _lock:
        snapshot = _take_snapshot()
        _snapshot = snapshot
    return snapshot
