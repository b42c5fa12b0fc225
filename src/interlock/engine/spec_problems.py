"""What is wrong with a would-be strategy row (`StrategySpec`), as sentences: the
strategies' counterpart of `interlock.engine.part_problems`.

Imported when a strategy is registered or checked, not with the engine's tables; a
module of its own because it reads the built-in rows (the families they define), which
are themselves `StrategySpec` rows.
"""

from __future__ import annotations

from collections.abc import Mapping

from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.limits import int_in, short_repr
from interlock.engine.memory import MemoryTraits
from interlock.engine.parallelism import DIMS
from interlock.engine.part_problems import Known, common_problems, requires_problems
from interlock.engine.registration import NAME_PATTERN, suspects
from interlock.engine.registry import current_parts
from interlock.engine.specs import (
    CAPABILITIES,
    MAX_PARITY_STEPS,
    OTHER_FAMILY,
    StrategyPreset,
    StrategySpec,
    expand_preset,
)
from interlock.engine.tables import STRATEGY_PRECISION_PLUGINS, WITHDRAWN_ROWS


def strategy_families() -> tuple[str, ...]:
    """The values ``StrategySpec.family`` may take: the built-in rows' families, in
    table order, then ``"other"`` for a strategy that belongs to none of them."""
    return (*dict.fromkeys(s.family for s in BUILTIN_STRATEGIES), OTHER_FAMILY)


def strategy_problems(spec: object, known: Known) -> list[str]:
    """Everything wrong with a spec the registry is about to add (its check of the
    strategies kind): `spec_problems`, and a name withdrawn on purpose."""
    problems = spec_problems(spec)
    if getattr(spec, "name", None) in WITHDRAWN_ROWS:
        problems.append("the name is withdrawn on purpose; choose another")
    return problems


def spec_problems(spec: object) -> list[str]:
    """Everything wrong with a would-be spec, as sentences; empty when it is valid."""
    if not isinstance(spec, StrategySpec):
        return [f"expected a StrategySpec, got {type(spec).__name__}"]
    problems: list[str] = []
    common_problems(spec, NAME_PATTERN, problems)
    if spec.name == "auto":
        problems.append("name 'auto' is reserved")
    families = strategy_families()
    if spec.family not in families:
        problems.append(
            f"family {spec.family!r} is unknown; known: {', '.join(families)} "
            f"('{OTHER_FAMILY}' for a strategy that belongs to none of the others)"
        )
    parts = current_parts()
    if not spec.accelerators:
        problems.append("accelerators must name at least one accelerator")
    unknown = sorted(a for a in spec.accelerators if a not in parts.accelerators)
    if unknown:
        problems.append(
            f"accelerators {unknown} are unknown; known: {', '.join(parts.accelerators)}"
            + suspects(parts.broken["accelerators"])
        )
    if not spec.precisions:
        problems.append("precisions must name at least one precision")
    unknown = sorted(p for p in spec.precisions if p not in parts.precisions)
    if unknown:
        problems.append(f"precisions {unknown} are unknown; known: "
                        f"{', '.join(parts.precisions)}" + suspects(parts.broken["precisions"]))
    if spec.launcher is not None and spec.launcher not in parts.launchers:
        problems.append(
            f"launcher {spec.launcher!r} is unknown; known: {', '.join(parts.launchers)} or "
            "None" + suspects(parts.broken["launchers"])
        )
    launchers = spec.launchers if isinstance(spec.launchers, frozenset) else frozenset()
    if not all(isinstance(n, str) for n in launchers):
        problems.append("launchers must be a set of launcher names")
    elif spec.launcher is None and launchers:
        problems.append("launchers lists other launchers for a strategy that runs in the "
                        "calling process (launcher=None)")
    else:
        unknown = sorted(n for n in launchers if n not in parts.launchers or n == "external")
        if unknown:
            problems.append(f"launchers {unknown} are unknown; known: "
                            f"{', '.join(n for n in parts.launchers if n != 'external')}"
                            + suspects(parts.broken["launchers"]))
    if not isinstance(spec.multi_node, bool):
        problems.append("multi_node must be a bool")
    if spec.max_devices is not None and not int_in(spec.max_devices, 1):
        problems.append("max_devices must be None or an int >= 1")
    problems.extend(requires_problems(spec.requires, parts.packages))
    if spec.precision_plugin is not None and (
        spec.precision_plugin not in STRATEGY_PRECISION_PLUGINS
    ):
        problems.append(
            f"precision_plugin {spec.precision_plugin!r} is unknown; known: "
            f"{', '.join(STRATEGY_PRECISION_PLUGINS)} or None"
        )
    for accelerator, refused in spec.precision_refusals.items():
        if accelerator not in spec.accelerators:
            problems.append(f"precision_refusals names accelerator {accelerator!r}, which "
                            "the strategy does not declare")
        if not isinstance(refused, Mapping) or not all(
            isinstance(p, str) and isinstance(why, str) and why.strip()
            for p, why in refused.items()
        ):
            problems.append(f"precision_refusals[{accelerator!r}] must map precisions to "
                            "non-empty reasons")
        elif not set(refused) <= spec.precisions:
            problems.append(f"precision_refusals[{accelerator!r}] names precisions the "
                            f"strategy does not declare: {sorted(set(refused) - spec.precisions)}")
    if spec.parity_tolerance is not None and not (
        isinstance(spec.parity_tolerance, tuple) and len(spec.parity_tolerance) == 2
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1
                for t in spec.parity_tolerance)
    ):
        problems.append("parity_tolerance must be None or (rtol, atol), each in [0, 1)")
    if spec.parity_steps is not None and not int_in(spec.parity_steps, 1, MAX_PARITY_STEPS):
        problems.append(f"parity_steps must be None or an int from 1 to {MAX_PARITY_STEPS}")
    unknown = sorted(c for c in spec.capabilities if c not in CAPABILITIES)
    if unknown:
        problems.append(
            f"capabilities {unknown} are unknown; known: {', '.join(CAPABILITIES)}"
        )
    problems.extend(_parallelism_problems(spec))
    if spec.memory is not None:
        problems.extend(spec.memory.problems() if isinstance(spec.memory, MemoryTraits)
                        else [f"memory must be a MemoryTraits or None, got "
                              f"{type(spec.memory).__name__}"])
    for accelerator in spec.substitutes:
        if accelerator not in parts.accelerators:
            problems.append(f"substitutes names unknown accelerator {accelerator!r}")
        elif accelerator in spec.accelerators:
            problems.append(
                f"substitutes names {accelerator!r}, which the strategy itself supports"
            )
    return problems


