"""The conformance driver: one process per (strategy, runner, world size) launch.

Run as ``python -m interlock.conformance.driver --strategy NAME ... --out FILE``. It
resolves the strategy as a user would, launches it with the strategy's own launcher
(the script launcher re-runs this module for the other ranks), runs every rank check
for every precision inside the ranks, then the driver checks around the launches, and
writes one JSON record per (precision, check) to ``--out``.

Each rank appends its results to its own file as each check finishes, so a rank that
crashes still reports the checks it completed; the check it was running is failed
with the crash, and the ones after it are reported as not run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from interlock.conformance import reference
from interlock.conformance.checks import (
    ANY_PRECISION,
    CHECKS,
    DRIVER_ENV,
    IN_DRIVER_MARK,
    LAST_RANK_CHECKS,
    RANK_CHECKS,
    CheckFailed,
    CheckSkipped,
    RankContext,
    full,
)
from interlock.strategies.sharding import in_shared_memory

#: how long failure propagation may take before the check fails
FAILURE_BOUND_S = 60.0
#: the process-group timeout of the main launch: a check that deadlocks the ranks
#: fails after this instead of after the strategy's default (30 minutes)
MAIN_TIMEOUT_S = 120.0
#: the process-group timeout the collective_timeout check sets: long enough for the
#: ranks of a re-run script to start and meet, short enough to wait for
TIMEOUT_S = 10.0


def _is_driver() -> bool:
    """Whether this is the driver, not one of the ranks its script launcher re-ran
    (those run the driver's code up to their own launch and exit there)."""
    return os.environ.get(DRIVER_ENV) == str(os.getpid())


def _record(precision: str, check: str, status: str, message: str = "") -> dict[str, str]:
    return {"precision": precision, "check": check, "status": status, "message": message}


def _resolve(args: argparse.Namespace, precision: str, devices: int) -> Any:
    import interlock

    return _prepare(interlock.resolve(strategy=args.strategy, accelerator=args.accelerator,
                                      devices=devices, precision=precision))


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
    """Every rank check, for every precision, then the checks that end the strategy;
    results appended to this rank's file. Returns this rank's global rank (what the
    launch_result check expects launch to hand back from rank 0)."""
    from interlock.connector.registry import strategy_specs

    spec = strategy_specs()[args.strategy]
    rank = strategy.global_rank
    out = Path(workdir, f"rank-{rank}.jsonl")
    plan_for = _plan_for(args, args.world_size)
    for index, precision in enumerate(precisions):
        if index:
            strategy.complete(plan_for(precision))  # the same strategy, another precision
            _prepare(strategy)
        for check_id, fn in RANK_CHECKS.items():
            once = next(c for c in CHECKS if c.id == check_id).where == "rank-once"
            if once and index:
                continue
            check = next(c for c in CHECKS if c.id == check_id)
            label = ANY_PRECISION if once else precision
            _mark(out, _record(label, check_id, "running"))
            ctx = RankContext(strategy=strategy, spec=spec, precision=precision,
                              accelerator=args.accelerator, world_size=args.world_size,
                              workdir=Path(workdir), plan_for=plan_for, passed=passed)
            if check.needs is not None and check.needs not in spec.capabilities:
                result = _record(label, check_id, "skipped",
                                 f"the strategy does not declare {check.needs!r}")
            else:
                result = _run_one(fn, ctx, label, check_id)
            _mark(out, result)
            # the ranks leave a check together, so one that failed on a single rank
            # does not leave the others waiting in the next check's collectives
            strategy.barrier()
    # teardown releases the process group: it comes last, and no barrier follows it;
    # each result is in this rank's file before the next check starts
    for check_id, fn in LAST_RANK_CHECKS.items():
        _mark(out, _record(ANY_PRECISION, check_id, "running"))
        ctx = RankContext(strategy=strategy, spec=spec, precision=precisions[-1],
                          accelerator=args.accelerator, world_size=args.world_size,
                          workdir=Path(workdir), plan_for=plan_for, passed=passed)
        _mark(out, _run_one(fn, ctx, ANY_PRECISION, check_id))
    return int(rank)


def _run_one(fn: Any, ctx: RankContext, label: str, check_id: str) -> dict[str, str]:
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


def _places(strategy: Any, pid_dir: str) -> list[int]:
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    ranks: list[int] = strategy.collective.all_gather_object(strategy.global_rank)
    return ranks


def _fail_on_last(strategy: Any, pid_dir: str, world_size: int) -> None:
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    strategy.barrier()
    if strategy.global_rank == world_size - 1:
        raise RuntimeError(f"deliberate failure on rank {strategy.global_rank}")
    strategy.barrier()
    time.sleep(300)


def _never_arrives(strategy: Any, pid_dir: str, world_size: int) -> None:
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    if strategy.global_rank == world_size - 1:
        time.sleep(300)
    strategy.barrier()


def _save_for_resharding(strategy: Any, path: str) -> dict[str, Any]:
    net = reference.model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    module, (opt,) = strategy.setup_module_and_optimizers(net, [opt])
    for step in range(2):
        x, y = reference.batch(step)
        share = x.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]
        target = y.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]
        x, y = strategy.batch_to_device((share, target))
        strategy.backward(torch.nn.functional.mse_loss(module(x).float(), y), module)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    strategy.save_checkpoint(path, {"model": module, "optimizer": opt})
    return {"params": full(module.state_dict()), "optimizer": full(opt.state_dict())}


