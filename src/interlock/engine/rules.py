"""Rules as named data, and the drafts they decide over.

A *stage* is an ordered list of *decisions*; a decision is an ordered list of
*rules*. For each decision the first rule whose predicate holds is applied and
appended to the trace; a rule either records a decision in its stage's draft (and
returns the reason in words) or raises a `ResolutionError`.

Each stage is a module of `interlock.engine.stages` with one pure function from a
frozen input to a frozen result. Inside that call the stage's rules work on a
`Draft`: the stage's inputs, which rules only read, and the fields they decide
(``OUTPUTS``); predicates never write. `audited` checks both as rules run.

A decision over rows of a registrable part kind (the accelerator 'auto' choice, the
device placement, the cluster detection) also makes one rule per registered
(third-party) row, from the registry at call time, named like the built-in rows' rules
(``cluster/<name>``) and placed before a named rule of its own; see
`Decision.rules_for`. ``docs/rules.md`` lists the rules of the built-in rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import ClassVar, Generic, Literal, NoReturn, TypeVar

from interlock.engine.errors import ResolutionError
from interlock.engine.part_tables import PartTables
from interlock.engine.trace import TraceStep


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


@dataclass(frozen=True, slots=True, kw_only=True)
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


@dataclass(slots=True, kw_only=True)
class Draft:
    """A stage's working record for one call: the stage's inputs, which its rules only
    read, and the fields its rules decide (``OUTPUTS``), which become the stage's
    frozen result. A draft lives inside one stage function call and is never shared.
    """

    #: the fields the stage's rules may write (`audited` checks every other stays put)
    OUTPUTS: ClassVar[frozenset[str]] = frozenset()

    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(slots=True, kw_only=True)
class PlacedDraft(Draft):
    """A draft that knows the devices placed on one node and the node count."""

    parallel_devices: tuple[str, ...] = ()
    num_nodes: int = 1

    @property
    def devices_per_node(self) -> int:
        return len(self.parallel_devices)

    @property
    def world_size(self) -> int:
        return len(self.parallel_devices) * self.num_nodes


D = TypeVar("D", bound=Draft)


def devices_as_placed(ctx: PlacedDraft) -> str:
    """The action of a rule that leaves the placed devices as they are."""
    n = ctx.devices_per_node
    return f"{n} device{'s' if n != 1 else ''} per node as placed"


def always(ctx: object) -> bool:
    """The predicate of a decision's final, catch-all rule."""
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule(Generic[D]):
    """A named rule over the draft of one stage.

    Attributes:
        id: stable id, ``"<decision>/<name>"``.
        doc: what the rule does, in words (rendered into docs/rules.md).
        when: predicate over the draft; reads only, never writes.
        then: records the decision in the draft's ``OUTPUTS`` fields and returns the
            reason in words, or raises.
        refuses: the error code the rule raises, if it is a refusal.
    """

    id: str
    doc: str
    when: Callable[[D], bool]
    then: Callable[[D], str]
    refuses: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision(Generic[D]):
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
    rules: tuple[Rule[D], ...]
    registered: Callable[[PartTables], tuple[Rule[D], ...]] | None = None
    registered_before: str | None = None

    def __post_init__(self) -> None:
        if self.registered is not None and not any(
            rule.id == self.registered_before for rule in self.rules
        ):
            raise RuntimeError(f"internal error: {self.id!r} places registered rows' rules "
                               f"before {self.registered_before!r}, which is not its rule")

    def rules_for(self, parts: PartTables) -> tuple[Rule[D], ...]:
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
class Stage(Generic[D]):
    """A named step of the resolution, made of decisions."""

    name: str
    doc: str
    decisions: tuple[Decision[D], ...]


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


#: set by `audited`: check every predicate and action against its draft
_AUDIT: list[bool] = [False]


@contextmanager
def audited() -> Iterator[None]:
    """Within the block, every rule is checked as it runs: a predicate that changes any
    field of its draft, or an action that changes a field outside its stage's
    ``OUTPUTS``, raises ``AssertionError`` naming the rule. Used by the tests; off, it
    costs one list lookup per decision."""
    _AUDIT[0] = True
    try:
        yield
    finally:
        _AUDIT[0] = False


def _fields(draft: Draft) -> dict[str, object]:
    """Every field of ``draft``; the notes as a tuple, so that a note added in place
    shows as a change."""
    found = {f.name: getattr(draft, f.name) for f in fields(draft)}
    found["notes"] = tuple(draft.notes)
    return found


def _check(rule: Rule[D], part: str, before: dict[str, object], draft: D,
           allowed: frozenset[str]) -> None:
    changed = [k for k, v in _fields(draft).items() if k not in allowed
               and (v != before[k] if k == "notes" else v is not before[k])]
    if changed:
        raise AssertionError(f"the {part} of rule {rule.id!r} changed {', '.join(changed)}")


def run_decision(stage: str, decision: Decision[D], draft: D, parts: PartTables,
                 trace: list[TraceStep]) -> None:
    """Apply the first matching rule of one decision to ``draft``, appending it to
    ``trace``; a refusal gets the rule's id and ``trace`` so far."""
    _run_decisions(stage, (decision,), draft, parts, trace)


def _run_decisions(stage: str, decisions: tuple[Decision[D], ...], draft: D,
                   parts: PartTables, trace: list[TraceStep]) -> None:
    """`run_decision` for each of ``decisions`` in order, in one loop: plan() runs
    about twenty decisions, and a call per decision would cost as much as a rule."""
    audit = _AUDIT[0]
    for decision in decisions:
        # most decisions have no registered rows' rules: skip the call
        if decision.registered is None:
            rules = decision.rules
        else:
            rules = parts.cache.get(decision.id) or decision.rules_for(parts)  # type: ignore[assignment]
        if audit:
            _run_audited(stage, decision, rules, draft, trace)
            continue
        for rule in rules:
            if rule.when(draft):
                try:
                    reason = rule.then(draft)
                except ResolutionError as error:
                    _refused_by(rule, error, trace)
                    raise
                trace.append(TraceStep(stage, decision.id, rule.id, reason))
                break
        else:
            raise RuntimeError(f"internal error: no rule of {decision.id!r} matched")


def _refused_by(rule: Rule[D], error: ResolutionError, trace: list[TraceStep]) -> None:
    """Mark ``error``, raised by ``rule``'s action, with the rule's id and the trace so
    far."""
    error.rule = rule.id
    error.trace = tuple(trace)


def _run_audited(stage: str, decision: Decision[D], rules: tuple[Rule[D], ...], draft: D,
                 trace: list[TraceStep]) -> None:
    """`run_decision` with every predicate and the applied action checked."""
    for rule in rules:
        before = _fields(draft)
        holds = rule.when(draft)
        _check(rule, "predicate", before, draft, frozenset())
        if not holds:
            continue
        try:
            reason = rule.then(draft)
        except ResolutionError as error:
            _refused_by(rule, error, trace)
            raise
        finally:
            _check(rule, "action", before, draft, type(draft).OUTPUTS | {"notes"})
        trace.append(TraceStep(stage, decision.id, rule.id, reason))
        return
    raise RuntimeError(f"internal error: no rule of {decision.id!r} matched")


def run_stage(stage: Stage[D], draft: D, parts: PartTables) -> tuple[TraceStep, ...]:
    """Apply every decision of ``stage`` to ``draft`` in order; returns the trace."""
    trace: list[TraceStep] = []
    _run_decisions(stage.name, stage.decisions, draft, parts, trace)
    return tuple(trace)
