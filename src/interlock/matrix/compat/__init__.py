"""Render ``docs/compatibility.md`` and ``docs/compatibility.html`` from the engine.

Every cell is the answer `plan()` gives on a named machine profile; nothing here states
a compatibility fact of its own. A cell that resolves is "declared" (the strategy's row
says it works and the engine agrees) or "verified" (a conformance report records a run
that exercised it; see :func:`interlock.matrix.reports.read_report` for the exact rule).

The files must be byte-for-byte stable across machines (a test compares them with the
code), so they hold no date of their own, no runtime torch version and nothing probed
from the machine that renders them: the only dates are those written in the committed
conformance reports.

Run ``python -m interlock.matrix.compat [ROOT]`` to rewrite both files under ROOT/docs.

The page is built in layers, each a module: `data` (the cells), `layout` (how a
table is printed), `words` (the prose both formats share), `markdown_text` and
`html_text` (each format's primitives), `fits_section` and `parallelism_section`,
and `pages` (both pages, and the command).
"""

from __future__ import annotations

from interlock.matrix.compat.data import (
    DOCS_DIR,
    ENVIRONMENTS,
    HTML_PATH,
    MARKDOWN_PATH,
    MAX_MARKDOWN_LINE,
    PROSE_WIDTH,
    Compatibility,
    Outcome,
    builtin_specs,
    compute,
    environment_devices,
)
from interlock.matrix.compat.layout import Note, reason_template
from interlock.matrix.compat.markdown_text import wrap
from interlock.matrix.compat.pages import main, render_html, render_markdown
from interlock.matrix.compat.parallelism_section import name_template

__all__ = [
    "DOCS_DIR",
    "ENVIRONMENTS",
    "HTML_PATH",
    "MARKDOWN_PATH",
    "MAX_MARKDOWN_LINE",
    "PROSE_WIDTH",
    "Compatibility",
    "Note",
    "Outcome",
    "builtin_specs",
    "compute",
    "environment_devices",
    "main",
    "name_template",
    "reason_template",
    "render_html",
    "render_markdown",
    "wrap",
]