def _load_for_resharding(strategy: Any, path: str) -> dict[str, Any]:
    net = reference.other_model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    module, (opt,) = strategy.setup_module_and_optimizers(net, [opt])
    # Adam has no state until it steps: take one step so that state exists to load into
    strategy.load_checkpoint(path, {"model": module, "optimizer": opt})
    return {"params": full(module.state_dict()), "optimizer": full(opt.state_dict())}


# ------------------------------------------------------------------ the launching process


def _alive(pid_dir: Path) -> list[int]:
    """Rank processes that recorded their pid and still run (this process, which is
    rank 0 under the script launcher, excepted)."""
    alive = []
    for file in pid_dir.glob("*.pid"):
        pid = int(file.read_text())
        if str(pid) == os.environ.get(DRIVER_ENV):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def _wait_gone(pid_dir: Path, seconds: float) -> list[int]:
    if not _is_driver():
        return []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = _alive(pid_dir)
        if not alive:
            return []
        time.sleep(0.1)
    return _alive(pid_dir)


def _collect(workdir: Path, world_size: int, crash: str | None) -> list[dict[str, str]]:
    """Merge the ranks' files: a check fails if it failed on any rank."""
    order = [(c.id, c.where) for c in CHECKS if c.where in ("rank", "rank-once")]
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
    del order
    return list(merged.values())


def _not_run(records: list[dict[str, str]], precisions: list[str],
             reason: str) -> list[dict[str, str]]:
    done = {(r["precision"], r["check"]) for r in records}
    missing = []
    for check in CHECKS:
        if check.where not in ("rank", "rank-once", "rank-last"):
            continue
        labels = precisions if check.where == "rank" else [ANY_PRECISION]
        missing += [_record(p, check.id, "not run", reason)
                    for p in labels if (p, check.id) not in done]
    return missing


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
    _check_caller_module(records, passed, passed_before,
                         in_driver=(workdir / IN_DRIVER_MARK).exists())
    records += _not_run(records, precisions,
                        f"a rank crashed before reaching it: {crash}" if crash
                        else "the launch ended before reaching it")

    records.append(_launch_result(returned, crash))

    # relaunch: nothing left behind, and a second launch works
    import torch.distributed as dist

    problems = []
    if dist.is_initialized():
        problems.append("a process group still exists in the launching process")
    # torch's compiler stack sets its cache locations on first import: not the strategy's
    changed = sorted(k for k in set(os.environ) | set(environ_before)
                     if os.environ.get(k) != environ_before.get(k)
                     and not k.startswith(("TORCHINDUCTOR_", "TRITON_")))
    if changed:
        problems.append(f"launch changed the launching process's environment: {changed}")
    pid_dir = workdir / "pids-relaunch"
    pid_dir.mkdir(exist_ok=True)
    try:
        ranks = strategy.launch(_places, str(pid_dir))
        if sorted(ranks) != list(range(args.world_size)):
            problems.append(f"the second launch ran ranks {ranks}")
    except Exception as error:
        problems.append(f"the second launch raised {type(error).__name__}: {error}")
    if args.world_size > 1:
        survivors = _wait_gone(pid_dir, 10)
        if survivors:
            problems.append(f"worker processes {survivors} outlived the second launch")
    records.append(_record(ANY_PRECISION, "relaunch", "failed" if problems else "passed",
                           "; ".join(problems)))

    records.append(_failure_propagation(strategy, args, workdir))
    records.append(_collective_timeout(strategy, args, spec, workdir))
    records.append(_resharding(args, spec, workdir))
    return records


def _launch_result(returned: Any, crash: str | None) -> dict[str, str]:
    """launch must hand back rank 0's result: every rank's function returned its rank."""
    if crash is not None:
        return _record(ANY_PRECISION, "launch_result", "failed",
                       f"launch raised instead of returning rank 0's result: {crash}")
    if isinstance(returned, int) and not isinstance(returned, bool) and returned == 0:
        return _record(ANY_PRECISION, "launch_result", "passed")
    return _record(ANY_PRECISION, "launch_result", "failed",
                   f"each rank's function returned its global rank, and launch returned "
                   f"{returned!r}; expected rank 0's result, 0")


def _check_caller_module(records: list[dict[str, str]], passed: torch.nn.Module,
                         before: dict[str, torch.Tensor], *, in_driver: bool) -> None:
    """Fail launch_arguments if launch() left the caller's module in shared memory, or
    changed it although no rank ran in this process (ranks in new processes must get
    copies; a rank running here trains the caller's object, as a function call does)."""
    problems = []
    # a rank that ran here has set the caller's module up (sharded it, maybe)
    changed = [] if in_driver else [k for k, v in passed.state_dict().items()
                                    if not torch.equal(v, before[k])]
    if changed:
        problems.append(f"the caller's module changed during launch(): {changed}")
    shared = [n for n, p in passed.named_parameters() if in_shared_memory(p)]
    if shared:
        problems.append(f"launch() left the caller's parameters {shared} in shared memory")
    if not problems:
        return
    for record in records:
        if record["check"] == "launch_arguments":
            record["status"] = "failed"
            record["message"] = "; ".join(filter(None, [record["message"], *problems]))


