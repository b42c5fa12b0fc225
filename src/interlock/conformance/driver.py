"""The conformance driver: one process per (strategy, runner, world size) launch.

Run as ``python -m interlock.conformance.driver --strategy NAME ... --out FILE``. It
resolves the strategy as a user would, launches it with the strategy's own launcher
(the script launcher re-runs this module for the other ranks), runs the table's rank
checks for every precision inside the ranks, then its launch checks around the
launches, and writes one JSON record per (precision, check) to ``--out``. Which checks
run, where, in what order and whether each applies all come from
:mod:`interlock.conformance.table`.

Each rank appends its results to its own file as each check finishes, so a rank that
crashes still reports the checks it completed; the check it was running is failed
with the crash, and the ones after it are reported as not run.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from interlock.conformance import reference
from interlock.conformance.checks import (
    ANY_PRECISION,
    DRIVER_ENV,
    CheckFailed,
    CheckSkipped,
    RankContext,
)
from interlock.conformance.launch_checks import LaunchContext
from interlock.conformance.table import CHECKS, Check, InDriver, InRanks, skip_reason
from interlock.engine.specs import StrategySpec
from interlock.strategies.launchers import history as launch_history

#: the process-group timeout of the main launch: a check that deadlocks the ranks
#: fails after this instead of after the strategy's default (30 minutes)
MAIN_TIMEOUT_S = 120.0


def _selected(args: argparse.Namespace) -> tuple[Check, ...]:
    """The table's checks this launch runs: all, or those ``--checks`` names."""
    only = None if getattr(args, "checks", None) is None else set(args.checks.split(","))
    return tuple(c for c in CHECKS if only is None or c.id in only)


#: the driver's start (``time.time()``), which the ranks of the main launch measure their
#: setup from; a rank that re-runs the driver keeps the first driver's
STARTED_ENV = "INTERLOCK_CONFORMANCE_STARTED"

#: the file in a launch's work directory that names the check running now, for the
#: suite's progress lines
PROGRESS_FILE = "progress"


def _progress(workdir: str | Path, check_id: str) -> None:
    """Say which check starts now (the time and the check's id, one line, replaced).
    Only for the progress lines: a write that fails is let go. Under the script
    launcher every rank re-runs the driver, so each writes through a file of its own."""
    path = Path(workdir, PROGRESS_FILE)
    temp = path.with_name(f"{PROGRESS_FILE}.{os.getpid()}.tmp")
    try:
        temp.write_text(f"{time.time():.3f} {check_id}\n")
        temp.replace(path)
    except OSError:
        temp.unlink(missing_ok=True)


def current_check(workdir: str | Path) -> tuple[str, float] | None:
    """The check a launch runs now and when it started (``time.time()``), or None."""
    try:
        stamp, check_id = Path(workdir, PROGRESS_FILE).read_text().split()
        return check_id, float(stamp)
    except (OSError, ValueError):
        return None


def _record(precision: str, check: str, status: str, message: str = "",
            seconds: float | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"precision": precision, "check": check, "status": status,
                              "message": message}
    if seconds is not None:
        record["seconds"] = round(seconds, 3)
    return record


def _resolve(args: argparse.Namespace, precision: str, devices: int,
             parallelism: Any = None) -> Any:
    import interlock

    return _prepare(interlock.resolve(strategy=args.strategy, accelerator=args.accelerator,
                                      devices=devices, precision=precision,
                                      parallelism=parallelism))


def _prepare(strategy: Any) -> Any:
    """Give strategies that parallelise by a user function the suite's for its model."""
    if hasattr(strategy, "parallelize_fn") and strategy.parallelize_fn is None:
        strategy.parallelize_fn = reference.tensor_parallel_plan
    return strategy


def _plan_for(args: argparse.Namespace, devices: int) -> Any:
    import interlock

    def plan_for(precision: str) -> Any:
        return interlock.plan(strategy=args.strategy, accelerator=args.accelerator,
                              devices=devices, precision=precision)

    return plan_for


# ------------------------------------------------------------------ inside the ranks


