"""Comparing conformance reports: the committed CPU report (a legacy report) against
altered copies of itself, a report that ``write_report`` writes, and files that are no
report at all."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from interlock import __version__
from interlock.conformance.cases import declarations, select
from interlock.conformance.compare import (
    Change,
    ReportFileError,
    compare,
    load,
    render,
    run_compare,
)
from interlock.conformance.options import SuiteOptions, validate
from interlock.conformance.report import REPORT_SCHEMA, Declaration, Record, write_report
from interlock.conformance.table import CHECKS
from interlock.matrix.reports import read_report

ROOT = Path(__file__).resolve().parents[2]
#: a report the suite wrote before reports had a schema (0.1.0 before its release)
LEGACY = Path(__file__).resolve().parent / "legacy-report.json"
LOCK = ROOT / "matrix.lock"
PRECISIONS = ("32-true", "16-mixed", "16-true", "64-true", "bf16-mixed", "bf16-true")
CLIPPING = ("single_device", "cpu", "1", "32-true", "clipping")
FAILURE = ("clipping (single_device on cpu, 1 rank(s), 32-true): failed: rank 0: the "
           "gradient norm is 2.5 after clipping to 1.0")


def _legacy() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LEGACY.read_text())
    return data


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def _altered(path: Path, key: tuple[str, ...], status: str | None, message: str = "") -> Path:
    """The legacy report with one record's status changed (None: the record removed)."""
    data = _legacy()
    records = []
    for record in data["records"]:
        if tuple(record[f] for f in ("strategy", "runner", "world_size", "precision",
                                     "check")) == key:
            if status is None:
                continue
            record = {**record, "status": status, "message": message}
        records.append(record)
    assert len(records) == len(data["records"]) - (status is None)
    return _write(path, {**data, "records": records})


def _records(data: dict[str, Any]) -> list[Record]:
    return [Record(**r) for r in data["records"]]


def _options() -> SuiteOptions:
    return SuiteOptions(strategies=("all",), runner="cpu", world_sizes=(1, 2),
                        precisions=None)


def _declared(records: list[Record]) -> list[Declaration]:
    pairs = sorted({(r.strategy, r.runner) for r in records})
    return [Declaration(strategy=s, runner=r, precisions=tuple(sorted(
        {x.precision for x in records if (x.strategy, x.runner) == (s, r)} - {"*"})),
        world_sizes=(1, 2)) for s, r in pairs]


def _row(text: str, strategy: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(strategy + " "))


# --------------------------------------------------------------------------- comparing


def test_a_legacy_report_compared_with_itself_has_no_difference() -> None:
    code, text = run_compare(str(LEGACY), str(LEGACY))
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == (f"old: {LEGACY} (legacy report, schema 0; written by interlock "
                        "0.1.0 on 2026-11-30)")
    assert lines[-3:] == ["No differences: every record has the same status in both "
                          "reports, and they verify the same cells.", "", "no regression"]
    assert ("old and new are legacy reports: they declare nothing, so the precisions their "
            "records mention count as declared.") in lines
    assert _row(text, "single_device") == ["single_device", "cpu", "50", "0", "83", "0",
                                           "6/6", "50", "0", "83", "0", "6/6"]

    summary = load(LEGACY)
    assert (summary.schema, summary.legacy, summary.checks) == (0, True, ())
    assert summary.verified == frozenset(read_report(LEGACY).verified)
    card = summary.scorecards[("single_device", "cpu")]
    assert (card.passed, card.failed, card.skipped, card.xfailed, card.not_run) == (
        50, 0, 83, 0, 0)
    assert card.declared == card.verified == frozenset(PRECISIONS)
    assert (card.unverified, card.cells, card.declared_from) == (frozenset(), "6/6", "records")


def test_one_check_passed_then_failed_is_one_regression_and_its_cell_unverified(
        tmp_path: Path) -> None:
    new = _altered(tmp_path / "new.json", CLIPPING, "failed", FAILURE + "\nmore detail")
    comparison = compare(load(LEGACY), load(new))
    assert comparison.regressions == (
        Change(key=CLIPPING, old="passed", new="failed", message=FAILURE),)
    assert comparison.no_longer_verified == (("single_device", "cpu", "32-true"),)
    assert (comparison.newly_passing, comparison.newly_skipped, comparison.removed,
            comparison.other_changes, comparison.newly_verified) == ((), (), (), (), ())
    assert comparison.exit_code == 1

    text = render(comparison)
    assert text.endswith(
        "Regressions (1):\n"
        f"  single_device cpu w1 32-true clipping: passed -> failed: {FAILURE}\n"
        "\n"
        "Cells no longer verified (1):\n"
        "  single_device cpu 32-true\n"
        "\n"
        "1 regression, 1 cell no longer verified\n")
    assert _row(text, "single_device") == ["single_device", "cpu", "50", "0", "83", "0",
                                           "6/6", "49", "1", "83", "0", "5/6"]
    assert _row(text, "ddp_spawn")[2:] == ["106", "0", "27", "0", "6/6"] * 2
    assert run_compare(str(LEGACY), str(new)) == (1, text)
    # the other way round, the check passes again and the cell is verified again
    back = compare(load(new), load(LEGACY))
    assert [c.line() for c in back.newly_passing] == [
        "single_device cpu w1 32-true clipping: failed -> passed"]
    assert (back.newly_verified, back.exit_code, back.verdict) == (
        (("single_device", "cpu", "32-true"),), 0, "no regression")


