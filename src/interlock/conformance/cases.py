"""Which conformance cases apply: strategies x runners x world sizes x precisions x checks.

A case that the runner cannot provide (no CUDA devices, a strategy that does not run on
the runner's accelerator, one device at most) is still listed, with the reason it is
skipped; a declared capability is never skipped.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from interlock.conformance.checks import ANY_PRECISION
from interlock.conformance.declaration import strategy_accelerators, strategy_precisions
from interlock.conformance.options import SuiteOptions
from interlock.conformance.report import Declaration
from interlock.conformance.runners import RUNNERS, available_runners, runner_devices
from interlock.conformance.table import CHECKS, CHECKS_BY_ID, InPytest
from interlock.engine.registration import EntryPointStatus
from interlock.engine.registry import (
    broken_entry_points,
    current_parts,
    install_hint,
    registered,
)
from interlock.engine.specs import StrategySpec

#: what ends the name of the launch that runs the ``own_launch`` checks
RESTARTS_SUFFIX = "-restarts"


@dataclass(frozen=True, slots=True)
class Case:
    """One conformance test item."""

    strategy: str
    runner: str
    world_size: int | None  # None: the declaration, which launches nothing
    precision: str
    check: str
    skip: str | None = None

    @property
    def id(self) -> str:
        """The test id, also what skip and xfail files match by prefix."""
        where = "any" if self.world_size is None else f"w{self.world_size}"
        return f"{self.strategy}-{self.runner}-{where}-{self.precision}-{self.check}"

    @property
    def group(self) -> str:
        """Cases that share one driver launch: the main one of the (strategy, runner,
        world size), or the one beside it for the checks that need nothing of the main
        launch (``Check.own_launch``: the restart checks)."""
        base = f"{self.strategy}-{self.runner}-w{self.world_size}"
        check = CHECKS_BY_ID.get(self.check)
        return base + RESTARTS_SUFFIX if check is not None and check.own_launch else base


def resolve_strategies(names: Iterable[str]) -> list[StrategySpec]:
    """Specs for the names asked for; ``all`` means every registered strategy that is
    not a preset of another. A name that a broken entry point stands for is left to
    `broken_entry_points_asked`.

    Raises:
        ValueError: naming an unknown strategy and the known ones.
    """
    specs = registered(StrategySpec)
    broken = {n for ep in broken_entry_points("strategies") for n in ep.strategies}
    chosen: list[StrategySpec] = []
    for name in names:
        if name == "all":
            chosen += [s for s in specs.values() if s.variant_of is None]
        elif name in specs:
            chosen.append(specs[name])
        elif name not in broken:
            raise ValueError(f"unknown strategy {name!r}; registered: {', '.join(specs)}")
    return list(dict.fromkeys(chosen))


def broken_entry_points_asked(names: Iterable[str]) -> list[EntryPointStatus]:
    """The broken entry points the names ask for: every one for ``all``, else those
    that stand for a name asked for (and not registered by someone else). Each is a
    failed ``declaration`` case named after the entry point."""
    specs = registered(StrategySpec)
    wanted = set(names)
    return [ep for ep in broken_entry_points("strategies")
            if "all" in wanted or any(n in wanted and n not in specs for n in ep.strategies)]


def precision_unavailable(precision: str) -> str | None:
    """Why ``precision`` cannot run here for want of a package, or None."""
    missing = [p for p in current_parts().precisions[precision].requires
               if importlib.util.find_spec(p) is None]
    if not missing:
        return None
    return (f"{precision} needs {', '.join(missing)}, which is not installed here ("
            + "; ".join(install_hint(p) for p in missing) + ")")


def precisions_for(spec: StrategySpec, runner: str, only: Sequence[str] | None = None,
                   include_unavailable: bool = False) -> list[str]:
    """The strategy's precisions (its spec's and the registered ones that name it) that
    the runner's accelerator supports (32-true first), less those whose package is
    missing unless ``include_unavailable`` (the cases list them, skipped with the
    reason; the driver never runs them)."""
    chosen = [p for p in sorted(strategy_precisions(spec, RUNNERS[runner]))
              if (only is None or p in only)
              and (include_unavailable or precision_unavailable(p) is None)]
    return sorted(chosen, key=lambda p: (p != "32-true", p))


def missing_packages(spec: StrategySpec) -> str | None:
    """Why the strategy cannot run here for want of a package it requires, or None."""
    missing = [p for p in spec.requires if importlib.util.find_spec(p) is None]
    if not missing:
        return None
    hints = "; ".join(f"{p}: {install_hint(p)}" for p in missing)
    return f"{spec.name} needs {', '.join(missing)}, which is not installed here ({hints})"


def cases_for(spec: StrategySpec, runner: str, world_sizes: Sequence[int],
              only_precisions: Sequence[str] | None = None,
              only_checks: Sequence[str] | None = None) -> list[Case]:
    """The strategy's cases on ``runner``: every check of the table (or only those
    named in ``only_checks``) at each world size and precision."""
    chosen = [c for c in CHECKS if only_checks is None or c.id in only_checks]
    accelerator = RUNNERS[runner]
    devices, unavailable = runner_devices(runner)
    accelerators = strategy_accelerators(spec)
    if unavailable is None and accelerator in accelerators:
        unavailable = missing_packages(spec)
    # checks that launch nothing: once per runner, skipped where the strategy does not
    # run on the runner's accelerator
    out = [Case(spec.name, runner, None, ANY_PRECISION, check.id,
                skip=None if accelerator in accelerators else
                f"{spec.name} does not declare the {accelerator} accelerator")
           for check in chosen if isinstance(check.runs, InPytest)]
    precisions = precisions_for(spec, runner, only_precisions, include_unavailable=True)
    for world_size in world_sizes:
        skip = unavailable
        if skip is None and accelerator not in accelerators:
            skip = (f"{spec.name} runs on {', '.join(sorted(accelerators))}, not on "
                    f"the {runner} runner's {accelerator}")
        if skip is None and spec.max_devices is not None and world_size > spec.max_devices:
            skip = f"{spec.name} runs on {spec.max_devices} device(s) at most"
        if skip is None and world_size > devices:
            skip = f"the {runner} runner has {devices} device(s), fewer than {world_size}"
        if skip is None and not precisions:
            skip = (f"{spec.name} declares none of the precisions asked for "
                    f"({', '.join(only_precisions)}) on the {runner} runner"
                    if only_precisions else
                    "none of the strategy's precisions runs on this runner")
        if skip is None and precisions and all(precision_unavailable(p) for p in precisions):
            skip = precision_unavailable(precisions[0])
        for check in chosen:
            if isinstance(check.runs, InPytest):
                continue
            labels = precisions if check.per_precision else [ANY_PRECISION]
            for precision in labels or [ANY_PRECISION]:
                why = skip or (None if precision == ANY_PRECISION
                               else precision_unavailable(precision))
                out.append(Case(spec.name, runner, world_size, precision, check.id, why))
    return out


@dataclass(frozen=True, slots=True)
class Selection:
    """What one run of the suite checks.

    Attributes:
        cases: every test item, skipped ones with their reason.
        runners: the runners the run uses.
        not_here: strategies that ``all`` left out, with the reason (none of their
            accelerators has a runner here, or a package they need is missing).
        explicit_runner: whether the runner was named (not ``auto``).
        declared: the (strategy, runner) pairs whose strategy declares the runner's
            accelerator.
    """

    cases: list[Case]
    runners: list[str]
    not_here: dict[str, str] = field(default_factory=dict)
    explicit_runner: bool = False
    declared: frozenset[tuple[str, str]] = frozenset()


def select(options: SuiteOptions) -> Selection:
    """The cases for validated options.

    ``all`` takes every registered strategy (presets excluded) that declares the
    accelerator of one of the runners and whose packages are installed; the others are
    listed in ``not_here``. A strategy named explicitly is always scheduled: when
    nothing can run for it, its cases are skipped with the reason and the run's verdict
    says so.
    """
    runners = available_runners() if options.runner == "auto" else [options.runner]
    explicit = [n for n in options.strategies if n != "all"]
    chosen = resolve_strategies(explicit)
    not_here: dict[str, str] = {}
    if "all" in options.strategies:
        for spec in resolve_strategies(["all"]):
            if spec in chosen:
                continue
            accelerators = {RUNNERS[r] for r in runners}
            runs_on = strategy_accelerators(spec)
            why = (None if runs_on & accelerators else
                   f"runs on {', '.join(sorted(runs_on))}; the runners here "
                   f"({', '.join(runners) or 'none'}) run "
                   f"{', '.join(sorted(accelerators)) or 'nothing'}")
            why = why or missing_packages(spec)
            if why is None:
                chosen.append(spec)
            else:
                not_here[spec.name] = why
    names = list(options.strategies)
    # a broken entry point fails the checks that launch nothing, under its own name
    broken = [Case(ep.name, r, None, ANY_PRECISION, check.id)
              for ep in broken_entry_points_asked(names) for r in runners
              for check in CHECKS if isinstance(check.runs, InPytest)]
    cases = broken + [case for spec in chosen for r in runners
                      for case in cases_for(spec, r, options.world_sizes, options.precisions,
                                            options.checks)]
    declared = frozenset((s.name, r) for s in chosen for r in runners
                         if RUNNERS[r] in strategy_accelerators(s))
    return Selection(cases, runners, not_here, explicit_runner=options.runner != "auto",
                     declared=declared)


def declarations(selection: Selection, options: SuiteOptions) -> list[Declaration]:
    """What the report declares for each (strategy, runner) pair of
    ``selection.declared``: every precision the strategy declares on the runner's
    accelerator (missing-package ones included, whatever ``--precisions`` kept) and the
    world sizes asked for. A precision the run did not exercise is then unverified, never
    silently left out."""
    pairs = sorted(selection.declared)
    specs = {spec.name: spec for spec in resolve_strategies(sorted({s for s, _ in pairs}))}
    return [Declaration(strategy=strategy, runner=runner,
                        precisions=tuple(precisions_for(specs[strategy], runner,
                                                        include_unavailable=True)),
                        world_sizes=options.world_sizes)
            for strategy, runner in pairs]
