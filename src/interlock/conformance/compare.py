"""Compare two conformance reports: what each one verifies, and what changed between them.

``interlock conformance --compare OLD NEW`` prints :func:`render` of :func:`compare` and
exits with :attr:`Comparison.exit_code` (2 on a :class:`ReportFileError`). Which cells a
report verifies is :func:`interlock.matrix.reports.read_report`'s rule, not one of this
module's. It imports neither torch nor pytest: it runs where only interlock is installed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import interlock
from interlock.conformance.report import REPORT_SCHEMA, Record
from interlock.matrix.lock import clip, plural
from interlock.matrix.reports import Key, read_report

#: every status a record may have, in the scorecard's order
STATUSES = ("passed", "failed", "skipped", "xfailed", "not run")
#: statuses a check fails with; reaching one from any other is a regression
BROKEN = frozenset({"failed", "not run"})
#: (strategy, runner, world_size, precision, check): one record of a report
RecordKey = tuple[str, str, str, str, str]
#: (strategy, runner)
Pair = tuple[str, str]

_RECORD_FIELDS = ("strategy", "runner", "world_size", "precision", "check", "status")
_LOCK_HEADER = "# interlock matrix lock"


class ReportFileError(ValueError):
    """A file that cannot be read as a conformance report (one line naming it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scorecard:
    """One (strategy, runner) of a report.

    Attributes:
        passed, failed, skipped, xfailed, not_run: its records, by status.
        declared: the precisions it declares (each one a cell).
        verified: the precisions the report verifies (compat's rule).
        declared_from: ``"report"`` (its ``declared`` list) or ``"records"`` (a legacy
            report declares nothing: the precisions its records mention stand in).
    """

    strategy: str
    runner: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    not_run: int = 0
    declared: frozenset[str] = frozenset()
    verified: frozenset[str] = frozenset()
    declared_from: str = "report"

    @property
    def unverified(self) -> frozenset[str]:
        """Declared cells the report does not verify, exercised or not."""
        return self.declared - self.verified

    @property
    def cells(self) -> str:
        """Verified of declared cells: ``"3/4"``."""
        return f"{len(self.verified)}/{len(self.declared)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportSummary:
    """What :func:`load` read from one report.

    Attributes:
        path: the file, as given.
        schema: its report schema (0: a legacy report, without the field).
        interlock: the interlock version that wrote it ("" when it does not say).
        date: its "YYYY-MM-DD" date ("" when it has none).
        checks: the suite's check ids when it was written (empty for a legacy report).
        records: every record, by key.
        verified: the (strategy, runner, precision) cells it verifies.
        scorecards: one per (strategy, runner) it has records or declarations for.
    """

    path: str
    schema: int
    interlock: str
    date: str
    checks: tuple[str, ...]
    records: Mapping[RecordKey, Record]
    verified: frozenset[Key]
    scorecards: Mapping[Pair, Scorecard]

    @property
    def legacy(self) -> bool:
        """Whether it was written before reports carried a schema."""
        return self.schema == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One record that differs between the reports.

    Attributes:
        old, new: its status in each report; None where it is absent.
        message: the first line of the new record's message (a failure or skip reason).
    """

    key: RecordKey
    old: str | None
    new: str | None
    message: str = ""

    def line(self) -> str:
        """``ddp cpu w2 32-true clipping: passed -> failed: why``."""
        text = f"{record_label(self.key)}: {self.old or 'absent'} -> {self.new or 'absent'}"
        return f"{text}: {self.message}" if self.message else text


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """What changed from ``old`` to ``new``.

    Attributes:
        regressions: failed or not run in new, where old passed, xfailed, skipped or
            lacked the record.
        newly_passing: passed in new, where old did not pass (or lacked the record).
        newly_skipped: skipped in new, where old passed or failed.
        removed: in old, not in new.
        other_changes: any other change of status (passed -> xfailed, absent ->
            skipped, ...): nothing is left unsaid.
        no_longer_verified: cells old verifies and new does not.
        newly_verified: cells new verifies and old does not.
    """

    old: ReportSummary
    new: ReportSummary
    regressions: tuple[Change, ...]
    newly_passing: tuple[Change, ...]
    newly_skipped: tuple[Change, ...]
    removed: tuple[Change, ...]
    other_changes: tuple[Change, ...]
    no_longer_verified: tuple[Key, ...]
    newly_verified: tuple[Key, ...]

    @property
    def exit_code(self) -> int:
        """1 on a regression or a cell no longer verified, else 0."""
        return 1 if self.regressions or self.no_longer_verified else 0

    @property
    def verdict(self) -> str:
        """``"no regression"`` or ``"2 regressions, 1 cell no longer verified"``."""
        parts = []
        if self.regressions:
            parts.append(plural(len(self.regressions), "regression"))
        if self.no_longer_verified:
            parts.append(plural(len(self.no_longer_verified), "cell") + " no longer verified")
        return ", ".join(parts) or "no regression"


def record_label(key: RecordKey) -> str:
    """``strategy runner w2 precision check``."""
    strategy, runner, world_size, precision, check = key
    return f"{strategy} {runner} w{world_size or '?'} {precision} {check}"


# --------------------------------------------------------------------------- reading


def load(path: str | Path) -> ReportSummary:
    """Read one report written by ``interlock conformance --report``.

    Raises:
        ReportFileError: the file is missing, not JSON, not a conformance report, of a
            schema this interlock does not read, or has a damaged record.
    """
    where = Path(path)
    data = _read_json(where)
    items, schema = _layout(where, data)
    records = _records(where, items, schema)
    meta: Mapping[str, Any] = data if isinstance(data, dict) else {}
    if schema == 0:
        declared = _mentioned(records.values())
    else:
        declared = _declarations(where, meta.get("declared"))
    try:
        verified = frozenset(read_report(where).verified)
    except (OSError, ValueError) as error:
        raise ReportFileError(_one_line(str(error))) from None
    counts: dict[Pair, Counter[str]] = {}
    for record in records.values():
        counts.setdefault((record.strategy, record.runner), Counter())[record.status] += 1
    scorecards = {
        pair: _scorecard(pair, counts.get(pair, Counter()), declared.get(pair, frozenset()),
                         frozenset(p for s, r, p in verified if (s, r) == pair), schema)
        for pair in sorted(counts.keys() | declared.keys())
    }
    version = meta.get("interlock")
    date = meta.get("date")
    return ReportSummary(
        path=str(path), schema=schema, interlock=version if isinstance(version, str) else "",
        date=date if isinstance(date, str) else "", checks=_checks(where, meta.get("suite")),
        records=MappingProxyType(records), verified=verified,
        scorecards=MappingProxyType(scorecards),
    )


def _scorecard(pair: Pair, counts: Counter[str], declared: frozenset[str],
               verified: frozenset[str], schema: int) -> Scorecard:
    return Scorecard(strategy=pair[0], runner=pair[1], passed=counts["passed"],
                     failed=counts["failed"], skipped=counts["skipped"],
                     xfailed=counts["xfailed"], not_run=counts["not run"], declared=declared,
                     verified=verified, declared_from="records" if schema == 0 else "report")


def _error(path: Path, problem: str) -> ReportFileError:
    return ReportFileError(f"conformance report {path}: {problem}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _read_json(path: Path) -> Any:
    if path.is_dir():
        raise _error(path, "is a directory, not a report file")
    if not path.exists():
        raise _error(path, "no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _error(path, "is not JSON (it is not even UTF-8 text)") from None
    except OSError as error:
        raise _error(path, f"cannot be read: {error.strerror or error}") from None
    if text.startswith(_LOCK_HEADER):
        raise _error(path, "is an interlock matrix lock file, not a conformance report "
                           "(`interlock conformance --report PATH` writes one)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise _error(path, f"is not JSON ({error.msg} at line {error.lineno} column "
                           f"{error.colno})") from None
    except (ValueError, RecursionError) as error:  # a 5,000-digit number, deep nesting
        raise _error(path, f"is not JSON this reads: {_one_line(str(error))}") from None


def _kind(value: Any) -> str:
    """The JSON name of a value's type."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    names = {dict: "object", list: "list", str: "string", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _readable() -> str:
    newest = "schema 1" if REPORT_SCHEMA == 1 else f"schemas 1 to {REPORT_SCHEMA}"
    return f'{newest} and legacy reports (schema 0, without a "schema" field)'


def _layout(path: Path, data: Any) -> tuple[list[Any], int]:
    """The report's record list and schema."""
    if isinstance(data, list):
        # the oldest reports are a bare list of records
        if data and not any(isinstance(item, dict) for item in data):
            kinds = " and ".join(sorted({_kind(item) + "s" for item in data}))
            raise _error(path, f"is not a conformance report: a JSON list of {kinds}, "
                               "not of records")
        return data, 0
    if not isinstance(data, dict):
        raise _error(path, f'is not a conformance report: a JSON {_kind(data)}, not an '
                           'object with "records"')
    schema = data.get("schema", 0)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 0:
        raise _error(path, f'"schema" must be a whole number; got {clip(repr(schema))}: this '
                           f"interlock reads {_readable()}")
    if schema > REPORT_SCHEMA:
        raise _error(path, f"written with report schema {schema}, which this interlock "
                           f"({interlock.__version__}) cannot read: it reads {_readable()}; "
                           "compare it with the interlock version that wrote it")
    records = data.get("records")
    if not isinstance(records, list):
        keys = ", ".join(list(data)[:6]) or "none"
        found = ('no "records" list' if records is None
                 else f'"records" that is a JSON {_kind(records)}, not a list')
        raise _error(path, f"is not a conformance report: a JSON object with {found} "
                           f"(its keys: {keys})")
    return records, schema


def _records(path: Path, items: Sequence[Any], schema: int) -> dict[RecordKey, Record]:
    out: dict[RecordKey, Record] = {}
    first: dict[RecordKey, int] = {}
    for index, item in enumerate(items):
        where = f"record {index}"
        if not isinstance(item, dict):
            raise _error(path, f"{where} is a JSON {_kind(item)}, not an object")
        values: dict[str, str] = {}
        for name in (*_RECORD_FIELDS, "message"):
            if name not in item:
                # legacy records may predate world_size; none needs a message
                if name == "message" or (name == "world_size" and schema == 0):
                    values[name] = ""
                    continue
                raise _error(path, f"{where} has no {name!r} field")
            if not isinstance(item[name], str):
                raise _error(path, f"{where}: {name!r} must be a string; got "
                                   f"{clip(repr(item[name]))}")
            values[name] = item[name]
        if values["status"] not in STATUSES:
            raise _error(path, f"{where}: status {values['status']!r} is not one of "
                               f"{', '.join(STATUSES)}")
        record = Record(strategy=values["strategy"], runner=values["runner"],
                        world_size=values["world_size"], precision=values["precision"],
                        check=values["check"], status=values["status"],
                        message=values["message"])
        key = _key(record)
        if key in out:
            raise _error(path, f"{where} repeats record {first[key]} ({record_label(key)})")
        out[key], first[key] = record, index
    return out


def _key(record: Record) -> RecordKey:
    return (record.strategy, record.runner, record.world_size, record.precision,
            record.check)


def _mentioned(records: Iterable[Record]) -> dict[Pair, frozenset[str]]:
    """A legacy report's stand-in declarations: the precisions its records mention."""
    found: dict[Pair, set[str]] = {}
    for record in records:
        precisions = found.setdefault((record.strategy, record.runner), set())
        if record.precision != "*":
            precisions.add(record.precision)
    return {pair: frozenset(p) for pair, p in found.items()}


def _declarations(path: Path, items: Any) -> dict[Pair, frozenset[str]]:
    if not isinstance(items, list):
        raise _error(path, f'has report schema {REPORT_SCHEMA} but no "declared" list; got '
                           f"{clip(repr(items))}")
    out: dict[Pair, frozenset[str]] = {}
    for index, item in enumerate(items):
        where = f"declared entry {index}"
        if not isinstance(item, dict):
            raise _error(path, f"{where} is a JSON {_kind(item)}, not an object")
        for name in ("strategy", "runner"):
            if not isinstance(item.get(name), str):
                raise _error(path, f"{where}: {name!r} must be a string; got "
                                   f"{clip(repr(item.get(name)))}")
        for name, kind in (("precisions", str), ("world_sizes", int)):
            value = item.get(name)
            if not isinstance(value, list) or not all(
                isinstance(v, kind) and not isinstance(v, bool) for v in value
            ):
                what = "strings" if kind is str else "whole numbers"
                raise _error(path, f"{where}: {name!r} must be a list of {what}; got "
                                   f"{clip(repr(value))}")
        pair = (item["strategy"], item["runner"])
        out[pair] = out.get(pair, frozenset()) | frozenset(item["precisions"])
    return out


def _checks(path: Path, suite: Any) -> tuple[str, ...]:
    if suite is None:
        return ()
    checks = suite.get("checks") if isinstance(suite, dict) else None
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise _error(path, f'"suite" must be an object with a "checks" list of check ids; '
                           f"got {clip(repr(suite))}")
    return tuple(checks)


# --------------------------------------------------------------------------- comparing


def compare(old: ReportSummary, new: ReportSummary) -> Comparison:
    """Every record whose status changed in a way that matters, and every cell whose
    verification changed, from ``old`` to ``new``."""
    regressions: list[Change] = []
    passing: list[Change] = []
    skipped: list[Change] = []
    removed: list[Change] = []
    other: list[Change] = []
    for key in sorted(old.records.keys() | new.records.keys()):
        before, after = old.records.get(key), new.records.get(key)
        was = None if before is None else before.status
        if after is None:
            removed.append(Change(key=key, old=was, new=None))
            continue
        change = Change(key=key, old=was, new=after.status, message=_first_line(after.message))
        if after.status in BROKEN and was not in BROKEN:
            regressions.append(change)
        elif after.status == "passed" and was != "passed":
            passing.append(change)
        elif after.status == "skipped" and was in ("passed", "failed"):
            skipped.append(change)
        elif after.status != was:
            other.append(change)
    return Comparison(
        old=old, new=new, regressions=tuple(regressions), newly_passing=tuple(passing),
        newly_skipped=tuple(skipped), removed=tuple(removed), other_changes=tuple(other),
        no_longer_verified=tuple(sorted(old.verified - new.verified)),
        newly_verified=tuple(sorted(new.verified - old.verified)),
    )


def _first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), "")


