"""Resolve every cell of the matrix, fast, with the engine's own stage runner.

Calling `plan()` per cell would take minutes. The matrix reads each flag once
(`read_flag`), then runs the same steps `plan()` runs (`interlock.engine.stages.STEPS`)
through `run_memoised`: each stage runs once per distinct value of the facts it
declares it reads, across the whole profile, and a cell's outcome is the first refusal
in the engine's order, or the plan's summary. The sizing and memory stages have nothing
to decide without a model, which no cell gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from interlock.engine.errors import ResolutionError
from interlock.engine.planner import Plan
from interlock.engine.registry import current_parts, registered
from interlock.engine.runner import Memo, fact, run_memoised
from interlock.engine.specs import StrategySpec
from interlock.engine.stages import STEPS
from interlock.engine.stages.flags import Flags, OneFlag, read_flag, seeds
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
    return _resolved(result.strategy, result.launcher, result.cluster_environment,
                     result.world_size, result.precision)


def _resolved(strategy: str, launcher: object, cluster: object, world_size: int,
              precision: object) -> str:
    return f"ok {strategy} {launcher or '-'} {cluster} {world_size} {precision}"


def evaluate(profile: Profile, space: FlagSpace = FLAG_SPACE) -> Iterator[tuple[Cell, str]]:
    """Every cell of ``space`` on ``profile`` with its outcome, in a fixed order."""
    machine = profile.machine
    specs = registered(StrategySpec)
    parts = current_parts()
    strategies = space.strategies()

    def parse(flag: OneFlag, value: object) -> Flags | str:
        try:
            return read_flag(flag, value, specs=specs, parts=parts)
        except ResolutionError as error:
            return outcome_of(error)

    parsed_accelerator = [parse("accelerator", a) for a in space.accelerators]
    parsed_devices = [parse("devices", d) for d in space.devices]
    parsed_strategy = [parse("strategy", s) for s in strategies]
    parsed_precision = [parse("precision", p) for p in space.precisions]
    parsed_nodes = [parse("num_nodes", n) for n in space.num_nodes]
    shown_devices = [show(d) for d in space.devices]
    shown_precisions = [show(p) for p in space.precisions]
    # the seeds with every flag at its parsed default; each cell sets the five the
    # space spans
    facts = seeds(read_flag("num_nodes", 1, specs=specs, parts=parts), machine=machine,
                  parts=parts, specs=specs)
    memo: Memo = {}
    refusals: dict[int, str] = {}  # a refusal's outcome, by the shared error's id

    for accelerator, a in zip(space.accelerators, parsed_accelerator, strict=True):
        for strategy, s in zip(strategies, parsed_strategy, strict=True):
            for precision, p in zip(shown_precisions, parsed_precision, strict=True):
                for devices, d in zip(shown_devices, parsed_devices, strict=True):
                    for nodes, n in zip(space.num_nodes, parsed_nodes, strict=True):
                        cell = Cell(profile.name, accelerator, devices, strategy, precision,
                                    nodes)
                        # the first refusal in the flags stage's order
                        first = next((f for f in (a, d, s, p, n) if isinstance(f, str)), None)
                        if first is not None:
                            yield cell, first
                            continue
                        assert not isinstance(a, str) and not isinstance(d, str)
                        assert not isinstance(s, str) and not isinstance(p, str)
                        assert not isinstance(n, str)
                        # one dict for every cell: each step reads only seeds and what
                        # the steps before it wrote for this cell (`check_steps`)
                        facts.update({"accelerator_flag": a.accelerator,
                                      "devices": d.devices, "strategy_flag": s.strategy,
                                      "precision_flag": p.precision,
                                      "num_nodes": n.num_nodes})
                        refused = run_memoised(STEPS, facts, memo)
                        if refused is None:
                            yield cell, _resolved(
                                fact(facts, "spec", StrategySpec).name,
                                facts["launcher"], facts["cluster_environment"],
                                len(fact(facts, "parallel_devices", tuple)) * n.num_nodes,
                                facts["precision"])
                        else:
                            known = refusals.get(id(refused))
                            if known is None:
                                known = refusals[id(refused)] = outcome_of(refused)
                            yield cell, known
