"""Resolve every cell of the matrix, fast, with the engine's own rules.

Calling `plan()` per cell would take minutes. The stages depend on few inputs each:
the flags stage on each flag alone; the accelerator, devices and cluster stages on
(accelerator, devices, num_nodes); the strategy stage on those plus the strategy; the
precision stage on (accelerator, strategy row, precision). So each stage runs once per
distinct input on the real rule objects, and a cell's outcome is the first refusal in
the engine's order, or the plan assembled from its parts. A test compares this with
`plan()` cell by cell.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from interlock.connector.errors import ResolutionError
from interlock.connector.flag_rules import (
    ACCELERATOR_FLAG,
    DEVICES_FLAG,
    NUM_NODES_FLAG,
    PRECISION_FLAG,
    STRATEGY_FLAG,
)
from interlock.connector.machine import Machine
from interlock.connector.machine_rules import ACCELERATOR_STAGE, CLUSTER_STAGE, DEVICES_STAGE
from interlock.connector.planner import Plan
from interlock.connector.registry import strategy_specs
from interlock.connector.rules import Context, Decision, DevicesRequest, run_decision, run_stages
from interlock.connector.specs import StrategySpec
from interlock.connector.strategy_rules import PLUGINS_STAGE, PRECISION_STAGE, STRATEGY_STAGE
from interlock.matrix.profiles import Profile
from interlock.matrix.space import FLAG_SPACE, FlagSpace


@dataclass(frozen=True, slots=True)
class Cell:
    """One combination of flags on one profile (devices shown as written)."""

    profile: str
    accelerator: str
    devices: str
    strategy: str
    precision: str
    num_nodes: int


def show(value: object) -> str:
    """A flag value as the lock file and the docs write it (quoted when a string would
    read as a number: the string "16" and the int 16 are different flags)."""
    if isinstance(value, str):
        return repr(value) if value.lstrip("-").isdigit() else value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def outcome_of(result: Plan | ResolutionError) -> str:
    """The outcome of one cell as one token string.

    A plan: ``ok <strategy> <launcher> <cluster> <world size> <precision>``; a refusal:
    ``<code> <flag>``. Messages are left out: they quote the flag as written.
    """
    if isinstance(result, ResolutionError):
        return f"{result.code} {result.flag}"
    return (f"ok {result.strategy} {result.launcher or '-'} {result.cluster_environment} "
            f"{result.world_size} {result.precision}")


def _context(machine: Machine, specs: Mapping[str, StrategySpec]) -> Context:
    return Context(machine=machine, specs=specs, accelerator_flag=None, devices_flag=None,
                   strategy_flag=None, precision_flag=None, num_nodes_flag=None,
                   plugins_flag=None)


_Parsed = tuple[str | int | DevicesRequest | None, str | None]


def _parse(decision: Decision, field: str, attribute: str, value: object,
           machine: Machine, specs: Mapping[str, StrategySpec]) -> _Parsed:
    """(parsed value, None) or (None, refusal outcome) for one flag value."""
    ctx = _context(machine, specs)
    setattr(ctx, field, value)
    try:
        run_decision("flags", decision, ctx)
    except ResolutionError as error:
        return None, outcome_of(error)
    parsed: str | int | DevicesRequest = getattr(ctx, attribute)
    return parsed, None


def evaluate(profile: Profile, space: FlagSpace = FLAG_SPACE) -> Iterator[tuple[Cell, str]]:
    """Every cell of ``space`` on ``profile`` with its outcome, in a fixed order."""
    machine = profile.machine
    specs = strategy_specs()
    strategies = space.strategies()
    parsed_accelerator = {a: _parse(ACCELERATOR_FLAG, "accelerator_flag", "accelerator_input",
                                    a, machine, specs) for a in space.accelerators}
    parsed_devices = [_parse(DEVICES_FLAG, "devices_flag", "devices", d, machine, specs)
                      for d in space.devices]
    parsed_strategy = {s: _parse(STRATEGY_FLAG, "strategy_flag", "strategy_input", s,
                                 machine, specs) for s in strategies}
    parsed_precision = [_parse(PRECISION_FLAG, "precision_flag", "precision_input", p,
                               machine, specs) for p in space.precisions]
    parsed_nodes = {n: _parse(NUM_NODES_FLAG, "num_nodes_flag", "num_nodes", n, machine, specs)
                    for n in space.num_nodes}

    placed: dict[tuple[object, ...], Context | str] = {}
    chosen: dict[tuple[object, ...], Context | str] = {}
    checked: dict[tuple[object, ...], str | None] = {}
    assembled: dict[tuple[object, ...], str] = {}

    def place(accelerator: object, devices: object, nodes: object) -> Context | str:
        key = (accelerator, devices, nodes)
        if key not in placed:
            ctx = _context(machine, specs)
            ctx.accelerator_input = str(accelerator)
            ctx.devices = devices  # type: ignore[assignment]
            ctx.num_nodes = int(nodes)  # type: ignore[call-overload]
            try:
                run_stages((ACCELERATOR_STAGE, DEVICES_STAGE, CLUSTER_STAGE), ctx)
                placed[key] = ctx
            except ResolutionError as error:
                placed[key] = outcome_of(error)
        return placed[key]

    def choose(base: Context, key: tuple[object, ...], strategy: str) -> Context | str:
        full = (*key, strategy)
        if full not in chosen:
            ctx = _context(machine, specs)
            for name in ("accelerator", "accelerator_reason", "parallel_devices", "cluster",
                         "cluster_row", "cluster_external", "num_nodes", "accelerator_input",
                         "devices"):
                setattr(ctx, name, getattr(base, name))
            ctx.strategy_input = strategy
            ctx.explicit_spec = None if strategy == "auto" else specs[strategy]
            try:
                run_stages((STRATEGY_STAGE,), ctx)
                chosen[full] = ctx
            except ResolutionError as error:
                chosen[full] = outcome_of(error)
        return chosen[full]

    def check(ctx: Context, precision: str) -> str | None:
        spec = ctx.chosen_spec
        key = (ctx.accelerator, spec.name, precision, ctx.explicit_spec is None)
        if key not in checked:
            probe = _context(machine, specs)
            probe.accelerator, probe.spec, probe.precision_input = ctx.accelerator, spec, precision
            probe.explicit_spec = ctx.explicit_spec
            try:
                run_stages((PRECISION_STAGE, PLUGINS_STAGE), probe)
                checked[key] = None
            except ResolutionError as error:
                checked[key] = outcome_of(error)
        return checked[key]

    for accelerator in space.accelerators:
        a, a_err = parsed_accelerator[accelerator]
        for strategy in strategies:
            s, s_err = parsed_strategy[strategy]
            for p_index, precision in enumerate(space.precisions):
                p, p_err = parsed_precision[p_index]
                for d_index, devices in enumerate(space.devices):
                    d, d_err = parsed_devices[d_index]
                    for nodes in space.num_nodes:
                        n, n_err = parsed_nodes[nodes]
                        cell = Cell(profile.name, accelerator, show(devices), strategy,
                                    show(precision), nodes)
                        first = a_err or d_err or s_err or p_err or n_err
                        if first is not None:
                            yield cell, first
                            continue
                        base = place(a, d, n)
                        if isinstance(base, str):
                            yield cell, base
                            continue
                        ctx = choose(base, (a, d, n), str(s))
                        if isinstance(ctx, str):
                            yield cell, ctx
                            continue
                        refusal = check(ctx, str(p))
                        if refusal is not None:
                            yield cell, refusal
                            continue
                        key = (a, d, n, s, p)
                        if key not in assembled:
                            spec = ctx.chosen_spec
                            assembled[key] = (
                                f"ok {spec.name} {ctx.launcher or '-'} {ctx.cluster} "
                                f"{ctx.world_size} {p}"
                            )
                        yield cell, assembled[key]
