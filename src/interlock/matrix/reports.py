"""Read conformance reports: which (strategy, runner, precision) cells each one verifies.

The compatibility pages (:mod:`interlock.matrix.compat`) mark those cells verified, and
``interlock conformance --compare`` (:mod:`interlock.conformance.compare`) compares
two reports by the same rule; neither needs the other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

#: The main conformance report (the CPU run). Other runs sit beside it as
#: ``conformance-report-<name>.json`` (for example -gpu, -xla, -deepspeed).
REPORT_PREFIX = "conformance-report"

#: Record statuses: these may appear in a verifying report; anything else (failed,
#: "not run", error, an unknown status) keeps the cell from being verified.
PASSING_STATUSES = frozenset({"passed", "xfailed"})
NEUTRAL_STATUSES = frozenset({"skipped"})
#: The check that only reads the registry row, outside any launch.
DECLARATION_CHECK = "declaration"

#: (strategy, runner, precision)
Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Evidence:
    """One report's proof that a (strategy, runner, precision) works.

    Attributes:
        runner: the conformance runner (cpu, cuda, tpu).
        where: where the report says that runner ran ("xla-cpu", "NVIDIA H200"); the
            runner's own name when the report does not say.
        date: the report's "YYYY-MM-DD" date, or "" for an undated report.
        report: the report's file name.
        world_sizes: the world sizes launched with at least one passing check in the
            ranks, ascending.
    """

    runner: str
    where: str
    date: str
    report: str
    world_sizes: tuple[int, ...]

    @property
    def place(self) -> str:
        """The runner, and where it ran when that differs: "tpu on xla-cpu"."""
        return self.runner if self.where in ("", self.runner) else f"{self.runner} on {self.where}"

    @property
    def when(self) -> str:
        return self.date or "undated"


@dataclass(frozen=True, slots=True)
class ReportFile:
    """What one conformance report file says.

    Attributes:
        name: the file name.
        date: its "YYYY-MM-DD" date, or "" when it has none (older reports).
        runners: (runner, where it ran) pairs, sorted; empty when not recorded.
        verified: the (strategy, runner, precision) cells it verifies.
    """

    name: str
    date: str
    runners: tuple[tuple[str, str], ...]
    verified: Mapping[Key, Evidence]


#: (strategy, runner, precision) -> the evidence of every report verifying it, newest
#: first (undated last; equal dates in file-name order).
Verification = Mapping[Key, tuple[Evidence, ...]]

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_RECORD_KEYS = ("strategy", "runner", "precision", "check", "status")


def report_files(directory: Path) -> tuple[Path, ...]:
    """The conformance reports in ``directory`` (``conformance-report.json`` and
    ``conformance-report-*.json``), sorted by file name."""
    if not directory.is_dir():
        return ()
    return tuple(sorted(
        (p for p in directory.glob(f"{REPORT_PREFIX}*.json")
         if p.is_file() and (p.name == f"{REPORT_PREFIX}.json"
                             or p.name.startswith(f"{REPORT_PREFIX}-"))),
        key=lambda p: p.name,
    ))


def _in_ranks(record: Mapping[str, Any]) -> bool:
    """Whether a record is a check that ran inside launched ranks: not the declaration
    check, which reads the registry row without launching anything (its world size is
    "*"). Records of reports older than the world_size field are judged by name."""
    return record["check"] != DECLARATION_CHECK and record.get("world_size") != "*"


def read_report(path: Path) -> ReportFile:
    """Read one report written by ``interlock conformance --report``.

    The report is an object with ``records`` (one per check run: strategy, runner,
    world_size, precision, check, status, message), and, in newer reports, ``date``
    ("YYYY-MM-DD", when it was written) and ``runners`` (runner -> where it ran). A bare
    list of records is accepted too.

    It verifies a (strategy, runner, precision) when the records for it (those of that
    precision and the precision-independent "*" ones of the same strategy and runner)
    hold at least one check of that precision that ran inside the launched ranks and
    passed, and none whose status is other than passed, xfailed or skipped (a failed or
    "not run" record anywhere spoils it; skips are neutral). The declaration check,
    which launches nothing, never counts as the passing check. A report marked
    ``"partial": true`` (a run of some checks only, ``--checks``) verifies nothing.

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: the file is not such a report.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"conformance report {path} is not valid JSON: {exc}") from exc
    records = data.get("records") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise ValueError(f"conformance report {path} must hold a list of records")
    date = data.get("date", "") if isinstance(data, dict) else ""
    if date and not (isinstance(date, str) and _DATE.fullmatch(date)):
        raise ValueError(f"conformance report {path}: date must be 'YYYY-MM-DD'; got {date!r}")
    runners = data.get("runners", {}) if isinstance(data, dict) else {}
    if not isinstance(runners, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in runners.items()
    ):
        raise ValueError(f"conformance report {path}: runners must map runner names to "
                         f"where they ran; got {runners!r}")

    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not all(
            isinstance(record.get(k), str) for k in _RECORD_KEYS
        ) or not isinstance(record.get("world_size", ""), str):
            raise ValueError(
                f"conformance report {path}: record {index} must be an object with string "
                f"fields {', '.join(_RECORD_KEYS)} (and world_size); got {record!r}"
            )
        groups.setdefault((record["strategy"], record["runner"]), []).append(record)

    verified: dict[Key, Evidence] = {}
    # a partial run (``--checks``) left checks out: its passes prove no cell
    partial = isinstance(data, dict) and data.get("partial") is True
    for (strategy, runner), group in sorted(groups.items()) if not partial else ():
        for precision in sorted({r["precision"] for r in group} - {"*"}):
            relevant = [r for r in group if r["precision"] in (precision, "*")]
            if any(r["status"] not in PASSING_STATUSES | NEUTRAL_STATUSES for r in relevant):
                continue
            ran = [r for r in relevant if r["precision"] == precision
                   and r["status"] == "passed" and _in_ranks(r)]
            if not ran:
                continue
            sizes = sorted({int(r["world_size"]) for r in ran
                            if r.get("world_size", "").isdigit()})
            verified[(strategy, runner, precision)] = Evidence(
                runner=runner, where=runners.get(runner, runner), date=date,
                report=path.name, world_sizes=tuple(sizes),
            )
    return ReportFile(name=path.name, date=date, runners=tuple(sorted(runners.items())),
                      verified=MappingProxyType(verified))


