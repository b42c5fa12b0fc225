"""How a table is printed: alike strategies merged into one row, rows refused for one
reason in every column collapsed, and the notes that carry the reasons numbered."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.engine.specs import StrategySpec
from interlock.matrix.compat.data import STRATEGY_PLACEHOLDER, Grid, Outcome
from interlock.matrix.reports import Evidence


@dataclass(frozen=True, slots=True)
class Note:
    """One note under a table: a refusal's reason, or what verified a cell.

    Attributes:
        number: its number, from 1 in each table.
        code: the refusal code ("" for a verification note).
        reason: the refusal's reason; with STRATEGY_PLACEHOLDER for the strategy's name
            when several strategies share the note.
        evidence: for a verification note, the report that verified the cells.
    """

    number: int
    code: str = ""
    reason: str = ""
    evidence: Evidence | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """A grid as it is printed: the rows kept in the table (each cell with its note
    number, None for a plain declared cell), the rows refused for one reason in every
    column (collapsed into one line per reason, with the note number), and the notes."""

    shown: tuple[tuple[StrategySpec, tuple[tuple[Outcome, int | None], ...]], ...]
    collapsed: tuple[tuple[tuple[StrategySpec, ...], Outcome, int], ...]
    notes: tuple[Note, ...]


def reason_template(reason: str, strategy: str) -> str:
    """``reason`` with the quoted strategy name replaced by STRATEGY_PLACEHOLDER, so that
    refusals that differ only by the strategy's name share one note."""
    return reason.replace(f"'{strategy}'", f"'{STRATEGY_PLACEHOLDER}'")


def _note_key(spec: StrategySpec, outcome: Outcome) -> tuple[str, ...] | Evidence | None:
    if not outcome.ok:
        return ("refused", outcome.code, reason_template(outcome.reason, spec.name))
    return outcome.evidence


def layout(grid: Grid) -> Layout:
    """Collapse the rows refused for one reason everywhere and number the notes."""
    keyed = [(spec, [(c, _note_key(spec, c)) for c in cells]) for spec, cells in grid.rows]
    shown = []
    collapsed: dict[tuple[str, ...], list[StrategySpec]] = {}
    first: dict[tuple[str, ...], Outcome] = {}
    for spec, cells in keyed:
        keys = {k for _, k in cells}
        only = next(iter(keys)) if len(keys) == 1 else None
        if isinstance(only, tuple) and all(not c.ok for c, _ in cells):
            collapsed.setdefault(only, []).append(spec)
            first.setdefault(only, cells[0][0])
        else:
            shown.append((spec, cells))

    # A refusal note keeps the exact reason unless several strategies share it.
    users: dict[tuple[str, ...], set[str]] = {}
    for spec, cells in keyed:
        for _, key in cells:
            if isinstance(key, tuple):
                users.setdefault(key, set()).add(spec.name)

    numbers: dict[object, int] = {}
    notes: list[Note] = []

    def number(key: tuple[str, ...] | Evidence, outcome: Outcome) -> int:
        if key not in numbers:
            numbers[key] = len(notes) + 1
            if isinstance(key, Evidence):
                notes.append(Note(number=numbers[key], evidence=key))
            else:
                shared = len(users[key]) > 1
                notes.append(Note(number=numbers[key], code=outcome.code,
                                  reason=key[2] if shared else outcome.reason))
        return numbers[key]

    shown_rows = tuple(
        (spec, tuple((c, None if k is None else number(k, c)) for c, k in cells))
        for spec, cells in shown
    )
    collapsed_rows = tuple(
        (tuple(specs), first[key], number(key, first[key]))
        for key, specs in collapsed.items()
    )
    return Layout(shown=shown_rows, collapsed=collapsed_rows, notes=tuple(notes))
