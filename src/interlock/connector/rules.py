"""Rules as named data, and the typed context they decide over.

A *stage* is an ordered list of *decisions*; a decision is an ordered list of
*rules*. For each decision the first rule whose predicate holds is applied and
appended to the trace; a rule either records a decision in the context (and
returns the reason in words) or raises a `ResolutionError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from interlock.connector.errors import ResolutionError
from interlock.connector.machine import Machine
from interlock.connector.registry import EntryPointStatus
from interlock.connector.specs import StrategySpec
from interlock.connector.tables import ClusterRow
from interlock.connector.trace import TraceStep


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicesRequest:
    """The devices flag, parsed but not yet matched to an accelerator.

    ``kind`` is ``"auto"``, ``"all"`` (``-1``), ``"count"`` (N devices) or
    ``"ids"`` (explicit device indices).
    """

    kind: Literal["auto", "all", "count", "ids"]
    count: int = 0
    ids: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.kind == "count":
            return f"{self.count} device{'s' if self.count != 1 else ''}"
        if self.kind == "ids":
            return "device ids " + ", ".join(map(str, self.ids))
        return self.kind


@dataclass(slots=True)
class Plugins:
    """Plugin objects sorted by kind (at most one of each)."""

    precision: object | None = None
    checkpoint_io: object | None = None
    cluster_environment: object | None = None

    def given(self) -> tuple[object, ...]:
        return tuple(
            p for p in (self.precision, self.checkpoint_io, self.cluster_environment)
            if p is not None
        )


@dataclass(slots=True)
class Context:
    """Everything the rules read and decide. Fields fill in stage by stage."""

    machine: Machine
    specs: Mapping[str, StrategySpec]
    accelerator_flag: object
    devices_flag: object
    strategy_flag: object
    precision_flag: object
    num_nodes_flag: object
    plugins_flag: object
    #: entry points that failed to load; plan() refuses the names they stand for
    broken_entry_points: tuple[EntryPointStatus, ...] = ()
    # flags stage
    accelerator_input: str = ""
    accelerator_instance: object | None = None
    strategy_instance: object | None = None
    devices: DevicesRequest = DevicesRequest(kind="auto")
    strategy_input: str = ""
    explicit_spec: StrategySpec | None = None
    precision_input: str = ""
    num_nodes: int = 1
    plugins: Plugins = field(default_factory=Plugins)
    # accelerator, devices, cluster, strategy, precision, plugins stages
    accelerator: str = ""
    accelerator_reason: str = ""
    parallel_devices: tuple[str, ...] = ()
    cluster: str = ""
    cluster_row: ClusterRow | None = None
    cluster_external: bool = False
    spec: StrategySpec | None = None
    launcher: str | None = None
    precision: str = ""
    checkpoint_io: str = ""
    notes: list[str] = field(default_factory=list)
    trace: list[TraceStep] = field(default_factory=list)
    memo: dict[str, object] = field(default_factory=dict)

    @property
    def devices_per_node(self) -> int:
        return len(self.parallel_devices)

    @property
    def world_size(self) -> int:
        return len(self.parallel_devices) * self.num_nodes

    @property
    def chosen_spec(self) -> StrategySpec:
        if self.spec is None:
            raise RuntimeError("internal error: a rule read the strategy before it was chosen")
        return self.spec

    def note(self, text: str) -> None:
        self.notes.append(text)


Predicate = Callable[[Context], bool]
Action = Callable[[Context], str]


def devices_as_placed(ctx: Context) -> str:
    """The action of a rule that leaves the placed devices as they are."""
    n = ctx.devices_per_node
    return f"{n} device{'s' if n != 1 else ''} per node as placed"


def always(ctx: Context) -> bool:
    """The predicate of a decision's final, catch-all rule."""
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """A named rule.

    Attributes:
        id: stable id, ``"<decision>/<name>"``.
        doc: what the rule does, in words (rendered into docs/rules.md).
        when: predicate over the context.
        then: applies the decision and returns the reason, or raises.
        refuses: the error code the rule raises, if it is a refusal.
    """

    id: str
    doc: str
    when: Predicate
    then: Action
    refuses: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """An ordered list of rules; the first that matches decides."""

    id: str
    doc: str
    rules: tuple[Rule, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """A named step of the resolution, made of decisions."""

    name: str
    doc: str
    decisions: tuple[Decision, ...]


def refuse(
    code: str,
    *,
    flag: str,
    value: object,
    reason: str,
    choices: Sequence[str] = (),
    suggestion: str | None = None,
) -> NoReturn:
    """Raise the refusal a rule stands for."""
    raise ResolutionError(
        code, flag=flag, value=value, reason=reason, choices=choices, suggestion=suggestion
    )


def run_decision(stage: str, decision: Decision, ctx: Context) -> None:
    """Apply the first matching rule of one decision to ``ctx``."""
    for rule in decision.rules:
        if not rule.when(ctx):
            continue
        try:
            reason = rule.then(ctx)
        except ResolutionError as error:
            error.rule = rule.id
            error.trace = tuple(ctx.trace)
            raise
        ctx.trace.append(TraceStep(stage, decision.id, rule.id, reason))
        return
    raise RuntimeError(f"internal error: no rule of {decision.id!r} matched")


def run_stages(stages: Sequence[Stage], ctx: Context) -> None:
    """Apply every decision of every stage to ``ctx`` in order."""
    for stage in stages:
        for decision in stage.decisions:
            run_decision(stage.name, decision, ctx)
