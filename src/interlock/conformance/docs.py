"""Write the table of checks in ``docs/conformance.md`` from the check table.

``python -m interlock.conformance.docs [ROOT]`` replaces what lies between the two
marker comments of ``ROOT/docs/conformance.md`` (ROOT: the current directory by
default) and leaves the rest of the page, which is written by hand, as it is. A test
fails when the committed page differs from what this writes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from interlock.conformance.table import CHECKS, Check, InDriver, InPytest, WorldSizes
from interlock.engine.tables import PRECISIONS
from interlock.output_files import write_text

CONFORMANCE_PATH = Path("docs") / "conformance.md"
BEGIN = ("<!-- The table of checks is generated from interlock/conformance/table.py by "
         "`python -m interlock.conformance.docs`. Do not edit it by hand: a test fails "
         "when it differs from the table. -->")
END = "<!-- End of the generated table of checks. -->"

#: how each place a check runs in reads in the table
_RANK_WHEN = {"each precision": "every rank, each precision", "once": "every rank, once",
              "last": "every rank, after every other check"}


def _runs(check: Check) -> str:
    if isinstance(check.runs, InPytest):
        return "the pytest process, nothing launched"
    if isinstance(check.runs, InDriver):
        return "the launching process"
    where = _RANK_WHEN[check.runs.when]
    if check.runs.then_in_driver is not None:
        where += ", then the launching process"
    return where


def _world_sizes(sizes: WorldSizes) -> str:
    if sizes.most is None:
        return f"{sizes.least} or more ranks"
    if sizes.most == sizes.least:
        return f"world size {sizes.least}"
    return f"world sizes {sizes.least} to {sizes.most}"


def _applies(check: Check) -> str:
    conditions = []
    if check.capability is not None:
        conditions.append(f"the strategy declares `{check.capability}`")
    if check.loss_scaler:
        scaled = ", ".join(f"`{p.name}`" for p in PRECISIONS if p.scaler)
        conditions.append(f"a precision with a loss scaler ({scaled})")
    if check.world_sizes is not None:
        conditions.append(_world_sizes(check.world_sizes))
    return "; ".join(conditions) or "always"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_checks_table() -> str:
    """The Markdown table of every check, in report order, markers excluded."""
    lines = ["| check | runs in | applies when | guarantees | why |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{c.id}` | {_cell(_runs(c))} | {_cell(_applies(c))} | "
              f"{_cell(c.guarantees)} | {_cell(c.why)} |" for c in CHECKS]
    return "\n".join(lines)


def with_checks_table(page: str) -> str:
    """``page`` with the text between its markers replaced by the current table.

    Raises:
        ValueError: the page lacks the markers, or has them more than once or out of
            order.
    """
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"the page needs the line {BEGIN!r}, then the line {END!r}, once "
                         "each, around the table of checks")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n\n{render_checks_table()}\n\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the table of checks in docs/conformance.md under the given root.

    Returns 0 when the page is written or already current, 2 when the page cannot be
    read, has no markers or cannot be written (one line on stderr; the page is left
    as it was).
    """
    from interlock.engine.docs import checkout_root

    path = checkout_root(None if argv is None else list(argv),
                         "python -m interlock.conformance.docs",
                         "the table of checks in docs/conformance.md") / CONFORMANCE_PATH
    try:
        page = path.read_text(encoding="utf-8")
        updated = with_checks_table(page)
    except (OSError, ValueError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 2
    if updated == page:
        print(f"{path} is up to date")
        return 0
    try:
        write_text(path, updated)
    except OSError as error:
        print(f"{path}: cannot write it: {error}", file=sys.stderr)
        return 2
    print(f"wrote the table of checks in {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
