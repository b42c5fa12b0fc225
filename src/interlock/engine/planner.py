"""`plan()`: flags and a machine in, a `Plan` (or one `ResolutionError`) out."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeAlias, TypeVar, cast

from interlock.engine.errors import ResolutionError
from interlock.engine.limits import MAX_DEVICES_PER_NODE
from interlock.engine.machine import Machine
from interlock.engine.memory import MemoryEstimate, format_bytes
from interlock.engine.model import ModelShape
from interlock.engine.parallelism import MeshLayout, Parallelism
from interlock.engine.part_tables import PartTables
from interlock.engine.registry import (
    KINDS,
    broken_entry_points,
    current_parts,
    kind_of,
    registered,
    registry_version,
)
from interlock.engine.runner import Run, fact, run_steps
from interlock.engine.specs import StrategySpec
from interlock.engine.stages import STAGES, STEPS
from interlock.engine.stages.accelerator import AcceleratorChoice
from interlock.engine.stages.flags import plugin_kind, read_flags, seeds
from interlock.engine.stages.memory import MemoryChoice
from interlock.engine.stages.parallelism import ParallelismChoice
from interlock.engine.stages.plugins import PluginsChoice
from interlock.engine.stages.precision import PrecisionChoice
from interlock.engine.stages.sizing import Sizing
from interlock.engine.stages.strategy import StrategyChoice
from interlock.engine.tables import (
    RESTART_BACKOFF_FACTOR,
    RESTART_BACKOFF_S,
    RESTART_MAX_BACKOFF_S,
    LauncherRow,
)
from interlock.engine.trace import TraceStep
from interlock.engine.written import Written

__all__ = ["STAGES", "Plan", "plan"]

R = TypeVar("R")

class AcceleratorPart(Protocol):
    """What the engine needs of an Accelerator instance passed as ``accelerator=``."""

    interlock_part_kind: ClassVar[str]

    @property
    def name(self) -> str: ...


class StrategyPart(Protocol):
    """What the engine needs of a Strategy instance passed as ``strategy=``."""

    interlock_part_kind: ClassVar[str]

    @property
    def name(self) -> str: ...

    def given_parts(self) -> dict[str, object]: ...


#: What the accelerator flag accepts: a name or an Accelerator instance.
AcceleratorFlag: TypeAlias = str | AcceleratorPart
#: What the strategy flag accepts: a registry name or a Strategy instance.
StrategyFlag: TypeAlias = str | StrategyPart
#: What the devices flag accepts: "auto", a count, -1, "0,1"-style ids, or a list of ids.
DevicesFlag: TypeAlias = int | str | Sequence[int]
#: What the precision flag accepts: a canonical name or a legacy alias (16, "bf16", ...).
PrecisionFlag: TypeAlias = str | int
#: What the parallelism flag accepts: a Parallelism, a mapping of dimensions to degrees,
#: "dp_shard=2,tp=2"-style text, or None for the strategy's default degrees.
ParallelismFlag: TypeAlias = Parallelism | Mapping[str, int | str] | str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A resolved, validated distributed setup, before anything is started.

    Attributes:
        accelerator: canonical accelerator name (cpu, cuda, mps, xla).
        strategy: canonical strategy name from the registry.
        precision: canonical precision name.
        parallel_devices: torch device strings of the processes on one node.
        num_nodes: number of nodes.
        world_size: total number of processes.
        launcher: how the processes are created, or None for in-process strategies.
        cluster_environment: where ranks and addresses come from.
        checkpoint_io: which checkpoint IO saves and loads.
        notes: everything the user should be told (aliases used, substitutions).
        trace: every rule applied, in order.
        spec: the strategy's registry row.
        plugins: plugin objects given by the user, to be wired by the runtime.
        machine: the machine snapshot the plan was made for.
        parallelism: the degrees of parallelism, every one an int, multiplying to the
            world size.
        mesh: the device mesh they make: dimension names outermost first, and sizes.
        memory: what the largest rank holds, in bytes (`MemoryEstimate`), when
            ``plan(model=...)`` gave the model's shape; None otherwise.
        model: the model's shape the estimate is for, or None.
        optimizer: the optimizer row the estimate counted, or None.
    """

    accelerator: str
    strategy: str
    precision: str
    parallel_devices: tuple[str, ...]
    num_nodes: int
    world_size: int
    launcher: str | None
    cluster_environment: str
    checkpoint_io: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]
    spec: StrategySpec = field(repr=False)
    parallelism: Parallelism = field(
        default_factory=lambda: Parallelism(dp_shard=1))
    mesh: MeshLayout = field(default_factory=lambda: MeshLayout.of(Parallelism(dp_shard=1)))
    plugins: tuple[object, ...] = field(default=(), repr=False)
    strategy_instance: object | None = field(default=None, repr=False, compare=False)
    accelerator_instance: object | None = field(default=None, repr=False, compare=False)
    machine: Machine = field(default_factory=Machine, repr=False, compare=False)
    memory: MemoryEstimate | None = None
    model: ModelShape | None = field(default=None, repr=False)
    optimizer: str | None = None
    #: the registry's rows when it was planned, which `rows` reads (None: the
    #: current rows, for a plan made by hand or unpickled)
    _tables: PartTables | None = field(default=None, repr=False, compare=False)

    @property
    def devices(self) -> int:
        """Processes (devices) per node."""
        return len(self.parallel_devices)

    @property
    def rows(self) -> Mapping[str, Any]:
        """The row of each kind this plan chose, keyed by the registry's kind
        (``"strategies"``, ``"accelerators"``, ``"precisions"``, ``"environments"``,
        ``"checkpoint_io"``, and ``"launchers"`` and ``"optimizers"`` when it has
        them), as they were registered when it was planned: building the plan reads
        its parts from these rows, so a row unregistered or replaced afterwards does
        not change what the plan builds. A name no row has (a plugin instance's own)
        has no entry."""
        tables = self._tables if self._tables is not None else current_parts()
        found: dict[str, Any] = {}
        for kind, row_kind in KINDS.items():
            name = getattr(self, row_kind.planned_as) if row_kind.planned_as else None
            row = tables.rows[kind].get(name) if name is not None else None
            if row is not None:
                found[kind] = row
        return MappingProxyType(found)

    def row(self, row_type: type[R]) -> R:
        """The row of ``row_type``'s kind this plan chose (see `rows`):
        ``plan.row(PrecisionRow)``.

        Raises:
            LookupError: the plan chose no row of that kind (no launcher for a strategy
                that runs in the calling process, no optimizer without a model, a
                plugin instance's own name).
            RegistrationError: ``row_type`` is no kind of row.
        """
        row_kind = kind_of(row_type)
        found = self.rows.get(row_kind.kind)
        if found is None:
            raise LookupError(f"this plan chose no {row_kind.noun} row")
        return cast("R", found)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled (a spawned rank's strategy holds its plan) without the snapshot: its
        # rows may hold callables that do not pickle (a detection predicate), and a
        # plan unpickled in another process reads the rows registered there
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["_tables"] = None
        return (_unpickled_plan, (state,))

    def build(self) -> StrategyPart:
        """Wire the strategy this plan describes: the second half of
        :func:`interlock.resolve`, which is typed with the runtime's `Strategy`.

        The engine never imports the runtime: the builder that lives with the
        strategies (`interlock.strategies.build.build_strategy`, through
        `interlock.resolving`) is handed to the engine when ``interlock`` is imported
        (`use_builder`), and imports the strategy's module now.

        Raises:
            ResolutionError: ``unknown-option`` when the row's options name a keyword
                the factory class does not take (see
                `interlock.strategies.build.check_options`), and the other refusals of
                building (an object that only claims to be a part).
        """
        if _builder is None:  # pragma: no cover - importing interlock sets it
            raise RuntimeError("no builder: import interlock (or interlock.resolving) "
                               "before building a plan")
        return _builder(self)

    def summary(self) -> str:
        """One line: what will run, where, and how."""
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"
        return (
            f"{self.strategy} on {self.devices} x {self.accelerator} x {nodes} "
            f"(world size {self.world_size}), precision {self.precision}"
        )

    def on_failure(self) -> str:
        """What happens when a rank fails under this plan's launcher, and whether
        ``Strategy.launch(fn, max_restarts=N)`` can restart the job (the restart
        budget and its back-off are the caller's: see
        :class:`interlock.strategies.restarts.RestartPolicy`)."""
        backoff = (f"a back-off of {RESTART_BACKOFF_S:g} s, x{RESTART_BACKOFF_FACTOR:g} each "
                   f"time, at most {RESTART_MAX_BACKOFF_S:g} s, unless launch() is told "
                   "otherwise")
        if self.launcher is None:
            return ("the exception reaches the caller; launch(max_restarts=N) runs the "
                    f"function again in this process, up to N more times, after {backoff}")
        row: LauncherRow | None = self.rows.get("launchers")
        if row is None:
            return "decided by the launcher"
        if row.restarts:
            return f"{row.on_failure}; the budget is N restarts, each after {backoff}"
        return row.on_failure

    def explain(self) -> str:
        """Multi-line text: the outcome, the notes, and every rule that decided it."""
        lines = [
            f"Plan: {self.summary()}",
            f"  devices per node:     {', '.join(self.parallel_devices)}",
            f"  launcher:             {self.launcher or 'none (runs in this process)'}",
            f"  cluster environment:  {self.cluster_environment}",
            f"  checkpoint IO:        {self.checkpoint_io}",
            f"  parallelism:          {self._degrees_text()}",
            f"  device mesh:          {self.mesh.describe()} (outermost first)",
            *textwrap.wrap(self.on_failure(), 88, initial_indent="  on failure:           ",
                           subsequent_indent=" " * 24),
        ]
        if self.memory is not None:
            assert self.model is not None  # a plan with an estimate has its shape
            lines.append(f"Memory per rank ({self.memory.rank}), {self.model.describe()}, "
                         f"optimizer {self.optimizer}:")
            lines.extend(f"  {line}" for line in self.memory.breakdown())
        if self.plugins:
            lines.append(
                "  plugins:              "
                + ", ".join(f"{plugin_kind(p)}={type(p).__name__}" for p in self.plugins)
            )
        if self.notes:
            lines.append("Notes:")
            lines.extend(f"  - {note}" for note in self.notes)
        lines.append("How it was decided:")
        width = max(len(step.rule) for step in self.trace)
        for i, step in enumerate(self.trace, 1):
            lines.append(f"  {i:2d}. {step.rule:<{width}}  {step.reason}")
        return "\n".join(lines)

    def _degrees_text(self) -> str:
        enabled = [f"{d}={getattr(self.parallelism, d)}" for d in self.parallelism.enabled()]
        return " x ".join(enabled) if enabled else "none (one rank)"

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly view (plugins by class name)."""
        return {
            "accelerator": self.accelerator,
            "strategy": self.strategy,
            "precision": self.precision,
            "parallel_devices": list(self.parallel_devices),
            "num_nodes": self.num_nodes,
            "world_size": self.world_size,
            "launcher": self.launcher,
            "cluster_environment": self.cluster_environment,
            "checkpoint_io": self.checkpoint_io,
            "parallelism": self.parallelism.to_dict(),
            "mesh": {"dims": list(self.mesh.dims), "shape": list(self.mesh.shape)},
            "plugins": [type(p).__name__ for p in self.plugins],
            "notes": list(self.notes),
            "trace": [step.to_dict() for step in self.trace],
            **({"memory": self.memory.to_dict(), "optimizer": self.optimizer,
                "model": self.model.to_dict() if self.model is not None else None}
               if self.memory is not None else {}),
        }


def _unpickled_plan(state: dict[str, Any]) -> Plan:
    return Plan(**state)


#: what builds a Plan's strategy (`interlock.resolving.build`), handed over by
#: `use_builder` when ``interlock`` is imported: the engine never imports the runtime
_builder: Callable[[Plan], StrategyPart] | None = None


def use_builder(builder: Callable[[Plan], StrategyPart]) -> None:
    """Tell `Plan.build` what builds a strategy (`interlock.resolving` calls this once,
    at import; the engine depends on nothing of the runtime)."""
    global _builder
    _builder = builder


def check_machine(function: str, machine: object) -> None:
    """Refuse a ``machine`` argument that is not a `Machine` (a profile name, a dict)."""
    if machine is not None and not isinstance(machine, Machine):
        raise TypeError(
            f"{function}(): `machine` must be an interlock.Machine or None, got "
            f"{type(machine).__name__}; build one with interlock.Machine(cuda_devices=...) "
            "or pass None to probe this machine"
        )


#: Plans already made, by type-exact flags, machine and registry version. plan() is
#: pure and Plans are immutable, so handing out the same object again is invisible
#: to callers; only successful plans without plugin objects are kept.
_MEMO: dict[tuple[object, ...], Plan] = {}
MEMO_SIZE = 1024


def clear_cache() -> None:
    """Forget memoised plans (they are also keyed by the registry's version)."""
    _MEMO.clear()


def _exact(value: object) -> object:
    """A hashable stand-in for a flag that never equates different types.

    ``1``, ``True`` and ``1.0`` are equal and hash alike in Python but are different
    flags here (a count, an invalid bool, an invalid float), so the type is part of
    the key. Returns None for values that are not memoised.
    """
    if value is None:
        return ("none",)
    kind = type(value)
    if (kind is int or (kind is str and len(value) <= 1024)  # type: ignore[arg-type]
            or kind is ModelShape or kind is Parallelism):
        return (kind, value)
    # a list longer than any node's devices is refused; it is not worth hashing
    if (isinstance(value, (list, tuple)) and kind in (list, tuple)
            and len(value) <= MAX_DEVICES_PER_NODE):
        items = tuple(value)
        if all(type(v) is int for v in items):
            return (kind, items)
    return None


def plan(
    accelerator: AcceleratorFlag = "auto",
    devices: DevicesFlag = "auto",
    strategy: StrategyFlag = "auto",
    precision: PrecisionFlag = "32-true",
    num_nodes: int = 1,
    plugins: object = None,
    machine: Machine | None = None,
    parallelism: ParallelismFlag = None,
    model: ModelShape | None = None,
    optimizer: str | None = None,
    micro_batch_size: int | None = None,
    launcher: str | None = None,
) -> Plan:
    """Resolve training flags on a machine into a validated `Plan`.

    Pure: no process group, no CUDA initialisation, no environment change. The same
    flags on the same `Machine` always give the same plan.

    Args:
        accelerator: "auto", "cpu", "cuda", "gpu", "mps", "tpu" or "xla", or an
            Accelerator instance.
        devices: "auto", a count, -1 for all, "0,1"-style ids, or a list of ids; at
            most ``MAX_DEVICES_PER_NODE`` (4,096) per node, from
            `interlock.engine.limits`.
        strategy: a registered strategy name, "auto", or a Strategy instance (whose
            own parts must not also be set by flags).
        precision: a canonical precision or a legacy alias (16, "bf16", 32, 64).
        num_nodes: number of nodes, an int from 1 to ``MAX_NUM_NODES`` (262,144), with
            devices x num_nodes at most ``MAX_WORLD_SIZE`` (8,388,608).
        plugins: a plugin object or a sequence of them (precision, checkpoint IO,
            cluster environment).
        machine: the machine to plan for; None probes this one.
        parallelism: degrees of parallelism (`interlock.Parallelism`, a mapping such
            as ``{"dp_replicate": 2, "dp_shard": 2}`` or ``"dp_replicate=2,dp_shard=2"``);
            None runs the strategy's default degrees. See ``docs/parallelism.md``.
        model: the model's shape (`interlock.ModelShape`, or
            ``interlock.model_shape(module)``): the plan then says what each rank holds
            (`Plan.memory`) and refuses a setup that does not fit the machine's memory
            (``insufficient-memory``). See ``docs/memory.md``.
        optimizer: the optimizer the estimate counts state for (``"adamw"``,
            ``"sgd_momentum"``, ... or a registered row's name); None: ``"adamw"``, said
            in the notes.
        micro_batch_size: samples per rank per forward, for the activations (with the
            shape's ``activation_bytes_per_sample``).
        launcher: how the strategy's processes come into being: a launcher name the
            strategy runs under (``"subprocess"``, ``"spawn"``, ``"fork"``,
            ``"forkserver"`` for ``ddp``, or a registered one); None or ``"auto"``
            keeps the strategy's own. A preset such as ``ddp_spawn`` pins its launcher.

    Raises:
        ResolutionError: the combination cannot work; the error says why and what
            would.
        TypeError: ``machine`` is neither an `interlock.Machine` nor None (a
            programming error rather than a flag, so not a `ResolutionError`).
    """
    check_machine("plan", machine)
    if machine is None:
        machine = Machine.probe()
    specs = registered(StrategySpec)
    key: tuple[object, ...] | None = None
    if plugins is None:
        parts = (_exact(accelerator), _exact(devices), _exact(strategy), _exact(precision),
                 _exact(num_nodes), _exact(parallelism), _exact(model), _exact(optimizer),
                 _exact(micro_batch_size), _exact(launcher))
        if None not in parts:
            key = (*parts, machine, registry_version())
            hit = _MEMO.get(key)
            if hit is not None:
                return hit
    result = _chain(machine, specs, Written(
        accelerator=accelerator, devices=devices, strategy=strategy, precision=precision,
        num_nodes=num_nodes, plugins=plugins, parallelism=parallelism, model=model,
        optimizer=optimizer, micro_batch_size=micro_batch_size, launcher=launcher,
    ))
    if key is not None:
        if len(_MEMO) >= MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = result
    return result


#: refusals whose choices are values of the refused flag (names, device counts) chosen
#: without the other flags: `_choices_that_pass` narrows them to those that get past
#: that flag here
VOCABULARY_CODES = frozenset({"unknown-accelerator", "unknown-strategy",
                              "unknown-precision", "interactive-incompatible",
                              "devices-unavailable"})
#: set while `_choices_that_pass` tries the choices (their own refusals stay as they are)
_PROBING = [False]


def _choices_that_pass(error: ResolutionError, machine: Machine,
                       specs: Mapping[str, StrategySpec],
                       written: Written) -> ResolutionError:
    """``error`` offering only the names that, written in its flag's place, are not
    refused on that flag again on this machine with the other flags as given (a name
    refused on another flag stays: that refusal then says what else to change). A
    did-you-mean that would be refused too is dropped, and the reason says why."""
    def refusal(value: str) -> ResolutionError | None:
        try:
            _chain(machine, specs, written._replace(**{error.flag: _as_flag(error.flag,
                                                                           value)}))
        except ResolutionError as again:
            return again if again.flag == error.flag else None
        return None

    _PROBING[0] = True
    try:
        choices = [c for c in error.choices if refusal(c) is None]
        reason, suggestion = error.reason, error.suggestion
        closest = refusal(suggestion) if suggestion is not None else None
    finally:
        _PROBING[0] = False
    if closest is not None:
        reason += (f" The closest name, {suggestion!r}, is refused here too: "
                   f"[{closest.code}] {closest.reason.rstrip('.')}.")
        suggestion = None
    narrowed = ResolutionError(error.code, flag=error.flag, value=error.value,
                               reason=reason, choices=choices, suggestion=suggestion,
                               rule=error.rule)
    narrowed.trace = error.trace
    return narrowed


#: how many nodes `_choices_that_fit` tries, as multiples of the nodes asked for
_NODE_FACTORS = (2, 4, 8, 16, 32, 64, 128)
#: the most choices an ``insufficient-memory`` refusal offers
_MAX_FIT_CHOICES = 8


def _choices_that_fit(error: ResolutionError, machine: Machine,
                      specs: Mapping[str, StrategySpec], written: Written,
                      chosen: StrategySpec, num_nodes: int,
                      devices: int) -> ResolutionError:
    """``error`` (``insufficient-memory``) with the changes that plan and fit: another
    strategy (sharded, offloaded), a layout of the chosen one, more nodes. Each choice
    was planned with the other flags as written and says what it needs per device."""
    def fits(**change: object) -> Plan | None:
        _PROBING[0] = True
        try:
            return _chain(machine, specs, written._replace(**change))
        except ResolutionError:
            return None
        finally:
            _PROBING[0] = False

    def need(found: Plan) -> str:
        assert found.memory is not None
        text = f"{format_bytes(found.memory.device_bytes)} per device"
        return text + (", gathered units not counted" if found.memory.unknown else "")

    # another strategy: the first row of each family that fits, in table order (the
    # plainest first: fsdp before its offloading row, ZeRO-2 before ZeRO-3)
    choices: list[str] = []
    families: set[str] = set()
    for name, spec in specs.items():
        if spec.variant_of is not None or name == chosen.name or spec.family in families:
            continue
        found = fits(strategy=name, parallelism=None)
        if found is not None:
            families.add(spec.family)
            choices.append(f"strategy={name!r} ({need(found)})")
    layouts: list[str] = []
    if "dp_shard" in chosen.parallel_dims:
        layouts.append("dp_shard=auto")
    for dim in ("tp", "pp"):
        if dim in chosen.parallel_dims:
            layouts.extend(f"{dim}={n},dp_shard=auto" for n in (2, 4, 8) if n <= devices)
    for layout in layouts:
        found = fits(parallelism=layout)
        if found is not None:
            choices.append(f"parallelism={layout!r} ({need(found)})")
    for factor in _NODE_FACTORS:
        found = fits(num_nodes=num_nodes * factor)
        if found is not None:
            choices.append(f"num_nodes={num_nodes * factor} ({need(found)})")
            break
    if len(choices) > _MAX_FIT_CHOICES:
        choices = [*choices[:_MAX_FIT_CHOICES - 1], choices[-1]]
    fitting = ResolutionError(error.code, flag=error.flag, value=error.value,
                              reason=error.reason if choices else
                              error.reason + " No other strategy, layout or node count of "
                              "those tried fits: a smaller model, a smaller micro-batch or "
                              "devices with more memory would.",
                              choices=choices, rule=error.rule)
    fitting.trace = error.trace
    return fitting


def _as_flag(flag: str, choice: str) -> object:
    """A choice as the flag takes it: a device count is offered as "4", written 4."""
    if flag == "devices" and choice.removeprefix("-").isdigit():
        return int(choice)
    return choice


def _chain(machine: Machine, specs: Mapping[str, StrategySpec], written: Written) -> Plan:
    """Read the flags, then run the stages in order, each on the facts before it."""
    parts = current_parts()
    done: Run | None = None
    try:
        flags = read_flags(written, specs=specs, parts=parts,
                           broken_entry_points=broken_entry_points("strategies"))
        done = Run(seeds(flags, machine=machine, parts=parts, specs=specs),
                   trace=flags.trace)
        run_steps(STEPS, done, written)
    except ResolutionError as error:
        if done is not None:  # refused by a stage: after the trace of those before it
            error.trace = done.trace + error.trace
        if _PROBING[0]:
            raise
        if error.code in VOCABULARY_CODES:
            raise _choices_that_pass(error, machine, specs, written) from None
        if error.code == "insufficient-memory" and done is not None:
            raise _choices_that_fit(error, machine, specs, written,
                                    fact(done.facts, "spec", StrategySpec), flags.num_nodes,
                                    len(fact(done.facts, "parallel_devices", tuple))) from None
        raise
    strategy = done.result("strategy", StrategyChoice)
    layout = done.result("parallelism", ParallelismChoice)
    memory = done.results.get("memory")
    assert memory is None or isinstance(memory, MemoryChoice)
    parallel_devices = strategy.parallel_devices
    return Plan(
        accelerator=done.result("accelerator", AcceleratorChoice).name,
        strategy=strategy.spec.name,
        precision=done.result("precision", PrecisionChoice).name,
        parallel_devices=parallel_devices,
        num_nodes=flags.num_nodes,
        world_size=len(parallel_devices) * flags.num_nodes,
        launcher=strategy.launcher,
        cluster_environment=strategy.cluster_environment,
        checkpoint_io=done.result("plugins", PluginsChoice).checkpoint_io,
        notes=(*flags.notes, *done.notes),
        parallelism=layout.degrees,
        mesh=layout.mesh,
        trace=done.trace,
        spec=strategy.spec,
        plugins=flags.plugins.given(),
        strategy_instance=flags.strategy_instance,
        accelerator_instance=flags.accelerator_instance,
        machine=machine,
        memory=memory.estimate if memory is not None else None,
        model=done.result("sizing", Sizing).shape if memory is not None else None,
        optimizer=memory.optimizer if memory is not None else None,
        _tables=parts,
    )
