"""The conformance report: JSON records and the summary table."""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """The outcome of one conformance case."""

    strategy: str
    runner: str
    world_size: str  # "1", "2", ... or "*" for the declaration
    precision: str  # a canonical precision, or "*" for checks that do not depend on it
    check: str
    status: str  # passed, failed, skipped, xfailed
    message: str = ""


def machine() -> dict[str, Any]:
    """What the report says about where it ran."""
    import torch

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cuda_devices": torch.cuda.device_count(),
    }


def write_report(path: Path, records: list[Record]) -> None:
    """Write the JSON report atomically: versions, machine, and every record."""
    import torch

    from interlock import __version__

    report = {
        "interlock": __version__,
        "torch": torch.__version__,
        "machine": machine(),
        "records": [asdict(r) for r in sorted(
            records, key=lambda r: (r.strategy, r.runner, r.world_size, r.precision, r.check)
        )],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(report, indent=1) + "\n")
    temp.replace(path)


def summary_table(records: list[Record]) -> str:
    """One row per (strategy, runner, world size): passed/failed/skipped counts and the
    failed checks."""
    from tabulate import tabulate

    groups: dict[tuple[str, str, str], Counter[str]] = {}
    failed: dict[tuple[str, str, str], list[str]] = {}
    for r in records:
        key = (r.strategy, r.runner, r.world_size)
        groups.setdefault(key, Counter())[r.status] += 1
        if r.status == "failed":
            failed.setdefault(key, []).append(
                r.check if r.precision == "*" else f"{r.check}[{r.precision}]")
    rows = [
        [s, runner, w, c["passed"], c["failed"], c["skipped"], c["xfailed"],
         ", ".join(failed.get((s, runner, w), []))[:80]]
        for (s, runner, w), c in sorted(groups.items())
    ]
    return tabulate(rows, headers=["strategy", "runner", "world", "passed", "failed",
                                   "skipped", "xfailed", "failed checks"])
