"""Resolve every cell of the matrix, fast, with the engine's own stage functions.

Calling `plan()` per cell would take minutes. Each stage depends on few inputs: the
flags stage on each flag alone; the accelerator, devices and cluster stages on
(accelerator, devices, num_nodes); the strategy stage on those plus the strategy; the
precision, parallelism and plugins stages on (accelerator, strategy row, precision,
processes per node, num_nodes). The sizing and memory stages have nothing to decide
without a model, which no cell gives. So each stage
function of `interlock.connector.stages` runs once per distinct input (memoised by the
parsed values its input declares), and a cell's outcome is the first refusal in the
engine's order, or the plan assembled from the stages' results. A test compares this
with `plan()` cell by cell.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from interlock.connector.errors import ResolutionError
from interlock.connector.planner import Plan
from interlock.connector.registry import current_parts, registered
from interlock.connector.specs import StrategySpec
from interlock.connector.stages.accelerator import AcceleratorInput, choose_accelerator
from interlock.connector.stages.cluster import ClusterChoice, ClusterInput, choose_cluster
from interlock.connector.stages.devices import DevicesInput, place_devices
from interlock.connector.stages.flags import Flags, OneFlag, read_flag
from interlock.connector.stages.parallelism import (
    ParallelismInput,
    choose_parallelism,
    given_degrees,
)
from interlock.connector.stages.plugins import PluginsInput, choose_plugins
from interlock.connector.stages.precision import PrecisionInput, choose_precision
from interlock.connector.stages.strategy import StrategyChoice, StrategyInput, choose_strategy
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

    parsed_accelerator = {a: parse("accelerator", a) for a in space.accelerators}
    parsed_devices = [parse("devices", d) for d in space.devices]
    parsed_strategy = {s: parse("strategy", s) for s in strategies}
    parsed_precision = [parse("precision", p) for p in space.precisions]
    parsed_nodes = {n: parse("num_nodes", n) for n in space.num_nodes}

    # each memo is keyed by the parsed values the stage's input declares
    placed: dict[tuple[object, ...], tuple[str, ClusterChoice] | str] = {}
    chosen: dict[tuple[object, ...], StrategyChoice | str] = {}
    checked: dict[tuple[object, ...], str] = {}

    # each runs on a memo miss only: the loop below looks the memos up itself (a
    # function call per cell would cost more than the lookup)
    def place(key: tuple[object, ...], a: Flags, d: Flags,
              n: Flags) -> tuple[str, ClusterChoice] | str:
        if key not in placed:
            try:
                accelerator = choose_accelerator(AcceleratorInput(
                    machine=machine, parts=parts, requested=a.accelerator))
                placement = place_devices(DevicesInput(
                    machine=machine, parts=parts, accelerator=accelerator.name,
                    devices=d.devices, num_nodes=n.num_nodes))
                cluster = choose_cluster(ClusterInput(
                    machine=machine, parts=parts, accelerator=accelerator.name,
                    devices=d.devices, parallel_devices=placement.parallel_devices,
                    num_nodes=n.num_nodes))
                placed[key] = (accelerator.name, cluster)
            except ResolutionError as error:
                placed[key] = outcome_of(error)
        return placed[key]

    def choose(key: tuple[object, ...], base: tuple[str, ClusterChoice], d: Flags, n: Flags,
               s: Flags) -> StrategyChoice | str:
        accelerator, cluster = base
        if key not in chosen:
            try:
                chosen[key] = choose_strategy(StrategyInput(
                    machine=machine, parts=parts, specs=specs, requested=s.strategy,
                    accelerator=accelerator, devices=d.devices,
                    parallel_devices=cluster.parallel_devices, num_nodes=n.num_nodes,
                    cluster=cluster.name, cluster_external=cluster.external,
                    accelerator_reason=""))
            except ResolutionError as error:
                chosen[key] = outcome_of(error)
        return chosen[key]

    def check(key: tuple[object, ...], accelerator: str, choice: StrategyChoice,
              cluster: ClusterChoice, s: Flags, p: Flags, n: Flags) -> str:
        spec = choice.spec
        explicit = s.strategy != "auto"
        if key not in checked:
            try:
                precision = choose_precision(PrecisionInput(
                    machine=machine, parts=parts, accelerator=accelerator, spec=spec,
                    explicit=explicit, requested=p.precision))
                legacy, legacy_source = given_degrees(spec)
                choose_parallelism(ParallelismInput(
                    parts=parts, specs=specs, spec=spec, accelerator=accelerator,
                    precision=precision.name,
                    devices_per_node=len(choice.parallel_devices), num_nodes=n.num_nodes,
                    legacy=legacy, legacy_source=legacy_source))
                choose_plugins(PluginsInput(parts=parts, accelerator=accelerator))
                world_size = len(choice.parallel_devices) * n.num_nodes
                checked[key] = (f"ok {spec.name} {choice.launcher or '-'} "
                                f"{choice.cluster_environment} "
                                f"{world_size} {precision.name}")
            except ResolutionError as error:
                checked[key] = outcome_of(error)
        return checked[key]

    for accelerator in space.accelerators:
        a = parsed_accelerator[accelerator]
        for strategy in strategies:
            s = parsed_strategy[strategy]
            for p_index, precision in enumerate(space.precisions):
                p = parsed_precision[p_index]
                for d_index, devices in enumerate(space.devices):
                    d = parsed_devices[d_index]
                    for nodes in space.num_nodes:
                        n = parsed_nodes[nodes]
                        cell = Cell(profile.name, accelerator, show(devices), strategy,
                                    show(precision), nodes)
                        # the first refusal in the flags stage's order
                        first = next((f for f in (a, d, s, p, n) if isinstance(f, str)), None)
                        if first is not None:
                            yield cell, first
                            continue
                        assert not isinstance(a, str) and not isinstance(d, str)
                        assert not isinstance(s, str) and not isinstance(p, str)
                        assert not isinstance(n, str)
                        key: tuple[object, ...] = (a.accelerator, d.devices, n.num_nodes)
                        base = placed.get(key) or place(key, a, d, n)
                        if isinstance(base, str):
                            yield cell, base
                            continue
                        key = (*key, s.strategy)
                        choice = chosen.get(key) or choose(key, base, d, n, s)
                        if isinstance(choice, str):
                            yield cell, choice
                            continue
                        key = (base[0], choice.spec.name, s.strategy != "auto", p.precision,
                               choice.launcher, base[1].name, len(choice.parallel_devices),
                               n.num_nodes)
                        yield cell, checked.get(key) or check(key, base[0], choice, base[1],
                                                              s, p, n)