def test_a_check_passed_then_skipped_is_newly_skipped(tmp_path: Path) -> None:
    new = _altered(tmp_path / "new.json", CLIPPING, "skipped", "listed in the skips file")
    comparison = compare(load(LEGACY), load(new))
    assert [c.line() for c in comparison.newly_skipped] == [
        "single_device cpu w1 32-true clipping: passed -> skipped: listed in the skips file"]
    assert (comparison.regressions, comparison.no_longer_verified, comparison.exit_code) == (
        (), (), 0)
    assert render(comparison).endswith(
        "Newly skipped (1):\n"
        "  single_device cpu w1 32-true clipping: passed -> skipped: listed in the skips "
        "file\n\nno regression\n")


def test_a_check_no_longer_in_the_report(tmp_path: Path) -> None:
    new = _altered(tmp_path / "new.json", CLIPPING, None)
    comparison = compare(load(LEGACY), load(new))
    assert [c.line() for c in comparison.removed] == [
        "single_device cpu w1 32-true clipping: passed -> absent"]
    assert (comparison.regressions, comparison.no_longer_verified, comparison.exit_code) == (
        (), (), 0)
    assert "No longer in the report (1):\n" in render(comparison)


def test_what_a_report_lacks_entirely_is_one_line_per_strategy_or_launch(
        tmp_path: Path) -> None:
    data = _legacy()
    data["records"] = [r for r in data["records"]
                       if r["strategy"] == "single_device" and r["world_size"] != "2"]
    small = _write(tmp_path / "small.json", data)
    comparison = compare(load(LEGACY), load(small))
    assert (comparison.exit_code, comparison.verdict) == (1, "42 cells no longer verified")
    text = render(comparison)
    assert text.split("Cells no longer verified (42):\n")[1].splitlines()[:3] == [
        "  ddp cpu 16-mixed, 16-true, 32-true, 64-true, bf16-mixed, bf16-true",
        "  ddp_fork cpu 16-mixed, 16-true, 32-true, 64-true, bf16-mixed, bf16-true",
        "  ddp_forkserver cpu 16-mixed, 16-true, 32-true, 64-true, bf16-mixed, bf16-true"]
    assert text.split("No longer in the report (1046):\n")[1].splitlines()[7:10] == [
        "  model_parallel cpu: 105 records (passed -> absent, skipped -> absent)",
        "  single_device cpu w2: 66 records (skipped -> absent)", ""]
    back = render(compare(load(small), load(LEGACY)))
    assert "Newly passing (773):\n  ddp cpu: 106 records (absent -> passed)\n" in back
    assert "  single_device cpu w2: 66 records (absent -> skipped)\n" in back


def test_a_new_schema_report_round_trips_through_load(tmp_path: Path) -> None:
    records = _records(_legacy())
    path = tmp_path / "report.json"
    write_report(path, records, options=_options(), declared=_declared(records))
    data = json.loads(path.read_text())
    assert data["schema"] == REPORT_SCHEMA == 1
    assert data["suite"] == {"version": __version__, "checks": [c.id for c in CHECKS]}
    assert data["options"] == {"runner": "cpu", "world_sizes": [1, 2], "precisions": None,
                               "checks": None}
    assert data["declared"][-1] == {"strategy": "single_device", "runner": "cpu",
                                    "precisions": sorted(PRECISIONS), "world_sizes": [1, 2]}

    summary = load(path)
    assert (summary.schema, summary.legacy) == (1, False)
    assert summary.checks == tuple(c.id for c in CHECKS)
    assert list(summary.records.values()) == sorted(
        records, key=lambda r: (r.strategy, r.runner, r.world_size, r.precision, r.check))
    legacy = load(LEGACY)
    assert summary.verified == legacy.verified
    card = summary.scorecards[("single_device", "cpu")]
    assert (card.declared_from, card.cells) == ("report", "6/6")
    comparison = compare(legacy, summary)
    assert (comparison.exit_code, comparison.verdict) == (0, "no regression")
    assert render(comparison).splitlines()[-3] == (
        "No differences: every record has the same status in both reports, and they "
        "verify the same cells.")


