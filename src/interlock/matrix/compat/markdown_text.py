"""Markdown primitives of the page: escaping, wrapping prose, tables, cells and notes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from interlock.engine.specs import StrategySpec
from interlock.matrix.compat.data import HEADER_ABBREVIATIONS, PROSE_WIDTH, Grid, Outcome
from interlock.matrix.compat.layout import Note, layout
from interlock.matrix.compat.words import evidence_text

_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def superscript(number: int) -> str:
    return str(number).translate(_SUPERSCRIPT)


def _md(text: str) -> str:
    # A raw "|" would split a GitHub table cell; the entity renders as the character.
    return text.replace("|", "&#124;").replace("\n", " ")


def md_text(text: str) -> str:
    """Engine text (a reason) made safe to print as Markdown prose."""
    return _md(text.replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;"))


# A line that starts with one of these would open a list, heading, quote or table.
_BLOCK_START = re.compile(r"^(?:[-+*>#|=]|\d+[.)])")


def wrap(text: str, width: int = PROSE_WIDTH, first: str = "", rest: str = "") -> list[str]:
    """Greedy word wrap for Markdown prose; never starts a continuation line with
    something Markdown would read as a new block."""
    lines: list[str] = []
    current = first
    fresh = True
    for word in text.split():
        if not fresh and len(current) + 1 + len(word) > width and not _BLOCK_START.match(word):
            lines.append(current)
            current, fresh = rest + word, False
        else:
            current = (current + word) if fresh else f"{current} {word}"
            fresh = False
    lines.append(current)
    return lines


def md_cell(outcome: Outcome, note: int | None, ok_text: str) -> str:
    # Plain text, not `code`: table lines cannot wrap, and every character counts.
    if not outcome.ok:
        return f"{outcome.code}{superscript(note or 0)}"
    if note is None:
        return ok_text
    return f"{ok_text}{superscript(note)}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table, columns padded by character count (the same
    on every machine, whatever width libraries are installed)."""
    body = [list(r) for r in rows]
    widths = [max(len(c) for c in column) for column in zip(headers, *body, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in body)])


def md_note(note: Note) -> str:
    if note.evidence is not None:
        return evidence_text(note.evidence)
    return f"`{note.code}`: {md_text(note.reason)}"


def md_grid(grid: Grid, ok_text: Callable[[Outcome], str]) -> list[str]:
    """The table, the collapsed rows and the notes of one grid, as Markdown lines."""
    laid = layout(grid)
    out: list[str] = []
    if laid.shown:
        out.append(md_table(
            ("strategy", *(HEADER_ABBREVIATIONS.get(c, c) for c in grid.columns)),
            ((spec.name, *(md_cell(c, n, ok_text(c)) for c, n in cells))
             for spec, cells in laid.shown),
        ))
        out.append("")
    out += md_collapsed("rows", grid.across, laid.collapsed)
    out += md_notes(laid.notes, md_note)
    return out


def md_collapsed(what: str, across: str,
                 collapsed: Sequence[tuple[Sequence[StrategySpec], Any, int]]) -> list[str]:
    """The strategies not shown as ``what`` ("rows" or "columns"): one line per reason
    (an outcome or answer with a ``code``) and its note number."""
    if not collapsed:
        return []
    every = "column" if what == "rows" else "row"
    out = [f"Not shown as {what}: refused for one reason in every {every}.", ""]
    for specs, refused, number in collapsed:
        names = ", ".join(f"`{s.name}`" for s in specs)
        out += wrap(f"{names} — {across}: `{refused.code}`{superscript(number)}",
                    first="- ", rest="  ")
    return [*out, ""]


def md_notes(notes: Sequence[Any], render: Callable[[Any], str]) -> list[str]:
    """A table's numbered notes, each wrapped under its number."""
    if not notes:
        return []
    out = ["Notes:", ""]
    for note in notes:
        first = f"{note.number}. "
        out += wrap(render(note), first=first, rest=" " * len(first))
    return [*out, ""]


def md_ok(outcome: Outcome) -> str:
    return "✓ verified" if outcome.verified else "✓ declared"


def md_env_ok(outcome: Outcome) -> str:
    text = f"✓ {outcome.launcher or 'in-process'}"
    return f"{text}, verified" if outcome.verified else text
