"""The conformance report: JSON records and the summary table."""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from interlock.output_files import write_text

if TYPE_CHECKING:
    from interlock.conformance.options import SuiteOptions

#: The report's layout version, written as ``"schema"``. A report without the field is
#: a legacy report (schema 0): it has no ``suite``, ``options`` or ``declared``.
REPORT_SCHEMA = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """The outcome of one conformance case."""

    strategy: str
    runner: str
    world_size: str  # "1", "2", ... or "*" for the declaration
    precision: str  # a canonical precision, or "*" for checks that do not depend on it
    check: str
    status: str  # passed, failed, skipped, xfailed, not run
    message: str = ""
    seconds: float | None = None  # how long the check ran (its slowest rank)


@dataclass(frozen=True, slots=True, kw_only=True)
class Declaration:
    """What a strategy declares on one runner, as the report lists it.

    Attributes:
        precisions: every precision the strategy declares on the runner's accelerator,
            those whose package is missing here included.
        world_sizes: the world sizes the run was asked for.
    """

    strategy: str
    runner: str
    precisions: tuple[str, ...]
    world_sizes: tuple[int, ...]


def machine() -> dict[str, Any]:
    """What the report says about where it ran."""
    import torch

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cuda_devices": torch.cuda.device_count(),
    }


#: failure messages longer than this keep their head and their end
MESSAGE_LIMIT = 4000


