"""One runner for the stages: `plan()` runs it once per call, the matrix once per cell.

Each stage module declares a `Step`: its function, its frozen input (whose field names
are the *facts* it reads: the flags as parsed, and what earlier stages decided), and
the facts it writes (which fields of its result, under which names). The runner keeps
the facts of one resolution in a dict, runs the steps in order, and adds what each step
writes.

`SEEDS` names what the caller gives, each step's ``writes`` what it adds; a step that
reads a fact that is neither a seed nor written by a step before it fails at import
(`check_steps`), not at plan time.

With a memo (the matrix), a step runs once per distinct value of what it reads, and
its writes (or its refusal) are reused: that is what makes 756,000 cells take seconds.
The values a memoised step reads must be hashable; `CONSTANTS` (the machine, the
registry snapshot, the strategy rows) are fixed per run and left out of the keys.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, TypeVar

from interlock.engine.errors import ResolutionError
from interlock.engine.trace import TraceStep
from interlock.engine.written import NOT_WRITTEN, Written

T = TypeVar("T")


#: What one resolution knows, by name: the seeds, then what each step writes. A fact's
#: name is given once, by the seed (`SEEDS`) or the step (`Step.writes`) that gives
#: it; its type, once, by the field it comes from (of `Flags`, or of the stage's
#: result). Read one, typed, with `fact`.
Facts = dict[str, object]


#: facts fixed for a whole run: never part of a memo key
CONSTANTS = frozenset({"machine", "parts", "specs"})

#: the flags the flags stage parses; it hands each on as typed facts (`flags.seeds`)
PARSED_FLAGS = frozenset({"accelerator", "devices", "strategy", "precision", "num_nodes",
                          "plugins"})


#: (index in `Written`, fact name) of each flag the flags stage does not parse
_UNPARSED = tuple((index, f"{name}_flag") for index, name in enumerate(Written._fields)
                  if name not in PARSED_FLAGS)


def written_seeds(written: Written, facts: Facts | None = None) -> Facts:
    """Every other flag, as written, under ``<flag>_flag`` (the stage that decides it
    parses it), added to ``facts`` (a new dict for None), which is returned."""
    facts = {} if facts is None else facts
    for index, fact in _UNPARSED:  # a loop: plan() pays this before any stage can refuse
        facts[fact] = written[index]
    return facts


#: the facts a caller gives: the constants, the parsed flags, the flags as written
SEEDS = frozenset({
    *CONSTANTS, *written_seeds(NOT_WRITTEN),
    "accelerator_flag", "devices", "strategy_flag", "precision_flag", "num_nodes",
    "strategy_instance", "cluster_plugin", "precision_plugin", "checkpoint_io_plugin",
})

#: a memo: one table per step, from the values it read to what it wrote or refused
Memo = dict[str, dict[tuple[object, ...], Mapping[str, object] | ResolutionError]]


@dataclass(frozen=True, slots=True)
class Step:
    """One stage as the runner sees it.

    Attributes:
        name: the stage's name.
        run: the stage's function: takes its ``inputs`` (and then the flags as
            written, to quote them, when it has a ``written`` parameter) and returns
            its result.
        inputs: the stage's frozen input, a NamedTuple whose field names are the facts
            it reads: the declaration of what the stage decides from.
        writes: result field -> fact name, for each field that later steps (or the
            matrix) read; the plan reads the whole result, and ``notes`` and
            ``trace`` are collected apart.
        when: a fact that must not be None for the step to run (memory: ``shape``).
    """

    name: str
    run: Callable[..., Any]
    inputs: Callable[..., tuple[object, ...]]
    writes: Mapping[str, str]
    when: str | None = None
    reads: tuple[str, ...] = field(init=False)
    quotes: bool = field(init=False)
    _key: Callable[[Mapping[str, object]], tuple[object, ...]] = field(init=False)
    _args: Callable[[Mapping[str, object]], tuple[object, ...]] = field(init=False)
    _pairs: tuple[tuple[str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        reads: tuple[str, ...] = getattr(self.inputs, "_fields", ())
        if not reads:
            raise RuntimeError(f"internal error: step {self.name!r} declares its input as "
                               f"{self.inputs!r}, not a NamedTuple of the facts it reads")
        set_ = object.__setattr__
        set_(self, "reads", reads)
        set_(self, "quotes", "written" in inspect.signature(self.run).parameters)
        set_(self, "_args", _getter(reads))
        set_(self, "_key", _getter(tuple(r for r in reads if r not in CONSTANTS)))
        set_(self, "_pairs", tuple(self.writes.items()))

    def call(self, facts: Mapping[str, object], written: Written) -> Any:
        """The stage's result on ``facts``."""
        inputs = self.inputs(*self._args(facts))
        return self.run(inputs, written) if self.quotes else self.run(inputs)

    def written_by(self, result: object) -> dict[str, object]:
        """The facts ``result`` gives, by name."""
        return {fact: getattr(result, name) for name, fact in self._pairs}


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, object]], tuple[object, ...]]:
    """A fast function from the facts to the values of ``names``, as a tuple."""
    if len(names) > 1:
        return itemgetter(*names)
    if names:
        name = names[0]
        return lambda facts: (facts[name],)
    return lambda facts: ()


