"""The checks that run in the launching process, after the launch that ran the rank
checks: what ``launch`` returns, launching again, a failing rank, a rank that never
arrives, a checkpoint loaded at another world size, and training that survives a
fault through ``launch(max_restarts=1)``.

Each takes a :class:`LaunchContext` and raises :class:`CheckFailed` or
:class:`CheckSkipped` as the rank checks do. Several launch the strategy again, with
one of the small functions below as every rank's work. Under the script launcher, the
ranks of such a launch re-run the driver up to it, so the driver runs these checks in
the table's order whatever happens, and decides whether each applies from the table
alone.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interlock.conformance import faults, reference
from interlock.conformance.checks import (
    DRIVER_ENV,
    IN_DRIVER_MARK,
    CheckFailed,
    CheckSkipped,
    full,
)
from interlock.engine.registry import registered
from interlock.engine.tables import LauncherRow
from interlock.strategies.sharding import in_shared_memory

if TYPE_CHECKING:
    from interlock.engine.specs import StrategySpec

#: how long failure propagation may take before the check fails
FAILURE_BOUND_S = 60.0
#: the longest process-group timeout the collective_timeout and survives_hang checks
#: set: long enough for the ranks of a re-run script to start and meet
TIMEOUT_S = 10.0
#: the shortest such timeout, whatever the main launch measured
MIN_TIMEOUT_S = 4.0
#: the timeout is this many times the slowest rank's setup in the main launch
SETUP_MARGIN = 3.0
#: where each survives_* check injects its fault: kill, raise and hang between two
#: checkpoints (the restart resumes from step 4), kill_during_save in the save of step
#: 4 (the restart resumes from step 2, the checkpoint before it)
FAULT_STEPS = {"kill": 5, "raise_in_backward": 5, "hang": 5, "kill_during_save": 3}


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchContext:
    """What a check running in the launching process knows.

    Attributes:
        strategy: the strategy the rank checks were launched with.
        spec: its spec.
        world_size: the ranks each launch starts.
        workdir: a directory for this launch's files.
        resolve: a fresh strategy for (precision, world size), resolved as a user would.
        resolve_layout: the same with a ``parallelism=`` flag (the mesh checks).
        returned: what the launch that ran the rank checks returned.
        crash: what that launch raised, or None.
        environ_before: the launching process's environment before that launch.
        passed: the module passed to that launch as an argument (launch_arguments).
        passed_before: its state before the launch.
    """

    strategy: Any
    spec: StrategySpec
    world_size: int
    workdir: Path
    resolve: Callable[[str, int], Any]
    resolve_layout: Callable[[str, int, Any], Any]
    returned: Any = None
    crash: str | None = None
    environ_before: dict[str, str]
    passed: torch.nn.Module
    passed_before: dict[str, torch.Tensor]
    setup_seconds: float | None = None


def suite_timeout(ctx: LaunchContext, measured: float | None = None) -> float:
    """The process-group timeout of the checks that wait one out: long enough for the
    ranks to start and meet (``SETUP_MARGIN`` times what the slowest rank of the main
    launch took from the driver's start to its first check or, in a driver without a
    main launch, ``measured``: the seconds a whole launch of the same strategy took),
    no shorter than ``MIN_TIMEOUT_S`` and no longer than ``TIMEOUT_S``. Forked ranks
    start in a fraction of a second; ranks that import torch afresh take seconds."""
    setup = ctx.setup_seconds if ctx.setup_seconds is not None else measured
    if setup is None:
        return TIMEOUT_S
    return min(TIMEOUT_S, max(MIN_TIMEOUT_S, SETUP_MARGIN * setup))


# ------------------------------------------------------------------ the checks


def check_caller_module(ctx: LaunchContext) -> None:
    """launch_arguments, in the launching process: launch() must not leave the caller's
    module in shared memory, nor change it when no rank ran in this process (ranks in
    new processes get copies; a rank running here trains the caller's object, as a
    function call does)."""
    problems = []
    # a rank that ran here has set the caller's module up (sharded it, maybe)
    in_driver = (ctx.workdir / IN_DRIVER_MARK).exists()
    changed = [] if in_driver else [k for k, v in ctx.passed.state_dict().items()
                                    if not torch.equal(v, ctx.passed_before[k])]
    if changed:
        problems.append(f"the caller's module changed during launch(): {changed}")
    shared = [n for n, p in ctx.passed.named_parameters() if in_shared_memory(p)]
    if shared:
        problems.append(f"launch() left the caller's parameters {shared} in shared memory")
    if problems:
        raise CheckFailed("; ".join(problems))


def check_launch_result(ctx: LaunchContext) -> None:
    """launch must hand back rank 0's result: every rank's function returned its rank."""
    if ctx.crash is not None:
        raise CheckFailed(f"launch raised instead of returning rank 0's result: {ctx.crash}")
    returned = ctx.returned
    if isinstance(returned, int) and not isinstance(returned, bool) and returned == 0:
        return
    raise CheckFailed(f"each rank's function returned its global rank, and launch returned "
                      f"{returned!r}; expected rank 0's result, 0")


def check_relaunch(ctx: LaunchContext) -> None:
    """Nothing is left behind by the first launch, and a second one works."""
    import torch.distributed as dist

    problems = []
    if dist.is_initialized():
        problems.append("a process group still exists in the launching process")
    # torch's compiler stack sets its cache locations on first import: not the strategy's
    changed = sorted(k for k in set(os.environ) | set(ctx.environ_before)
                     if os.environ.get(k) != ctx.environ_before.get(k)
                     and not k.startswith(("TORCHINDUCTOR_", "TRITON_")))
    if changed:
        problems.append(f"launch changed the launching process's environment: {changed}")
    pid_dir = ctx.workdir / "pids-relaunch"
    pid_dir.mkdir(exist_ok=True)
    try:
        ranks = ctx.strategy.launch(_places, str(pid_dir))
        if sorted(ranks) != list(range(ctx.world_size)):
            problems.append(f"the second launch ran ranks {ranks}")
    except Exception as error:
        problems.append(f"the second launch raised {type(error).__name__}: {error}")
    if ctx.world_size > 1:
        survivors = _wait_gone(pid_dir, 10)
        if survivors:
            problems.append(f"worker processes {survivors} outlived the second launch")
    if problems:
        raise CheckFailed("; ".join(problems))


def check_failure_propagation(ctx: LaunchContext) -> None:
    """A rank that raises makes launch raise, soon, naming it, with no survivor."""
    pid_dir = ctx.workdir / "pids-failure"
    pid_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        ctx.strategy.launch(_fail_on_last, str(pid_dir), ctx.world_size)
    except Exception as error:
        elapsed = time.monotonic() - started
        text = str(error)
        last = ctx.world_size - 1
        problems = []
        if f"rank {last}" not in text or "deliberate failure" not in text:
            problems.append(f"the error does not name rank {last} and its exception: "
                            f"{type(error).__name__}: {text[:500]}")
        if elapsed > FAILURE_BOUND_S:
            problems.append(f"it took {elapsed:.1f}s (bound {FAILURE_BOUND_S:.0f}s)")
        _raise_problems(problems, _wait_gone(pid_dir, 10))
        return
    raise CheckFailed("a rank raised but launch returned normally")


def check_collective_timeout(ctx: LaunchContext) -> None:
    """A rank that never reaches a collective turns into an error, not a hang."""
    strategy = ctx.strategy
    if not hasattr(strategy, "timeout"):
        raise CheckFailed("the strategy declares 'timeout' but has no timeout attribute")
    timeout = suite_timeout(ctx)
    strategy.timeout = datetime.timedelta(seconds=timeout)
    pid_dir = ctx.workdir / "pids-timeout"
    pid_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        strategy.launch(_never_arrives, str(pid_dir), ctx.world_size)
    except Exception as error:
        elapsed = time.monotonic() - started
        bound = timeout + FAILURE_BOUND_S
        survivors = _wait_gone(pid_dir, 10)
        problems = []
        arrived = len(list(pid_dir.glob("*.pid")))
        if arrived < ctx.world_size:
            problems.append(f"only {arrived} of {ctx.world_size} ranks got past setup, so "
                            f"the error ({type(error).__name__}: {str(error)[:300]}) is not "
                            "the collective's timeout")
        if elapsed > bound:
            problems.append(f"the error came after {elapsed:.1f}s, bound {bound:.0f}s")
        _raise_problems(problems, survivors)
        return
    raise CheckFailed("a rank never reached the barrier, yet launch returned normally")


def check_resharding(ctx: LaunchContext) -> None:
    """A checkpoint saved at world size 2 loads at world size 1, exactly."""
    path = str(ctx.workdir / "reshard.ckpt")
    try:
        saved = ctx.resolve("32-true", 2).launch(_save_for_resharding, path)
        loaded = ctx.resolve("32-true", 1).launch(_load_for_resharding, path)
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
        raise CheckFailed(f"saved at world size 2, loaded at 1: {type(error).__name__}: "
                          f"{str(error)[:2000]}") from None


#: the uninterrupted run each launch context compares with, computed by the first
#: survives_* check that runs and kept in memory, not in a file: under the script
#: launcher every rank re-runs the driver, and each must make the same launches
#: whatever the driver has written meanwhile
_REFERENCES: dict[tuple[str, int, str], dict[str, Any] | str] = {}
#: the seconds each of those uninterrupted launches took, start to finish: in the
#: restarts driver, which has no main launch, what sizes survives_hang's timeout
_REFERENCE_SECONDS: dict[tuple[str, int, str], float] = {}


def _fault_strategy(ctx: LaunchContext, timeout_s: float) -> Any:
    if "32-true" not in ctx.spec.precisions:
        raise CheckSkipped("the fault checks train in 32-true, which the strategy does "
                           "not declare")
    strategy = ctx.resolve("32-true", ctx.world_size)
    if hasattr(strategy, "timeout"):
        strategy.timeout = datetime.timedelta(seconds=timeout_s)
    return strategy


def _fault_reference(ctx: LaunchContext) -> dict[str, Any]:
    key = (ctx.spec.name, ctx.world_size, str(ctx.workdir))
    if key not in _REFERENCES:
        directory = ctx.workdir / "faults" / "reference"
        if _is_driver():
            faults.prepare(directory)
        try:
            started = time.monotonic()
            result = _fault_strategy(ctx, FAILURE_BOUND_S).launch(faults.train, str(directory))
            _REFERENCE_SECONDS[key] = time.monotonic() - started
            _REFERENCES[key] = faults.final_state(result)
        except CheckSkipped:
            raise
        except Exception as error:
            _REFERENCES[key] = f"{type(error).__name__}: {str(error)[:1500]}"
    found = _REFERENCES[key]
    if isinstance(found, str):
        raise CheckFailed(f"the uninterrupted run, the reference, failed: {found}")
    return found


def _fault_rank(strategy: Any, kind: str, world_size: int) -> int:
    """Where the fault strikes: the last rank, except that a kill during a save
    strikes rank 0, the one that writes a full checkpoint, wherever rank 0 is a
    process the launcher started (not this one, as under the script launcher)."""
    if kind != "kill_during_save":
        return world_size - 1
    launcher = getattr(strategy, "launcher", None)
    row = registered(LauncherRow).get(getattr(launcher, "name", ""))
    return 0 if row is not None and row.launches_single else world_size - 1


def check_survives(kind: str, ctx: LaunchContext) -> None:
    """The survives_* check of ``kind`` (`table.CHECKS` binds it to each): train with
    ``kind`` injected at the last rank (the script launcher's rank 0 is
    this process) and one restart allowed; the result must equal the uninterrupted
    run's bit for bit, after exactly one restart, with no worker left alive."""
    if kind == "hang" and "timeout" not in ctx.spec.capabilities:
        raise CheckSkipped("a hung rank becomes an error only through the process "
                           "group's timeout: the strategy does not declare 'timeout'")
    want = _fault_reference(ctx)
    measured = _REFERENCE_SECONDS.get((ctx.spec.name, ctx.world_size, str(ctx.workdir)))
    strategy = _fault_strategy(ctx, suite_timeout(ctx, measured) if kind == "hang"
                               else FAILURE_BOUND_S)
    fault = faults.Fault(kind=kind, rank=_fault_rank(strategy, kind, ctx.world_size),
                         step=FAULT_STEPS[kind])
    directory = ctx.workdir / "faults" / kind
    if _is_driver():
        faults.prepare(directory)
    from interlock.strategies.restarts import RestartPolicy

    described = f"{kind} at rank {fault.rank}, step {fault.step}"
    try:
        result = strategy.launch(faults.train, str(directory), fault,
                                 restart_policy=RestartPolicy(max_restarts=1, backoff_s=0))
        got = faults.final_state(result)
    except Exception as error:
        survivors = _wait_gone(directory, 10)
        raise CheckFailed(f"with {described} and max_restarts=1, launch raised "
                          f"{type(error).__name__}: {str(error)[:1500]}"
                          + (f"; worker processes {survivors} are still alive"
                             if survivors else "")) from None
    problems = faults.restart_problems(fault, result, faults.outcome(directory))
    wrong = faults.differences(got, want)
    if wrong:
        problems.append(f"{len(wrong)} entries differ from the uninterrupted run: "
                        + "; ".join(wrong[:8]))
    _raise_problems(problems, _wait_gone(directory, 10), f"with {described}: ")


# ------------------------------------------------------------------ what their ranks run


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


# ------------------------------------------------------------------ worker processes


def _is_driver() -> bool:
    """Whether this is the driver, not one of the ranks its script launcher re-ran
    (those run the driver's code up to their own launch and exit there)."""
    return os.environ.get(DRIVER_ENV) == str(os.getpid())


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


def _raise_problems(problems: list[str], survivors: list[int], prefix: str = "") -> None:
    """CheckFailed naming the ``problems`` and the ``survivors`` (workers still alive)."""
    if survivors:
        problems.append(f"worker processes {survivors} are still alive")
    if problems:
        raise CheckFailed(prefix + "; ".join(problems)) from None


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