# --------------------------------------------------------------------------- rendering

_COLUMNS = ("passed", "failed", "skipped", "not run", "verified")


def _describe(summary: ReportSummary) -> str:
    kind = "legacy report, schema 0" if summary.legacy else f"report schema {summary.schema}"
    version = summary.interlock or "?"
    date = f"on {summary.date}" if summary.date else "undated"
    return f"{summary.path} ({kind}; written by interlock {version} {date})"


def _score(card: Scorecard | None) -> list[str | int | None]:
    if card is None:
        return [None] * len(_COLUMNS)
    return [card.passed, card.failed, card.skipped, card.not_run, card.cells]


def scorecard_table(old: ReportSummary, new: ReportSummary) -> str:
    """One row per (strategy, runner) of either report: each report's counts and
    verified/declared cells, side by side ("-" where a report lacks the pair)."""
    from tabulate import tabulate

    pairs = sorted(old.scorecards.keys() | new.scorecards.keys())
    rows = [[*pair, *_score(old.scorecards.get(pair)), *_score(new.scorecards.get(pair))]
            for pair in pairs]
    headers = ["strategy", "runner", *(f"old\n{c}" for c in _COLUMNS),
               *(f"new\n{c}" for c in _COLUMNS)]
    return tabulate(rows, headers=headers, missingval="-",
                    colalign=("left", "left", *["right"] * (2 * len(_COLUMNS))))


