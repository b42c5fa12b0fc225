"""Rules as named data, and the typed context they decide over.

A *stage* is an ordered list of *decisions*; a decision is an ordered list of
*rules*. For each decision the first rule whose predicate holds is applied and
appended to the trace; a rule either records a decision in the context (and
returns the reason in words) or raises a `ResolutionError`.

A decision over rows of a registrable part kind (the accelerator 'auto' choice, the
device placement, the cluster detection) also makes one rule per registered
(third-party) row, from the registry at call time, named like the built-in rows' rules
(``cluster/<name>``) and placed before a named rule of its own; see
`Decision.rules_for`. ``docs/rules.md`` lists the rules of the built-in rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from interlock.connector.errors import ResolutionError
from interlock.connector.machine import Machine
from interlock.connector.parts_registry import PartTables, current_parts
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
    #: every part kind's rows (built-in and registered), read at call time
    parts: PartTables = field(default_factory=current_parts)
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
    """An ordered list of rules; the first that matches decides.

    Attributes:
        id: stable id.
        doc: what it decides, in words.
        rules: the rules of the built-in rows, in order (what ``docs/rules.md`` lists).
        registered: makes the rules of the registered (third-party) rows from a
            registry snapshot, or None when the decision has none.
        registered_before: the id of the rule those rules are placed before.
    """

    id: str
    doc: str
    rules: tuple[Rule, ...]
    registered: Callable[[PartTables], tuple[Rule, ...]] | None = None
    registered_before: str | None = None

    def __post_init__(self) -> None:
        if self.registered is not None and not any(
            rule.id == self.registered_before for rule in self.rules
        ):
            raise RuntimeError(f"internal error: {self.id!r} places registered rows' rules "
                               f"before {self.registered_before!r}, which is not its rule")

    def rules_for(self, parts: PartTables) -> tuple[Rule, ...]:
        """The rules in force with ``parts``: the built-in ones, with the registered
        rows' rules in place (made once per registry snapshot)."""
        if self.registered is None:
            return self.rules
        cached = parts.cache.get(self.id)
        if cached is None:
            extra = self.registered(parts)
            if extra:
                at = next(i for i, r in enumerate(self.rules) if r.id == self.registered_before)
                cached = (*self.rules[:at], *extra, *self.rules[at:])
            else:
                cached = self.rules
            parts.cache[self.id] = cached
        return cached  # type: ignore[return-value]


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
    # most decisions have no registered rows' rules: skip the call (plan() runs this
    # for every decision, and a method call costs as much as a rule)
    if decision.registered is None:
        rules = decision.rules
    else:
        rules = ctx.parts.cache.get(decision.id) or decision.rules_for(ctx.parts)  # type: ignore[assignment]
    for rule in rules:
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