def clip_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` whole when short; otherwise its head (strategy, check, rank and first
    problem) and its end (the innermost error), with the cut said in between."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    return (f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n"
            f"{text[-tail:]}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The outcome of one strategy on one runner, over every world size and precision.

    Attributes:
        verdict: ``"passed"`` (at least one check beyond the declaration ran and passed,
            none failed), ``"failed"`` (a check failed or did not run), ``"nothing
            checked"`` (every check was skipped) or ``"not applicable"`` (the strategy
            does not run on the runner's accelerator, and another runner checked it).
        reason: why, for every verdict but passed.
        fails: whether this verdict fails the run.
    """

    strategy: str
    runner: str
    passed: int
    failed: int
    skipped: int
    xfailed: int
    not_run: int
    verdict: str
    reason: str = ""
    fails: bool = False


class ScheduledCase(Protocol):
    """What a verdict reads of a scheduled case (`interlock.conformance.cases.Case`)."""

    @property
    def strategy(self) -> str: ...

    @property
    def runner(self) -> str: ...


class Scheduled(Protocol):
    """What a verdict reads of a run's selection (`interlock.conformance.cases.Selection`,
    which imports this module: hence a protocol, not the class)."""

    @property
    def cases(self) -> Sequence[ScheduledCase]: ...

    @property
    def explicit_runner(self) -> bool: ...

    @property
    def declared(self) -> frozenset[tuple[str, str]]: ...


def verdicts(records: list[Record], selection: Scheduled,
             allow_missing: bool = False) -> list[Verdict]:
    """One verdict per (strategy, runner) the selection scheduled.

    A strategy with nothing checked on a runner fails the run, unless
    ``allow_missing`` or the runner was chosen automatically and the strategy does
    not run on its accelerator but passed on another runner.
    """
    by_pair: dict[tuple[str, str], list[Record]] = {}
    for case in selection.cases:
        by_pair.setdefault((case.strategy, case.runner), [])
    for r in records:
        by_pair.setdefault((r.strategy, r.runner), []).append(r)
    passed_somewhere = set()
    out: list[Verdict] = []
    for (strategy, runner), group in sorted(by_pair.items()):
        counts = Counter(r.status for r in group)
        # checks that ran in a launch (those that launch nothing have no world size)
        launched = [r for r in group if r.world_size != "*"]
        bad = [r for r in group if r.status in ("failed", "not run")]
        if bad:
            verdict = "failed"
            reason = "failed: " + ", ".join(sorted({_label(r) for r in bad}))[:300]
        elif any(r.status == "passed" for r in launched):
            verdict, reason = "passed", ""
            passed_somewhere.add(strategy)
        else:
            verdict = "nothing checked"
            skips = Counter(r.message for r in launched if r.status == "skipped")
            reason = skips.most_common(1)[0][0] if skips else "no check ran"
        out.append(Verdict(strategy=strategy, runner=runner, passed=counts["passed"],
                           failed=counts["failed"], skipped=counts["skipped"],
                           xfailed=counts["xfailed"], not_run=counts["not run"],
                           verdict=verdict, reason=reason))
    final = []
    for v in out:
        fails = v.verdict == "failed"
        if v.verdict == "nothing checked":
            other_runner = (not selection.explicit_runner
                            and (v.strategy, v.runner) not in selection.declared
                            and v.strategy in passed_somewhere)
            if other_runner:
                v = replace(v, verdict="not applicable")
            else:
                fails = not allow_missing
        final.append(replace(v, fails=fails))
    return final


def _label(r: Record) -> str:
    where = "" if r.world_size == "*" else f"w{r.world_size} "
    return where + (r.check if r.precision == "*" else f"{r.check}[{r.precision}]")


def runner_hosts(runners: list[str]) -> dict[str, str]:
    """Where each runner was exercised: ``cpu``; the CUDA device's name; ``tpu``, or
    ``xla-cpu`` when torch_xla ran on its CPU PJRT device."""
    hosts = {}
    for runner in runners:
        if runner == "cuda":
            import torch

            hosts[runner] = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                             else "cuda (no device)")
        elif runner == "tpu":
            device = os.environ.get("PJRT_DEVICE", "TPU").lower()
            hosts[runner] = "tpu" if device == "tpu" else f"xla-{device}"
        else:
            hosts[runner] = runner
    return hosts


def write_report(path: Path, records: list[Record], verdict_list: list[Verdict] | None = None,
                 runners: list[str] | None = None, *, options: SuiteOptions | None = None,
                 declared: Sequence[Declaration] = (),
                 launches: Sequence[dict[str, Any]] = ()) -> None:
    """Write the JSON report atomically: its schema, versions, the suite's checks, what
    the run was asked for (``options``; null when not given), whether it was partial
    (``--checks``: such a report verifies no cell), machine, date, where each runner
    ran, what each (strategy, runner) declares, the verdicts, every record (with the
    seconds its check took) and each launch's wall time."""
    import torch

    from interlock import __version__
    from interlock.conformance.table import CHECKS

    asked = None if options is None else {
        "runner": options.runner,
        "world_sizes": list(options.world_sizes),
        "precisions": None if options.precisions is None else list(options.precisions),
        "checks": None if options.checks is None else list(options.checks),
    }
    report = {
        "schema": REPORT_SCHEMA,
        "interlock": __version__,
        "torch": torch.__version__,
        "suite": {"version": __version__, "checks": [check.id for check in CHECKS]},
        "options": asked,
        "partial": options is not None and options.partial,
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "machine": machine(),
        "runners": runner_hosts(runners or sorted({r.runner for r in records})),
        "declared": [
            {"strategy": d.strategy, "runner": d.runner, "precisions": list(d.precisions),
             "world_sizes": list(d.world_sizes)}
            for d in sorted(declared, key=lambda d: (d.strategy, d.runner))
        ],
        "verdicts": [
            {"strategy": v.strategy, "runner": v.runner, "verdict": v.verdict,
             "reason": v.reason} for v in verdict_list or []
        ],
        "records": [asdict(r) for r in sorted(
            records, key=lambda r: (r.strategy, r.runner, r.world_size, r.precision, r.check)
        )],
        "launches": list(launches),
    }
    write_text(path, json.dumps(report, indent=1) + "\n")


def summary_table(verdict_list: list[Verdict]) -> str:
    """One row per (strategy, runner): checks passed / failed / skipped / xfailed / not
    run over every world size and precision, and the verdict."""
    from tabulate import tabulate

    rows = [
        [v.strategy, v.runner, v.passed, v.failed, v.skipped, v.xfailed, v.not_run,
         v.verdict if v.verdict == "passed" else f"{v.verdict}: {v.reason}"[:90]]
        for v in verdict_list
    ]
    return tabulate(rows, headers=["strategy", "runner", "passed", "failed", "skipped",
                                   "xfailed", "not run", "verdict"])