def render(comparison: Comparison) -> str:
    """The scorecards side by side, every difference, and a one-line verdict."""
    old, new = comparison.old, comparison.new
    out = [f"old: {_describe(old)}", f"new: {_describe(new)}", "",
           scorecard_table(old, new), "",
           "verified: the cells (precisions) a report verifies, of those it declares."]
    legacy = [name for name, summary in (("old", old), ("new", new)) if summary.legacy]
    if len(legacy) == 1:
        out.append(f"{legacy[0]} is a legacy report: it declares nothing, so the precisions "
                   "its records mention count as declared.")
    elif legacy:
        out.append("old and new are legacy reports: they declare nothing, so the precisions "
                   "their records mention count as declared.")
    sections: list[tuple[str, int, list[str]]] = [
        ("Regressions", len(comparison.regressions),
         [c.line() for c in comparison.regressions]),
        ("Cells no longer verified", len(comparison.no_longer_verified),
         _cell_lines(comparison.no_longer_verified)),
        ("No longer in the report", len(comparison.removed),
         _grouped(comparison.removed, new.records)),
        ("Newly skipped", len(comparison.newly_skipped),
         [c.line() for c in comparison.newly_skipped]),
        ("Newly passing", len(comparison.newly_passing),
         _grouped(comparison.newly_passing, old.records)),
        ("Newly verified cells", len(comparison.newly_verified),
         _cell_lines(comparison.newly_verified)),
        ("Other status changes", len(comparison.other_changes),
         _grouped(comparison.other_changes, old.records)),
    ]
    shown = [section for section in sections if section[1]]
    for title, count, lines in shown:
        out += ["", f"{title} ({count}):", *(f"  {line}" for line in lines)]
    if not shown:
        out += ["", "No differences: every record has the same status in both reports, "
                "and they verify the same cells."]
    out += ["", comparison.verdict]
    return "\n".join(out) + "\n"


