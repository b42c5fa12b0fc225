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
from interlock.strategies.launchers import history as launch_history

#: the process-group timeout of the main launch: a check that deadlocks the ranks
#: fails after this instead of after the strategy's default (30 minutes)
MAIN_TIMEOUT_S = 120.0


def _record(precision: str, check: str, status: str, message: str = "") -> dict[str, str]:
    return {"precision": precision, "check": check, "status": status, "message": message}


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
    from interlock.connector.registry import strategy_specs

    spec = strategy_specs()[args.strategy]
    rank = strategy.global_rank
    out = Path(workdir, f"rank-{rank}.jsonl")
    plan_for = _plan_for(args, args.world_size)

    # every check starts from the precision's first state (a fresh loss scaler, at the
    # scale the references start from): a check that moved the scale (scaler_skip)
    # must not change what the next one computes, so that no verdict depends on which
    # other precisions and checks ran
    fresh: dict[str, Any] = {}

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
        _mark(out, _run_one(runs.run, ctx, label, check.id) if why is None
              else _record(label, check.id, "skipped", why))

    for index, precision in enumerate(precisions):
        if index:
            strategy.complete(plan_for(precision))  # the same strategy, another precision
            _prepare(strategy)
        fresh["state"] = reference.with_parity_scale(
            copy.deepcopy(strategy.precision.state_dict()))
        for check in CHECKS:
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
    for check in CHECKS:
        if isinstance(check.runs, InRanks) and check.runs.when == "last":
            run(check, check.runs, precisions[-1])
    return int(rank)


def _run_one(fn: Callable[[RankContext], None], ctx: RankContext, label: str,
             check_id: str) -> dict[str, str]:
    try:
        fn(ctx)
    except CheckSkipped as skip:
        return _record(label, check_id, "skipped", str(skip))
    except CheckFailed as failure:
        text = str(failure)
        # a check that compares every rank's answers names the rank in its message
        prefix = "" if text.startswith("rank ") else f"rank {ctx.strategy.global_rank}: "
        return _record(label, check_id, "failed", prefix + text)
    except Exception as error:
        return _record(label, check_id, "failed",
                       f"rank {ctx.strategy.global_rank} raised {type(error).__name__}: "
                       f"{error}\n{traceback.format_exc(limit=6)}")
    return _record(label, check_id, "passed")


def _mark(path: Path, record: dict[str, str]) -> None:
    with path.open("a") as file:
        file.write(json.dumps(record) + "\n")
        file.flush()


def _collect(workdir: Path, world_size: int, crash: str | None) -> list[dict[str, str]]:
    """Merge the ranks' files: a check fails if it failed on any rank."""
    merged: dict[tuple[str, str], dict[str, str]] = {}
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
        for key in running:
            merged[key] = _record(*key, "failed", f"rank {rank} crashed during this check: "
                                  f"{crash or 'it did not finish'}")
        running.clear()
    return list(merged.values())


def _not_run(records: list[dict[str, str]], precisions: list[str],
             reason: str) -> list[dict[str, str]]:
    done = {(r["precision"], r["check"]) for r in records}
    missing = []
    for check in CHECKS:
        if not isinstance(check.runs, InRanks):
            continue
        labels = precisions if check.per_precision else [ANY_PRECISION]
        missing += [_record(p, check.id, "not run", reason)
                    for p in labels if (p, check.id) not in done]
    return missing


def _then_in_driver(records: list[dict[str, str]], ctx: LaunchContext) -> None:
    """Run the launching process's half of the rank checks that have one; a problem
    it finds fails every record of its check."""
    for check in CHECKS:
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


def run_driver_checks(ctx: LaunchContext) -> list[dict[str, str]]:
    """The table's launch checks, in table order, each skipped with the reason where
    the strategy or the world size does not admit it."""
    records = []
    for check in CHECKS:
        if not isinstance(check.runs, InDriver):
            continue
        why = skip_reason(check, capabilities=ctx.spec.capabilities, precision=None,
                          world_size=ctx.world_size, parallel_dims=ctx.spec.parallel_dims)
        if why is not None:
            records.append(_record(ANY_PRECISION, check.id, "skipped", why))
            continue
        try:
            check.runs.run(ctx)
        except CheckSkipped as skip:
            records.append(_record(ANY_PRECISION, check.id, "skipped", str(skip)))
        except CheckFailed as failure:
            records.append(_record(ANY_PRECISION, check.id, "failed", str(failure)))
        except Exception as error:
            records.append(_record(ANY_PRECISION, check.id, "failed",
                                   f"the check raised {type(error).__name__}: {error}\n"
                                   f"{traceback.format_exc(limit=6)}"))
        else:
            records.append(_record(ANY_PRECISION, check.id, "passed"))
    return records


def drive(args: argparse.Namespace) -> list[dict[str, str]]:
    from interlock.connector.registry import strategy_specs

    precisions = args.precisions.split(",")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec = strategy_specs()[args.strategy]
    os.environ.setdefault(DRIVER_ENV, str(os.getpid()))
    environ_before = dict(os.environ)
    strategy = _resolve(args, precisions[0], args.world_size)
    if hasattr(strategy, "timeout"):
        strategy.timeout = datetime.timedelta(seconds=MAIN_TIMEOUT_S)

    records: list[dict[str, str]] = []
    crash: str | None = None
    # a module handed to the ranks through launch() (launch_arguments): it must reach
    # every rank as a private copy and come back untouched
    passed = reference.model()
    passed_before = {k: v.clone() for k, v in passed.state_dict().items()}
    returned: Any = None
    try:
        returned = strategy.launch(run_rank_checks, args, precisions, str(workdir), passed)
    except Exception as error:
        crash = f"{type(error).__name__}: {error}"[:4000]
    records += _collect(workdir, args.world_size, crash)
    ctx = LaunchContext(
        strategy=strategy, spec=spec, world_size=args.world_size, workdir=workdir,
        resolve=lambda precision, devices: _resolve(args, precision, devices),
        resolve_layout=lambda precision, devices, layout: _resolve(args, precision, devices,
                                                                   layout),
        returned=returned, crash=crash, environ_before=environ_before, passed=passed,
        passed_before=passed_before)
    _then_in_driver(records, ctx)
    records += _not_run(records, precisions,
                        f"a rank crashed before reaching it: {crash}" if crash
                        else "the launch ended before reaching it")
    records += run_driver_checks(ctx)
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
    temp.write_text(json.dumps(records, indent=1))
    temp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