def expanded(row: object, taken: Mapping[str, StrategySpec]
             ) -> tuple[StrategySpec | None, list[str]]:
    """A registered row as a full spec: a `StrategySpec` as it is, a `StrategyPreset`
    expanded from the strategy it names (registered in ``taken``); with what is wrong
    with the preset itself (its spec is then None)."""
    if not isinstance(row, StrategyPreset):
        return (row if isinstance(row, StrategySpec) else None), []
    problems: list[str] = []
    base = taken.get(row.strategy) if isinstance(row.strategy, str) else None
    if base is None:
        problems.append(f"strategy {short_repr(row.strategy)} is not a registered strategy; "
                        "a preset may name only strategies registered before it")
    if not isinstance(row.options, Mapping) or not all(isinstance(k, str)
                                                        for k in row.options):
        problems.append("options must map keyword names to values")
    if row.variant_of is not None and row.variant_of not in (*taken, row.strategy):
        problems.append(f"variant_of {short_repr(row.variant_of)} is not a registered "
                        "strategy")
    launcher = None
    if row.launcher is not None and not isinstance(row.launcher, str):
        problems.append(f"launcher must be a launcher name or None, got "
                        f"{type(row.launcher).__name__}")
    elif base is not None and row.launcher is not None:
        launcher = current_parts().launchers.get(row.launcher)
        takes = current_parts().strategy_launchers(base)
        if row.launcher not in takes:
            named = ", ".join(sorted(takes)) or "none (it runs in the calling process)"
            problems.append(f"launcher {short_repr(row.launcher)} is not one strategy "
                            f"{base.name!r} runs under; it takes {named}")
    if problems or base is None:
        return None, problems
    return expand_preset(row, base, launcher), []


def _parallelism_problems(spec: StrategySpec) -> list[str]:
    """What is wrong with a spec's `parallel_dims` and `default_parallelism`."""
    problems: list[str] = []
    unknown = sorted(str(d) for d in spec.parallel_dims if d not in DIMS)
    if unknown:
        problems.append(f"parallel_dims {unknown} are unknown; known: {', '.join(DIMS)}")
    defaults = spec.default_parallelism
    if not isinstance(defaults, Mapping):
        return [*problems, "default_parallelism must map dimensions to degrees"]
    for dim, degree in defaults.items():
        if dim not in DIMS:
            problems.append(f"default_parallelism names {dim!r}, which is not a dimension; "
                            f"known: {', '.join(DIMS)}")
        elif not (degree in ("auto", "node") or int_in(degree, 1)):
            problems.append(f"default_parallelism[{dim!r}] = {degree!r} must be an int >= 1, "
                            "'auto' or 'node'")
    if sum(1 for d in defaults.values() if d == "auto") > 1:
        problems.append("default_parallelism may have at most one 'auto' degree")
    return problems