def _cell_lines(cells: Sequence[Key]) -> list[str]:
    """One line per (strategy, runner): ``ddp cpu 16-mixed, 32-true``."""
    pairs: dict[Pair, list[str]] = {}
    for strategy, runner, precision in cells:
        pairs.setdefault((strategy, runner), []).append(precision)
    return [f"{s} {r} {', '.join(precisions)}" for (s, r), precisions in pairs.items()]


def _grouped(changes: Sequence[Change], other: Mapping[RecordKey, Record]) -> list[str]:
    """One line per change, but one line for all the changes of a (strategy, runner), or
    of a (strategy, runner, world size), that the ``other`` report has no record of."""
    present = {key[:n] for key in other for n in (2, 3)}
    order: list[str | tuple[str, ...]] = []
    groups: dict[tuple[str, ...], list[Change]] = {}
    for change in changes:
        whole = next((change.key[:n] for n in (2, 3) if change.key[:n] not in present), None)
        if whole is None:
            order.append(change.line())
            continue
        if whole not in groups:
            order.append(whole)
        groups.setdefault(whole, []).append(change)
    lines = []
    for entry in order:
        if isinstance(entry, str):
            lines.append(entry)
            continue
        where = " ".join(entry[:2]) + (f" w{entry[2] or '?'}" if len(entry) == 3 else "")
        moves = sorted({f"{c.old or 'absent'} -> {c.new or 'absent'}" for c in groups[entry]})
        lines.append(f"{where}: {plural(len(groups[entry]), 'record')} ({', '.join(moves)})")
    return lines


def run_compare(old_path: str, new_path: str) -> tuple[int, str]:
    """``interlock conformance --compare OLD NEW``: the exit code and what to print.

    Raises:
        ReportFileError: either file cannot be read as a conformance report.
    """
    comparison = compare(load(old_path), load(new_path))
    return comparison.exit_code, render(comparison)
