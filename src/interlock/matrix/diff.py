"""Which decisions changed between two matrix locks: ``interlock matrix --diff``.

A framework that pins interlock keeps the `matrix.lock` of the version it pins; on an
upgrade, `diff_locks` says which cells (flag combinations on a machine profile) now
resolve or refuse differently, grouped by the kind of change, and, against the live
engine, which rule decides the new outcome. `run_diff` is what the command line calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from interlock.engine.errors import ResolutionError
from interlock.engine.planner import DevicesFlag, Plan, PrecisionFlag, plan
from interlock.engine.registry import registered, registry_version
from interlock.engine.specs import StrategySpec
from interlock.engine.stages import STAGES
from interlock.matrix import lock
from interlock.matrix import parallelism as par
from interlock.matrix.evaluate import show
from interlock.matrix.lock import CellKey, K
from interlock.matrix.parallelism import ParallelismKey
from interlock.matrix.profiles import profile_named
from interlock.matrix.space import BUILTIN_SPACE, FlagSpace

#: how a lock file's first line starts
LOCK_MAGIC = "# interlock matrix lock"

#: the sections of a lock: the flag matrix, and the parallelism layouts
SECTIONS: tuple[str, str] = ("cells", "parallelism")

#: at most this many cells of one transition are re-planned to find their rule
RULE_SAMPLE = 50

#: how the command line writes a lock
_WRITE_HINT = "`interlock matrix --format lock --output PATH`"

#: the decisions (trace step ids) that decide each field of a resolved outcome
_FIELD_DECISIONS: Mapping[str, tuple[str, ...]] = {
    "strategy": ("strategy/choose",),
    "launcher": ("strategy/launcher",),
    "cluster": ("cluster/detect", "strategy/launcher"),
    "world size": ("devices/place", "cluster/auto-devices", "strategy/auto-devices"),
    "precision": ("precision/source",),
}

#: the decisions that decide a parallelism cell's mesh
_MESH_DECISIONS: tuple[str, ...] = ("parallelism/request", "parallelism/degrees")

#: the fields of a resolved outcome (``ok`` and these), in order
_FIELDS: tuple[str, ...] = ("strategy", "launcher", "cluster", "world size", "precision")

#: the named fields of a key of each section, for JSON
_KEY_FIELDS: Mapping[str, tuple[str, ...]] = {
    "cells": ("profile", "accelerator", "strategy", "precision", "devices", "num_nodes"),
    "parallelism": ("profile", "layout", "strategy"),
}

AnyKey = CellKey | ParallelismKey


class LockFileError(ValueError):
    """A lock file that cannot be read: one line naming the path and what to do."""


@dataclass(frozen=True, slots=True)
class LockCells:
    """The cells of one lock: read from a file, or computed by this engine.

    Attributes:
        cells: each flag-matrix cell's outcome, keyed as `interlock.matrix.lock` keys it.
        parallelism: each parallelism cell's outcome, keyed (profile, layout, strategy).
        source: what to call it: the path, or "interlock X (this installation)".
        live: True when computed by this engine (so its rules can be looked up).
    """

    cells: Mapping[CellKey, str]
    parallelism: Mapping[ParallelismKey, str]
    source: str
    live: bool

    @property
    def size(self) -> int:
        """The number of cells, both sections."""
        return len(self.cells) + len(self.parallelism)


@dataclass(frozen=True, slots=True)
class ChangedCell:
    """One cell whose outcome changed; None for a side that lacks the cell."""

    key: AnyKey
    old: str | None
    new: str | None


@dataclass(frozen=True, slots=True)
class DiffGroup:
    """Changed cells of one section with the same transition and rule.

    Attributes:
        section: "cells" or "parallelism".
        reason: the transition in words (``resolved -> refused missing-package
            (strategy)``).
        rule: the id(s) of the rule(s) that decide the new outcome, joined with ", ",
            when the new side is live and a rule was found; for a group of which only
            some cells were re-planned, every rule they gave, the most common first.
        cells: the cells, sorted by key.
        planned: how many of them were re-planned to find the rule.
    """

    section: str
    reason: str
    rule: str | None
    cells: tuple[ChangedCell, ...]
    planned: int = 0

    @property
    def count(self) -> int:
        return len(self.cells)


@dataclass(frozen=True, slots=True)
class LockDiff:
    """The changed cells of two locks, grouped; false (empty) when nothing changed.

    Attributes:
        groups: by cell count, most first, then reason.
        total_cells: the cells of the new side, both sections.
        changed: the cells whose outcome changed, appeared or disappeared.
    """

    groups: tuple[DiffGroup, ...]
    total_cells: int
    changed: int

    @property
    def empty(self) -> bool:
        return self.changed == 0

    def __bool__(self) -> bool:
        return self.changed != 0


# reading ----------------------------------------------------------------------------


def read_lock(path: Path) -> LockCells:
    """The cells of the lock file at ``path``.

    Raises:
        LockFileError: the file is missing, a directory, unreadable, not UTF-8, not a
            matrix lock, or damaged (the message names the line).
    """
    name = str(path)
    try:
        with path.open("rb") as file:
            # the first line first: a large file of something else is not read whole
            head = file.read(_HEAD_BYTES)
            first = _first_line(head, name)
            data = head + file.read()
    except FileNotFoundError:
        raise LockFileError(f"{name}: no such lock file (write one with {_WRITE_HINT})"
                            ) from None
    except IsADirectoryError:
        raise LockFileError(f"{name} is a directory, not a matrix lock file") from None
    except OSError as error:
        raise LockFileError(f"{name} cannot be read: {error.strerror or error}") from None
    if not first.startswith(LOCK_MAGIC):
        raise LockFileError(f"{name} is not an interlock matrix lock: {_looks_like(first)}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _not_utf8(name, data, error) from None
    try:
        cells, layouts = lock.read(text)
    except lock.LockDamaged as problem:
        raise LockFileError(f"{name}: {problem}; the lock is damaged (regenerate it with "
                            f"the interlock version it pins: {_WRITE_HINT})") from None
    return LockCells(cells=cells, parallelism=layouts, source=name, live=False)


#: how much of a file is read to see whether it is a lock at all
_HEAD_BYTES = 4096


def _first_line(head: bytes, name: str) -> str:
    """The first line of a file that starts with ``head``, BOM and line end removed."""
    if not head.strip() and len(head) < _HEAD_BYTES:
        raise LockFileError(f"{name} is not an interlock matrix lock: it is empty")
    start = 3 if head.startswith(b"\xef\xbb\xbf") else 0
    line = head[start:].split(b"\n", 1)[0].rstrip(b"\r")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _not_utf8(name, head, error, start) from None


def _not_utf8(name: str, data: bytes, error: UnicodeDecodeError,
              offset: int = 0) -> LockFileError:
    at = error.start + offset
    return LockFileError(f"{name} is not an interlock matrix lock: it is not UTF-8 text "
                         f"(byte {at} is {data[at]:#04x}; binary data?)")


def _looks_like(first: str) -> str:
    said = f"its first line is {lock.clip(first)!r}"
    if first.lstrip()[:1] in ("{", "["):
        said += " (JSON, such as a conformance report)"
    return said + f"; a lock's first line starts with {LOCK_MAGIC!r}"


#: the last `current_lock`, by the registry version it was computed at
_LIVE: list[tuple[int, LockCells]] = []


def current_lock() -> LockCells:
    """The cells this installation's engine decides (what its ``matrix.lock`` pins).

    The engine is pure, so the answer is kept until a registration changes the
    registries (`registry_version`): 756,000 cells take seconds.
    """
    from interlock import __version__

    version = registry_version()
    if not _LIVE or _LIVE[0][0] != version:
        cells = LockCells(cells=lock.outcomes(), parallelism=par.outcomes(),
                          source=f"interlock {__version__} (this installation)", live=True)
        _LIVE[:] = [(registry_version(), cells)]
    return _LIVE[0][1]


# comparing --------------------------------------------------------------------------


def _describe(outcome: str) -> str:
    """An outcome in words: "resolved", or "refused CODE (FLAG)"."""
    words = outcome.split(" ")
    if words[0] == "ok":
        return "resolved"
    if len(words) == 2:
        return f"refused {words[0]} ({words[1]})"
    return outcome


def _reason(section: str, old: str | None, new: str | None) -> str:
    if old is None:
        return f"new cell: {_describe(new or '')}"
    if new is None:
        return f"cell removed: {_describe(old)}"
    before, after = old.split(" "), new.split(" ")
    if before[0] == after[0] == "ok":
        if section == "parallelism":
            return f"mesh {' '.join(before[1:])} -> {' '.join(after[1:])}"
        if len(before) == len(after) == len(_FIELDS) + 1:
            return ", ".join(_field_change(field, a, b) for field, a, b
                             in zip(_FIELDS, before[1:], after[1:], strict=True) if a != b)
        return f"{old} -> {new}"
    return f"{_describe(old)} -> {_describe(new)}"


def _field_change(field: str, old: str, new: str) -> str:
    return f"{field} changed" if field == "world size" else f"{field} {old} -> {new}"


def _changed_fields(old: str, new: str) -> tuple[str, ...]:
    before, after = old.split(" "), new.split(" ")
    if len(before) != len(after) or len(before) != len(_FIELDS) + 1:
        return _FIELDS
    return tuple(f for f, a, b in zip(_FIELDS, before[1:], after[1:], strict=True) if a != b)


def _changes(old: Mapping[K, str], new: Mapping[K, str]) -> list[ChangedCell]:
    if old == new:  # a quick answer for the common case, at C speed
        return []
    get = new.get
    found = [ChangedCell(key, outcome, get(key)) for key, outcome in old.items()
             if get(key) != outcome]
    found += [ChangedCell(key, None, outcome) for key, outcome in new.items()
              if key not in old]
    return found


def diff_locks(old: LockCells, new: LockCells) -> LockDiff:
    """The cells whose outcome changed, appeared or disappeared, grouped.

    Cells are grouped by (section, transition, rule). When ``new`` is live, each
    transition's rule is found by re-planning its cells with `plan()` on the profile's
    machine: all of them when there are at most `RULE_SAMPLE`, split into one group per
    rule; otherwise `RULE_SAMPLE` cells spread evenly over it, and its one group names
    every rule they gave. A refusal's rule is `ResolutionError.rule`; a resolved cell's
    are the trace steps of the decisions that set its changed fields (every field for a
    new cell; for a refusal that now resolves, the decisions that check the flag it
    named). Lock against lock has no rules.
    """
    groups = [*_section(SECTIONS[0], _changes(old.cells, new.cells), new.live),
              *_section(SECTIONS[1], _changes(old.parallelism, new.parallelism), new.live)]
    groups.sort(key=lambda g: (-g.count, g.reason, g.section, g.rule or ""))
    return LockDiff(groups=tuple(groups), total_cells=new.size,
                    changed=sum(g.count for g in groups))


def _section(section: str, changes: list[ChangedCell], live: bool) -> list[DiffGroup]:
    transitions: dict[str, list[ChangedCell]] = {}
    reasons: dict[tuple[str | None, str | None], str] = {}
    for cell in changes:
        pair = (cell.old, cell.new)
        reason = reasons.get(pair)
        if reason is None:
            reason = reasons[pair] = _reason(section, cell.old, cell.new)
        transitions.setdefault(reason, []).append(cell)
    groups: list[DiffGroup] = []
    for reason, cells in transitions.items():
        cells.sort(key=lambda c: c.key)
        groups += _grouped(section, reason, cells, live)
    return groups


def _grouped(section: str, reason: str, cells: list[ChangedCell],
             live: bool) -> list[DiffGroup]:
    if not live or all(c.new is None for c in cells):
        return [DiffGroup(section, reason, None, tuple(cells))]
    if len(cells) > RULE_SAMPLE:
        sample = [cells[i * len(cells) // RULE_SAMPLE] for i in range(RULE_SAMPLE)]
        found: dict[str, int] = {}
        for cell in sample:
            for rule in (_rule(section, cell) or "").split(", "):
                found[rule] = found.get(rule, 0) + 1
        found.pop("", None)
        # the most common first; a stable sort keeps the trace's order among equals
        joined = ", ".join(sorted(found, key=lambda r: -found[r])) or None
        return [DiffGroup(section, reason, joined, tuple(cells), planned=RULE_SAMPLE)]
    by_rule: dict[str | None, list[ChangedCell]] = {}
    for cell in cells:
        by_rule.setdefault(_rule(section, cell), []).append(cell)
    return [DiffGroup(section, reason, rule, tuple(some), planned=len(some))
            for rule, some in by_rule.items()]


# rules ------------------------------------------------------------------------------


def _flag_value(values: Iterable[object], shown: str) -> tuple[bool, object]:
    """Whether a flag value of ``values`` is written ``shown``, and which."""
    for value in values:
        if show(value) == shown:
            return True, value
    return False, None


def _rule(section: str, cell: ChangedCell) -> str | None:
    """The rule(s) deciding a cell's new outcome, by re-planning it; None when the cell
    cannot be re-planned here (a profile, layout or flag value this version lacks)."""
    if cell.new is None:
        return None
    resolved = cell.new.startswith("ok ")
    try:
        result = (_replan_layout(cast(ParallelismKey, cell.key)) if section == "parallelism"
                  else _replan(cast(CellKey, cell.key), BUILTIN_SPACE))
    except ResolutionError as error:
        return None if resolved else error.rule
    except (ValueError, LookupError):  # a profile this version does not have
        return None
    if result is None or not resolved:
        return None  # not this engine's outcome: nothing to ask it about
    if section == "parallelism" and (cell.old is None or cell.old.startswith("ok ")):
        decisions = _MESH_DECISIONS
    elif cell.old is not None and cell.old.startswith("ok "):
        decisions = tuple(d for f in _changed_fields(cell.old, cell.new)
                          for d in _FIELD_DECISIONS[f])
    elif cell.old is not None:
        decisions = _refusing(cell.old.split(" ")[0])
    else:
        decisions = tuple(d for f in _FIELDS for d in _FIELD_DECISIONS[f])
    rules = dict.fromkeys(s.rule for s in result.trace if s.decision in decisions)
    return ", ".join(rules) or None


def _refusing(code: str) -> tuple[str, ...]:
    """The decisions with a rule that refuses with ``code``: for a cell that was refused
    with it and now resolves, their rules are the ones that now let it through. Read
    from the rules themselves (`Rule.refuses`), so a new flag or code needs no table."""
    return tuple(decision.id for stage in STAGES for decision in stage.decisions
                 if any(rule.refuses == code for rule in decision.rules))


def _replan(key: CellKey, space: FlagSpace) -> Plan | None:
    """`plan()` of a flag-matrix cell, its shown values mapped back to the flag values
    of ``space``; None when a value is not in it."""
    profile, accelerator, strategy, precision, devices, nodes = key
    known_devices, devices_flag = _flag_value(space.devices, devices)
    known_precision, precision_flag = _flag_value(space.precisions, precision)
    if (not known_devices or not known_precision or accelerator not in space.accelerators
            or nodes not in space.num_nodes
            or (strategy != "auto" and strategy not in registered(StrategySpec))):
        return None
    return plan(accelerator=accelerator, devices=cast(DevicesFlag, devices_flag),
                strategy=strategy, precision=cast(PrecisionFlag, precision_flag),
                num_nodes=nodes, machine=profile_named(profile).machine)


def _replan_layout(key: ParallelismKey) -> Plan | None:
    """`plan()` of a parallelism cell; None for a profile or layout this version lacks."""
    profile, layout_key, strategy = key
    setting = next((s for s in par.SETTINGS if s.profile == profile), None)
    layout = next((lay for lay in par.LAYOUTS if lay.key == layout_key), None)
    if setting is None or layout is None or strategy not in registered(StrategySpec):
        return None
    return plan(strategy=strategy, devices=setting.devices, num_nodes=setting.num_nodes,
                precision=par.PRECISION, machine=setting.machine_profile.machine,
                parallelism=None if layout.flag is None else dict(layout.flag))


# showing ----------------------------------------------------------------------------


def render_text(diff: LockDiff, old: LockCells, new: LockCells, limit: int = 5) -> str:
    """The diff for a person: a header, a count, then each group with its rule and up to
    ``limit`` example cells."""
    lines = [f"matrix diff: {old.source} -> {new.source}"]
    if diff.empty:
        lines.append(f"no cell changed ({diff.total_cells} cells)")
        return "\n".join(lines)
    lines.append(f"{diff.changed} of {diff.total_cells} cells changed, in "
                 f"{lock.plural(len(diff.groups), 'group')}")
    for group in diff.groups:
        where = "" if group.section == "cells" else "parallelism: "
        lines.append(f"[{lock.plural(group.count, 'cell')}] {where}{group.reason}")
        if group.rule is not None:
            sampled = (f" (from {group.planned} of {group.count} cells)"
                       if group.planned < group.count else "")
            lines.append(f"  rule: {group.rule}{sampled}")
        lines += [f"  {lock.cell_line(c.key, c.old, c.new)}" for c in group.cells[:limit]]
        if group.count > limit:
            lines.append(f"  ... and {group.count - limit} more")
    return "\n".join(lines)


def to_json(diff: LockDiff, old: LockCells, new: LockCells) -> dict[str, object]:
    """Everything in the diff, every cell with its key's named fields, for JSON."""

    def side(cells: LockCells) -> dict[str, object]:
        return {"source": cells.source, "live": cells.live, "cells": len(cells.cells),
                "parallelism_cells": len(cells.parallelism)}

    return {
        "old": side(old),
        "new": side(new),
        "total_cells": diff.total_cells,
        "changed": diff.changed,
        "groups": [
            {"section": g.section, "reason": g.reason, "rule": g.rule, "count": g.count,
             "planned": g.planned,
             "cells": [{"key": dict(zip(_KEY_FIELDS[g.section], c.key, strict=True)),
                        "old": c.old, "new": c.new} for c in g.cells]}
            for g in diff.groups
        ],
    }


def run_diff(old_path: str, new_path: str | None, fmt: str = "text") -> tuple[int, str]:
    """``interlock matrix --diff OLD [NEW] --format FMT``: the exit code (0 when nothing
    changed, 1 when something did) and the text to print. NEW defaults to this
    installation's engine.

    Raises:
        LockFileError: a lock cannot be read, or ``fmt`` is neither "text" nor "json".
    """
    if fmt not in ("text", "json"):
        raise LockFileError(f"unknown diff format {fmt!r}; choices: text, json")
    old = read_lock(Path(old_path))
    new = read_lock(Path(new_path)) if new_path is not None else current_lock()
    diff = diff_locks(old, new)
    text = (render_text(diff, old, new) if fmt == "text"
            else json.dumps(to_json(diff, old, new), indent=2))
    return (1 if diff else 0), text


__all__ = [
    "RULE_SAMPLE",
    "ChangedCell",
    "DiffGroup",
    "LockCells",
    "LockDiff",
    "LockFileError",
    "current_lock",
    "diff_locks",
    "read_lock",
    "render_text",
    "run_diff",
    "to_json",
]