def _failure_propagation(strategy: Any, args: argparse.Namespace,
                         workdir: Path) -> dict[str, str]:
    if args.world_size < 2:
        return _record(ANY_PRECISION, "failure_propagation", "skipped",
                       "needs at least 2 ranks")
    pid_dir = workdir / "pids-failure"
    pid_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        strategy.launch(_fail_on_last, str(pid_dir), args.world_size)
    except Exception as error:
        elapsed = time.monotonic() - started
        text = str(error)
        last = args.world_size - 1
        problems = []
        if f"rank {last}" not in text or "deliberate failure" not in text:
            problems.append(f"the error does not name rank {last} and its exception: "
                            f"{type(error).__name__}: {text[:500]}")
        if elapsed > FAILURE_BOUND_S:
            problems.append(f"it took {elapsed:.1f}s (bound {FAILURE_BOUND_S:.0f}s)")
        survivors = _wait_gone(pid_dir, 10)
        if survivors:
            problems.append(f"worker processes {survivors} are still alive")
        return _record(ANY_PRECISION, "failure_propagation",
                       "failed" if problems else "passed", "; ".join(problems))
    return _record(ANY_PRECISION, "failure_propagation", "failed",
                   "a rank raised but launch returned normally")


def _collective_timeout(strategy: Any, args: argparse.Namespace, spec: Any,
                        workdir: Path) -> dict[str, str]:
    if "timeout" not in spec.capabilities:
        return _record(ANY_PRECISION, "collective_timeout", "skipped",
                       "the strategy does not declare 'timeout'")
    if args.world_size < 2:
        return _record(ANY_PRECISION, "collective_timeout", "skipped", "needs at least 2 ranks")
    if not hasattr(strategy, "timeout"):
        return _record(ANY_PRECISION, "collective_timeout", "failed",
                       "the strategy declares 'timeout' but has no timeout attribute")
    strategy.timeout = datetime.timedelta(seconds=TIMEOUT_S)
    pid_dir = workdir / "pids-timeout"
    pid_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        strategy.launch(_never_arrives, str(pid_dir), args.world_size)
    except Exception as error:
        elapsed = time.monotonic() - started
        bound = TIMEOUT_S + FAILURE_BOUND_S
        survivors = _wait_gone(pid_dir, 10)
        problems = []
        arrived = len(list(pid_dir.glob("*.pid")))
        if arrived < args.world_size:
            problems.append(f"only {arrived} of {args.world_size} ranks got past setup, so the "
                            f"error ({type(error).__name__}: {str(error)[:300]}) is not the "
                            "collective's timeout")
        if elapsed > bound:
            problems.append(f"the error came after {elapsed:.1f}s, bound {bound:.0f}s")
        if survivors:
            problems.append(f"worker processes {survivors} are still alive")
        message = "; ".join(problems) or f"{type(error).__name__} after {elapsed:.1f}s"
        return _record(ANY_PRECISION, "collective_timeout",
                       "failed" if problems else "passed", message if problems else "")
    return _record(ANY_PRECISION, "collective_timeout", "failed",
                   "a rank never reached the barrier, yet launch returned normally")


def _resharding(args: argparse.Namespace, spec: Any, workdir: Path) -> dict[str, str]:
    if "resharding" not in spec.capabilities:
        return _record(ANY_PRECISION, "resharding", "skipped",
                       "the strategy does not declare 'resharding'")
    if args.world_size != 2:
        return _record(ANY_PRECISION, "resharding", "skipped",
                       "runs with world size 2 (saves at 2, loads at 1)")
    path = str(workdir / "reshard.ckpt")
    try:
        saved = _resolve(args, "32-true", 2).launch(_save_for_resharding, path)
        loaded = _resolve(args, "32-true", 1).launch(_load_for_resharding, path)
        for what, value in (("the save at world size 2", saved),
                            ("the load at world size 1", loaded)):
            # launch() must hand back rank 0's parameters: nothing to compare is a
            # failure, not a pass
            params = value.get("params") if isinstance(value, dict) else None
            if not (isinstance(params, dict) and params
                    and all(isinstance(v, torch.Tensor) for v in params.values())):
                raise CheckFailed(f"{what} returned {type(value).__name__} through "
                                  "launch(), not rank 0's parameters")
        torch.testing.assert_close(loaded, saved, rtol=0, atol=0)
    except Exception as error:
        return _record(ANY_PRECISION, "resharding", "failed",
                       f"saved at world size 2, loaded at 1: {type(error).__name__}: "
                       f"{str(error)[:2000]}")
    return _record(ANY_PRECISION, "resharding", "passed")


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
    records = drive(args)
    temp = Path(args.out + ".tmp")
    temp.write_text(json.dumps(records, indent=1))
    temp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