def run_rank_checks(strategy: Any, args: argparse.Namespace, precisions: list[str],
                    workdir: str, passed: torch.nn.Module | None = None) -> int:
    """The table's rank checks: those run once per launch and those run for each
    precision in table order, for every precision, then the checks that end the
    strategy; results appended to this rank's file. Returns this rank's global rank
    (what the launch_result check expects launch to hand back from rank 0)."""
    from interlock.engine.registry import registered

    spec = registered(StrategySpec)[args.strategy]
    rank = strategy.global_rank
    out = Path(workdir, f"rank-{rank}.jsonl")
    plan_for = _plan_for(args, args.world_size)

    # every check starts from the precision's first state (a fresh loss scaler, at the
    # scale the references start from): a check that moved the scale (scaler_skip)
    # must not change what the next one computes, so that no verdict depends on which
    # other precisions and checks ran
    fresh: dict[str, Any] = {}
    selected = _selected(args)
    _note_setup(workdir, rank)

    def run(check: Check, runs: InRanks, precision: str) -> None:
        if fresh.get("state"):
            strategy.precision.load_state_dict(copy.deepcopy(fresh["state"]))
        label = precision if check.per_precision else ANY_PRECISION
        _mark(out, _record(label, check.id, "running"))
        ctx = RankContext(strategy=strategy, spec=spec, precision=precision,
                          accelerator=args.accelerator, world_size=args.world_size,
                          workdir=Path(workdir), plan_for=plan_for, passed=passed)
        why = skip_reason(check, capabilities=spec.capabilities,
                          precision=precision if check.per_precision else None,
                          world_size=args.world_size, parallel_dims=spec.parallel_dims)
        if why is not None:
            _mark(out, _record(label, check.id, "skipped", why))
            return
        if rank == 0:
            _progress(workdir, check.id)
        _mark(out, _run_one(runs.run, ctx, label, check.id, rank))

    for index, precision in enumerate(precisions):
        if index:
            strategy.complete(plan_for(precision))  # the same strategy, another precision
            _prepare(strategy)
        fresh["state"] = reference.with_parity_scale(
            copy.deepcopy(strategy.precision.state_dict()))
        for check in selected:
            runs = check.runs
            if not isinstance(runs, InRanks) or runs.when == "last" or (
                    runs.when == "once" and index):
                continue
            run(check, runs, precision)
            # the ranks leave a check together, so one that failed on a single rank
            # does not leave the others waiting in the next check's collectives
            strategy.barrier()
    # teardown releases the process group: it comes last, and no barrier follows it;
    # each result is in this rank's file before the next check starts
    for check in selected:
        if isinstance(check.runs, InRanks) and check.runs.when == "last":
            run(check, check.runs, precisions[-1])
    return int(rank)


def _note_setup(workdir: str, rank: int) -> None:
    """Write how long this rank took from the driver's start to its first check."""
    started = os.environ.get(STARTED_ENV)
    if started is None:
        return
    Path(workdir, f"setup-{rank}.txt").write_text(f"{time.time() - float(started):.3f}\n")


def setup_seconds(workdir: Path, world_size: int) -> float | None:
    """The slowest rank's setup in the main launch, or None when a rank wrote none."""
    times = []
    for rank in range(world_size):
        try:
            times.append(float(Path(workdir, f"setup-{rank}.txt").read_text()))
        except (OSError, ValueError):
            return None
    return max(times) if times else None


def _run_one(fn: Callable[[Any], None], ctx: Any, label: str, check_id: str,
             rank: int | None = None) -> dict[str, Any]:
    """Run one check, timed: in rank ``rank``, or in the launching process (None)."""
    began = time.monotonic()
    try:
        fn(ctx)
    except CheckSkipped as skip:
        record = _record(label, check_id, "skipped", str(skip))
    except CheckFailed as failure:
        text = str(failure)
        # a check that compares every rank's answers names the rank in its message
        prefix = "" if rank is None or text.startswith("rank ") else f"rank {rank}: "
        record = _record(label, check_id, "failed", prefix + text)
    except Exception as error:
        who = "the check" if rank is None else f"rank {rank}"
        record = _record(label, check_id, "failed",
                         f"{who} raised {type(error).__name__}: {error}\n"
                         f"{traceback.format_exc(limit=6)}")
    else:
        record = _record(label, check_id, "passed")
    record["seconds"] = round(time.monotonic() - began, 3)
    return record