def check_steps(steps: Sequence[Step]) -> tuple[Step, ...]:
    """``steps``, checked once: every fact a step reads is a seed or written before it."""
    known = set(SEEDS)
    for step in steps:
        missing = [r for r in (*step.reads, *([step.when] if step.when else []))
                   if r not in known]
        if missing:
            raise RuntimeError(f"internal error: step {step.name!r} reads {missing}, which "
                               "no seed or earlier step gives")
        known.update(step.writes.values())
    return tuple(steps)


def fact(facts: Facts, name: str, kind: type[T]) -> T:
    """The fact ``name``, checked to be a ``kind``."""
    value = facts[name]
    if not isinstance(value, kind):
        raise RuntimeError(f"internal error: fact {name!r} is {value!r}, not a "
                           f"{kind.__name__}")
    return value


@dataclass(slots=True)
class Run:
    """One run of the steps: the facts, each stage's result by its name, and the
    stages' notes and trace in order (after what the caller put there first)."""

    facts: Facts
    results: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    trace: tuple[TraceStep, ...] = ()

    def result(self, stage: str, kind: type[T]) -> T:
        """The result of ``stage``, checked to be a ``kind``."""
        return fact(self.results, stage, kind)


def run_steps(steps: Sequence[Step], done: Run, written: Written = NOT_WRITTEN) -> Run:
    """Run every step on ``done.facts`` (updated in place), adding each result, its
    notes and its trace to ``done``; returns ``done``.

    Raises:
        ResolutionError: a stage's refusal. ``done.trace`` then holds the trace of
            the steps before it, for the caller to put before the refusal's own
            (`plan()` does where it handles the refusal).
    """
    facts, results, notes, trace = done.facts, done.results, done.notes, done.trace
    try:
        for step in steps:
            if step.when is not None and facts[step.when] is None:
                continue
            inputs = step.inputs(*step._args(facts))  # `Step.call`, inline: plan() runs this
            result = step.run(inputs, written) if step.quotes else step.run(inputs)
            for field_name, name in step._pairs:
                facts[name] = getattr(result, field_name)
            results[step.name] = result
            if result.notes:
                notes += result.notes
            trace += result.trace
    finally:
        done.trace = trace
    return done


def run_memoised(steps: Sequence[Step], facts: Facts,
                 memo: Memo) -> ResolutionError | None:
    """Run every step on ``facts`` (updated in place), each at most once per distinct
    value of what it reads across calls that share ``memo``; notes and trace are not
    kept. Returns the first refusal (shared between calls: never change it), or None."""
    for step in steps:
        if step.when is not None and facts[step.when] is None:
            continue
        table = memo.get(step.name)
        if table is None:
            table = memo[step.name] = {}
        key = step._key(facts)
        found = table.get(key)
        if found is None:
            try:
                found = step.written_by(step.call(facts, NOT_WRITTEN))
            except ResolutionError as error:
                found = error
            table[key] = found
        if isinstance(found, ResolutionError):
            return found
        facts.update(found)
    return None
