"""Where a conformance run's time went, from its report: launches and checks.

``python -m interlock.conformance.timings REPORT [--top N]`` prints two Markdown tables:
each driver launch's wall time (interpreter start to exit, and the main launch that ran
the rank checks), slowest first, and each check's seconds summed over every launch and
precision, with its slowest single run. Reports written before the suite timed its
checks have no times; the command says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def launch_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """One row per launch: strategy, world size, wall seconds, main launch seconds."""
    launches = sorted(report.get("launches") or [], key=lambda x: -float(x["seconds"]))
    return [[x["strategy"], x["world_size"], f"{float(x['seconds']):.1f}",
             "" if x.get("launch_seconds") is None else f"{float(x['launch_seconds']):.1f}"]
            for x in launches]


def check_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """One row per check: runs timed, total seconds, slowest run (strategy, world
    size, precision), slowest first by total."""
    total: dict[str, float] = {}
    runs: dict[str, int] = {}
    slowest: dict[str, tuple[float, str]] = {}
    for record in report.get("records") or []:
        seconds = record.get("seconds")
        if not isinstance(seconds, (int, float)):
            continue
        check = record["check"]
        total[check] = total.get(check, 0.0) + seconds
        runs[check] = runs.get(check, 0) + 1
        where = f"{record['strategy']} w{record['world_size']} {record['precision']}"
        if seconds > slowest.get(check, (-1.0, ""))[0]:
            slowest[check] = (float(seconds), where)
    return [[check, str(runs[check]), f"{total[check]:.1f}",
             f"{slowest[check][0]:.1f} ({slowest[check][1]})"]
            for check in sorted(total, key=lambda c: -total[c])]


def _table(headers: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(headers)))
             + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render(report: Mapping[str, Any], top: int | None = None) -> str:
    """Both tables as Markdown (``top``: only the slowest rows of each)."""
    launches, checks = launch_rows(report), check_rows(report)
    if not launches and not checks:
        return "this report has no timings (it predates them)\n"
    total = sum(float(x["seconds"]) for x in report.get("launches") or [])
    head = [f"{len(launches)} launches, {total:.0f} s of launch time in all"]
    return "\n\n".join([
        *head,
        _table(["launch", "world size", "seconds", "main launch s"], launches[:top]),
        _table(["check", "runs", "seconds in all", "slowest run"], checks[:top]),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="where a conformance run's time went")
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=None, help="only the N slowest rows")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.report.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        print(f"{args.report}: not a readable report: {error}", file=sys.stderr)
        return 2
    if not isinstance(report, dict):
        print(f"{args.report}: not a conformance report (a JSON object)", file=sys.stderr)
        return 2
    if args.top is not None and args.top < 1:
        print(f"--top {args.top}: expected a positive number of rows", file=sys.stderr)
        return 2
    try:
        text = render(report, args.top)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        print(f"{args.report}: its records or launches are not a conformance report's: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