def _mark(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as file:
        file.write(json.dumps(record) + "\n")
        file.flush()


def _collect(workdir: Path, world_size: int, crash: str | None) -> list[dict[str, Any]]:
    """Merge the ranks' files: a check fails if it failed on any rank."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    running: set[tuple[str, str]] = set()
    for rank in range(world_size):
        path = workdir / f"rank-{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            record = json.loads(line)
            key = (record["precision"], record["check"])
            if record["status"] == "running":
                running.add(key)
                continue
            running.discard(key)
            previous = merged.get(key)
            if previous is None or (previous["status"] != "failed"
                                    and record["status"] == "failed"):
                merged[key] = record
            # a check takes as long as its slowest rank
            slowest = max(r.get("seconds", 0.0) for r in (record, previous or record))
            if "seconds" in record or (previous and "seconds" in previous):
                merged[key]["seconds"] = slowest
        for key in running:
            merged[key] = _record(*key, "failed", f"rank {rank} crashed during this check: "
                                  f"{crash or 'it did not finish'}")
        running.clear()
    return list(merged.values())


def _not_run(records: list[dict[str, Any]], precisions: list[str], reason: str,
             selected: tuple[Check, ...] | None = None) -> list[dict[str, Any]]:
    done = {(r["precision"], r["check"]) for r in records}
    missing = []
    for check in CHECKS if selected is None else selected:
        if not isinstance(check.runs, InRanks):
            continue
        labels = precisions if check.per_precision else [ANY_PRECISION]
        missing += [_record(p, check.id, "not run", reason)
                    for p in labels if (p, check.id) not in done]
    return missing


def _then_in_driver(records: list[dict[str, Any]], ctx: LaunchContext,
                    selected: tuple[Check, ...] | None = None) -> None:
    """Run the launching process's half of the rank checks that have one; a problem
    it finds fails every record of its check."""
    for check in CHECKS if selected is None else selected:
        if not (isinstance(check.runs, InRanks) and check.runs.then_in_driver):
            continue
        try:
            check.runs.then_in_driver(ctx)
        except CheckFailed as failure:
            problem = str(failure)
        except Exception as error:
            problem = f"the launching process's part raised {type(error).__name__}: {error}"
        else:
            continue
        for record in records:
            if record["check"] == check.id:
                record["status"] = "failed"
                record["message"] = "; ".join(filter(None, [record["message"], problem]))


def run_driver_checks(ctx: LaunchContext,
                      selected: tuple[Check, ...] | None = None) -> list[dict[str, Any]]:
    """The table's launch checks (of ``selected``), in table order, each skipped with
    the reason where the strategy or the world size does not admit it."""
    records = []
    for check in CHECKS if selected is None else selected:
        if not isinstance(check.runs, InDriver):
            continue
        why = skip_reason(check, capabilities=ctx.spec.capabilities, precision=None,
                          world_size=ctx.world_size, parallel_dims=ctx.spec.parallel_dims)
        if why is not None:
            records.append(_record(ANY_PRECISION, check.id, "skipped", why))
            continue
        _progress(ctx.workdir, check.id)
        records.append(_run_one(check.runs.run, ctx, ANY_PRECISION, check.id))
    return records


def drive(args: argparse.Namespace) -> list[dict[str, Any]]:
    from interlock.engine.registry import registered

    precisions = args.precisions.split(",")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec = registered(StrategySpec)[args.strategy]
    os.environ.setdefault(DRIVER_ENV, str(os.getpid()))
    os.environ.setdefault(STARTED_ENV, f"{time.time():.3f}")
    environ_before = dict(os.environ)
    strategy = _resolve(args, precisions[0], args.world_size)
    if hasattr(strategy, "timeout"):
        strategy.timeout = datetime.timedelta(seconds=MAIN_TIMEOUT_S)

    records: list[dict[str, Any]] = []
    crash: str | None = None
    # a module handed to the ranks through launch() (launch_arguments): it must reach
    # every rank as a private copy and come back untouched
    passed = reference.model()
    passed_before = {k: v.clone() for k, v in passed.state_dict().items()}
    returned: Any = None
    began = time.monotonic()
    if not getattr(args, "no_main_launch", False):
        try:
            returned = strategy.launch(run_rank_checks, args, precisions, str(workdir),
                                       passed)
        except Exception as error:
            crash = f"{type(error).__name__}: {error}"[:4000]
        args.launch_seconds = round(time.monotonic() - began, 3)
        records += _collect(workdir, args.world_size, crash)
    ctx = LaunchContext(
        strategy=strategy, spec=spec, world_size=args.world_size, workdir=workdir,
        resolve=lambda precision, devices: _resolve(args, precision, devices),
        resolve_layout=lambda precision, devices, layout: _resolve(args, precision, devices,
                                                                   layout),
        returned=returned, crash=crash, environ_before=environ_before, passed=passed,
        passed_before=passed_before, setup_seconds=setup_seconds(workdir, args.world_size))
    selected = _selected(args)
    if not getattr(args, "no_main_launch", False):
        _then_in_driver(records, ctx, selected)
        records += _not_run(records, precisions,
                            f"a rank crashed before reaching it: {crash}" if crash
                            else "the launch ended before reaching it", selected)
    records += run_driver_checks(ctx, selected)
    return records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="run the conformance checks of one launch")
    p.add_argument("--strategy", required=True)
    p.add_argument("--accelerator", required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--precisions", required=True, help="comma-separated")
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--import", dest="imports", action="append", default=[])
    p.add_argument("--checks", default=None, help="comma-separated check ids (default: all)")
    p.add_argument("--no-main-launch", action="store_true",
                   help="run only launch checks that need nothing of the main launch")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for module in args.imports:
        importlib.import_module(module)
    # a rank the script launcher started by running this module again ends with its
    # launch; should one ever get here, its view must not replace the driver's records
    rerun = launch_history.is_script_child()
    records = drive(args)
    if rerun:
        print("interlock conformance: a rank started by re-running the driver reached "
              "its end; only the driver writes the records", file=sys.stderr)
        return 1
    temp = Path(args.out + ".tmp")
    # the main launch's own time (process start to the ranks' end), apart from the
    # checks that launch again from here
    temp.write_text(json.dumps({"records": records,
                                "launch_seconds": getattr(args, "launch_seconds", None)},
                               indent=1))
    temp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
