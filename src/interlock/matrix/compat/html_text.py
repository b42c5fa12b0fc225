"""HTML primitives of the page: the style sheet, escaping, the inline syntax, cells,
notes and the tables of the main grids."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from typing import Any

from interlock.engine.specs import StrategySpec
from interlock.matrix.compat.data import HEADER_ABBREVIATIONS, Grid, Outcome
from interlock.matrix.compat.layout import Note, layout
from interlock.matrix.compat.words import evidence_text

CSS = """
body { font-family: system-ui, sans-serif; color: #222; max-width: 1000px;
       margin: 0 auto; padding: 0 12px 2em; box-sizing: border-box; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 12px; }
table.grid { table-layout: fixed; width: 100%; }
table.grid col.strategy { width: 21%; }
th, td { border: 1px solid #ccc; padding: 3px 4px; text-align: left; vertical-align: top;
         overflow-wrap: normal; word-break: normal; hyphens: none; }
th { background: #f0f0f0; font-weight: 600; }
td.verified { background: #4caf50; color: #fff; }
td.verified a { color: #fff; }
td.declared { background: #c8e6c9; }
td.refused { background: #e0e0e0; color: #555; cursor: help; }
caption { caption-side: top; text-align: left; padding: 0.3em 0; font-size: 13px; }
code { font-family: ui-monospace, monospace; white-space: nowrap; }
code.words { white-space: normal; }
code.words span { white-space: nowrap; }
td code, th code { font-size: 11px; }
sup { font-size: 9px; margin-left: 1px; }
ol.notes, ul.collapsed { font-size: 13px; }
abbr { text-decoration: none; }
"""

def escape(text: str) -> str:
    return html.escape(text, quote=True)


def inline_html(text: str) -> str:
    """The small inline syntax of the shared texts (`code`, **bold**, [text](link)) as
    escaped HTML."""
    out = escape(text)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def breakable_code(text: str, separator: str) -> str:
    """``text`` as code that may break only after ``separator`` (a hyphen in a refusal
    code, an underscore in a strategy name), never inside a word."""
    parts = re.findall(rf"[^{separator}]+{separator}?|{separator}", text)
    if len(parts) <= 1:
        return f"<code>{escape(text)}</code>"
    return ('<code class="words">' + "<wbr>".join(f"<span>{escape(p)}</span>" for p in parts)
            + "</code>")


def note_link(anchor: str, number: int) -> str:
    return f'<sup><a href="#{anchor}-{number}">{number}</a></sup>'


def html_cell(outcome: Outcome, ok_text: str, anchor: str = "", note: int | None = None
               ) -> str:
    link = note_link(anchor, note) if note is not None else ""
    if outcome.ok:
        kind = "verified" if outcome.verified else "declared"
        title = ""
        if outcome.evidence is not None:
            title = f' title="{escape(evidence_text(outcome.evidence, link=False))}"'
        return f'<td class="{kind}"{title}>{escape(ok_text)}{link}</td>'
    return (f'<td class="refused" title="{escape(outcome.reason)}">'
            f'{breakable_code(outcome.code, "-")}{link}</td>')


def _html_header(name: str) -> str:
    short = HEADER_ABBREVIATIONS.get(name)
    if short is None:
        return f"<th>{escape(name)}</th>"
    return f'<th><abbr title="{escape(name)}">{escape(short)}</abbr></th>'


def html_strategy(spec: StrategySpec) -> str:
    return f'<th title="{escape(spec.description)}">{breakable_code(spec.name, "_")}</th>'


def html_grid(grid: Grid, caption: str, ok_text: Callable[[Outcome], str]) -> list[str]:
    laid = layout(grid)
    head = "".join(_html_header(h) for h in ("strategy", *grid.columns))
    body = "\n".join(
        "<tr>" + html_strategy(spec)
        + "".join(html_cell(c, ok_text(c), grid.anchor, n) for c, n in cells) + "</tr>"
        for spec, cells in laid.shown
    )
    return [*html_table(caption, head, body),
            *html_collapsed("rows", grid.across, grid.anchor, laid.collapsed),
            *html_notes(laid.notes, grid.anchor, _html_note)]


def _html_note(note: Note) -> str:
    if note.evidence is not None:
        return inline_html(evidence_text(note.evidence))
    return f"<code>{escape(note.code)}</code>: {escape(note.reason)}"


def html_table(caption: str, head: str, body: str) -> list[str]:
    """A grid's table: its caption, a header row of ``head`` cells and the ``body``
    rows; the caption alone as a paragraph when there are no rows."""
    if not body:
        return [f"<p>{inline_html(caption)}</p>"]
    return ['<table class="grid">', f"<caption>{inline_html(caption)}</caption>",
            '<colgroup><col class="strategy"></colgroup>',
            f"<thead><tr>{head}</tr></thead>", "<tbody>", body, "</tbody>", "</table>"]


def html_collapsed(what: str, across: str, anchor: str,
                   collapsed: Sequence[tuple[Sequence[StrategySpec], Any, int]]) -> list[str]:
    """The HTML of :func:`~interlock.matrix.compat.markdown_text.md_collapsed`."""
    if not collapsed:
        return []
    every = "column" if what == "rows" else "row"
    out = [f"<p>Not shown as {what}: refused for one reason in every {every}.</p>",
           '<ul class="collapsed">']
    for specs, refused, number in collapsed:
        names = ", ".join(f"<code>{escape(s.name)}</code>" for s in specs)
        out.append(f"<li>{names} — {escape(across)}: {breakable_code(refused.code, '-')}"
                   f"{note_link(anchor, number)}</li>")
    return [*out, "</ul>"]


def html_notes(notes: Sequence[Note], anchor: str, render: Callable[[Note], str]
               ) -> list[str]:
    """A table's numbered notes, each with its anchor."""
    if not notes:
        return []
    return ["<p>Notes:</p>", '<ol class="notes">',
            *(f'<li id="{escape(anchor)}-{n.number}">{render(n)}</li>' for n in notes),
            "</ol>"]