def test_a_declared_precision_without_records_is_unverified_not_passing(
        tmp_path: Path) -> None:
    everything = _records(_legacy())
    kept = [r for r in everything
            if not (r.strategy == "single_device" and r.precision == "64-true")]
    path = tmp_path / "new.json"
    write_report(path, kept, options=_options(), declared=_declared(everything))
    new = load(path)
    card = new.scorecards[("single_device", "cpu")]
    assert card.declared == frozenset(PRECISIONS)
    assert card.unverified == frozenset({"64-true"})
    assert card.cells == "5/6"
    comparison = compare(load(LEGACY), new)
    assert comparison.no_longer_verified == (("single_device", "cpu", "64-true"),)
    assert len(comparison.removed) == 14  # 7 checks, w1 and w2
    assert (comparison.regressions, comparison.exit_code, comparison.verdict) == (
        (), 1, "1 cell no longer verified")
    text = render(comparison)
    assert _row(text, "single_device")[2:] == ["50", "0", "83", "0", "6/6",
                                               "44", "0", "75", "0", "5/6"]
    assert "old is a legacy report: it declares nothing, so the precisions its records " \
           "mention count as declared." in text


def test_declarations_list_every_declared_precision_whatever_was_asked() -> None:
    options = validate(strategies=["single_device"], runner="cpu", world_sizes="1,2",
                       precisions="32-true")
    assert declarations(select(options), options) == [Declaration(
        strategy="single_device", runner="cpu", precisions=PRECISIONS, world_sizes=(1, 2))]


# --------------------------------------------------------------------------- bad input


def _error(path: Path | str) -> str:
    with pytest.raises(ReportFileError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_bad_input_is_one_clear_line_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    assert _error(missing) == f"conformance report {missing}: no such file"
    assert _error(tmp_path) == f"conformance report {tmp_path}: is a directory, not a report file"
    text = tmp_path / "text.json"
    text.write_text("passed: 3\n")
    assert _error(text) == (f"conformance report {text}: is not JSON (Expecting value at "
                            "line 1 column 1)")
    assert _error(LOCK) == (f"conformance report {LOCK}: is an interlock matrix lock file, "
                            "not a conformance report (`interlock conformance --report "
                            "PATH` writes one)")
    numbers = _write(tmp_path / "numbers.json", [1, 2.5, 3])
    assert _error(numbers) == (f"conformance report {numbers}: is not a conformance report: "
                               "a JSON list of numbers, not of records")
    other = _write(tmp_path / "other.json", {"name": "x", "version": 3})
    assert _error(other) == (f'conformance report {other}: is not a conformance report: a '
                             'JSON object with no "records" list (its keys: name, version)')
    newer = _write(tmp_path / "newer.json", {**_legacy(), "schema": 7})
    assert _error(newer) == (
        f"conformance report {newer}: written with report schema 7, which this interlock "
        f"({__version__}) cannot read: it reads schema 1 and legacy reports (schema 0, "
        'without a "schema" field); compare it with the interlock version that wrote it')
    odd = _write(tmp_path / "odd.json", {**_legacy(), "schema": "1"})
    assert _error(odd) == (
        f'conformance report {odd}: "schema" must be a whole number; got \'1\': this '
        'interlock reads schema 1 and legacy reports (schema 0, without a "schema" field)')
    undeclared = _write(tmp_path / "undeclared.json", {**_legacy(), "schema": 1})
    assert _error(undeclared) == (f'conformance report {undeclared}: has report schema 1 '
                                  'but no "declared" list; got None')


@pytest.mark.parametrize(("change", "problem"), [
    ({"status": 5}, "record 3: 'status' must be a string; got 5"),
    ({"status": "error"}, "record 3: status 'error' is not one of passed, failed, "
                          "skipped, xfailed, not run"),
    ({"check": None}, "record 3: 'check' must be a string; got None"),
    ({"check": "<drop>"}, "record 3 has no 'check' field"),
    ({"world_size": 1}, "record 3: 'world_size' must be a string; got 1"),
    ("[]", "record 3 is a JSON list, not an object"),
    ({"check": "declaration", "world_size": "*", "precision": "*"},
     "record 3 repeats record 0 (ddp cpu w* * declaration)"),
])
def test_a_damaged_record_is_named_by_its_index(tmp_path: Path, change: Any,
                                                problem: str) -> None:
    data = _legacy()
    if change == "[]":
        data["records"][3] = []
    else:
        record = {**data["records"][3], **change}
        data["records"][3] = {k: v for k, v in record.items() if v != "<drop>"}
    path = _write(tmp_path / "damaged.json", data)
    assert _error(path) == f"conformance report {path}: {problem}"


# --------------------------------------------------------------------------- imports


@functools.cache
def _modules_after_comparing() -> frozenset[str]:
    code = ("import sys\n"
            "from interlock.conformance.compare import run_compare\n"
            f"assert run_compare({str(LEGACY)!r}, {str(LEGACY)!r})[0] == 0\n"
            "print(' '.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    return frozenset(done.stdout.split())


def test_comparing_imports_neither_pytest_nor_torch() -> None:
    # a base install compares reports: no pytest there, and no reason to pay for torch
    loaded = _modules_after_comparing()
    assert "pytest" not in loaded and "torch" not in loaded