def load_report(path: Path) -> Mapping[Key, Evidence]:
    """The cells one report verifies (see :func:`read_report`); a missing file
    verifies nothing."""
    if not path.exists():
        return MappingProxyType({})
    return read_report(path).verified


def merge_reports(reports: Iterable[ReportFile]) -> Verification:
    """Every report's verified cells together: a cell is verified when at least one
    report verifies it; its evidence is listed newest first."""
    found: dict[Key, list[tuple[int, Evidence]]] = {}
    for order, report in enumerate(reports):
        for key, evidence in report.verified.items():
            found.setdefault(key, []).append((order, evidence))
    return MappingProxyType({
        key: tuple(e for _, e in sorted(items, key=lambda item: (_newest_first(item[1]),
                                                                 item[0])))
        for key, items in sorted(found.items())
    })


def _newest_first(evidence: Evidence) -> tuple[int, ...]:
    # Undated sorts after every date; dates descend.
    if not evidence.date:
        return (1,)
    return (0, *(-int(part) for part in evidence.date.split("-")))


ReportArg = Path | Sequence[Path] | None


def read_reports(report: ReportArg) -> tuple[ReportFile, ...]:
    """The reports to mark verified cells from.

    Args:
        report: a directory (every report in it, see :func:`report_files`), one report
            file, a sequence of report files, or None for none. Missing files are
            skipped.
    """
    if report is None:
        return ()
    if isinstance(report, Path):
        paths: Sequence[Path] = report_files(report) if report.is_dir() else (report,)
    else:
        paths = report
    return tuple(read_report(p) for p in paths if p.exists())
