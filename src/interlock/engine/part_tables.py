"""The snapshot the rules read: every kind's rows at one registry version, with what
the rules derive from them (`PartTables`). The registry
(:mod:`interlock.engine.registry`) takes one per version; this module knows only
the row types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from interlock.engine.optimizers import OptimizerRow
from interlock.engine.registration import EntryPointStatus
from interlock.engine.tables import (
    ACCELERATOR_CHOOSERS,
    DETECTION_VARIABLE,
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PackageRow,
    PrecisionRow,
    accelerator_inputs,
)


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
        version: the `registry_version` it was taken at.
        rows: every kind's rows by name, keyed by the registry's kind
            (``"precisions"``, ``"strategies"``, ...): what a `Plan` finds its rows in.
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
    rows: Mapping[str, Mapping[str, Any]]
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

    def not_installed(self, needer: str, missing: Sequence[str]) -> str:
        """The reason of a ``missing-package`` refusal: ``needer`` needs ``missing``."""
        return (f"{needer} needs {', '.join(missing)}, which is not installed (install: "
                f"{'; '.join(self.install_hint(p) for p in missing)}).")

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


def take_snapshot(version: int, *, rows: Mapping[str, Mapping[str, Any]],
                  builtin: Mapping[str, frozenset[str]],
                  broken: Mapping[str, tuple[EntryPointStatus, ...]]) -> PartTables:
    """The snapshot of ``rows`` (every kind's rows by name, built-in first), whose
    built-in names are ``builtin`` and whose broken entry points are ``broken``."""

    def added(kind: str) -> tuple[Any, ...]:
        return tuple(r for n, r in rows[kind].items() if n not in builtin[kind])

    by_kind = {kind: MappingProxyType(dict(found)) for kind, found in rows.items()}
    accelerators: Mapping[str, AcceleratorRow] = by_kind["accelerators"]
    environments: Mapping[str, ClusterRow] = by_kind["environments"]
    added_precisions: tuple[PrecisionRow, ...] = added("precisions")
    added_environments: tuple[ClusterRow, ...] = added("environments")
    accelerator_precisions = {
        name: row.precisions | frozenset(p.name for p in added_precisions
                                         if name in p.accelerators)
        for name, row in accelerators.items()
    }
    own = tuple(r for n, r in environments.items() if n in builtin["environments"])
    cut = next(i for i, row in enumerate(own) if row.name == "external")
    variables = (*(v for row in environments.values() for v in row.variables),
                 DETECTION_VARIABLE)
    return PartTables(
        version=version,
        rows=MappingProxyType(by_kind),
        packages=by_kind["packages"],
        precisions=by_kind["precisions"],
        accelerators=accelerators,
        environments=environments,
        launchers=by_kind["launchers"],
        checkpoint_ios=by_kind["checkpoint_io"],
        optimizers=by_kind["optimizers"],
        precision_names=tuple(by_kind["precisions"]),
        accelerator_names=tuple(accelerators),
        accelerator_inputs=accelerator_inputs(accelerators),
        added_accelerators=added("accelerators"),
        added_environments=added_environments,
        detection_order=(*own[:cut], *added_environments, *own[cut:]),
        accelerator_precisions=MappingProxyType(accelerator_precisions),
        environment_variables=tuple(dict.fromkeys(variables)),
        broken=MappingProxyType(dict(broken)),
        _precisions_by_strategy=MappingProxyType(_by_strategy(added_precisions)),
        _accelerators_by_strategy=MappingProxyType(_by_strategy(added("accelerators"))),
        _launchers_by_strategy=MappingProxyType(_by_strategy(added("launchers"))),
    )
