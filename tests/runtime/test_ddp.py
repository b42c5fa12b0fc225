"""DDP over real gloo processes: parity with one process, collectives, checkpoints, failures.

Each test launches real ranks (fork, spawn or forkserver) from this process; the script
launcher is exercised through examples/train.py in test_train_script.py.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import workloads
from harness import close

import interlock
from interlock.strategies.ddp import DDPStrategy
from interlock.strategies.launchers import RankFailedError

LAUNCH_STYLES = ["ddp_fork", "ddp_spawn", "ddp_forkserver"]


def ddp(name: str = "ddp_fork", devices: int = 2, precision: str = "32-true",
        timeout: float | None = None) -> DDPStrategy:
    strategy = interlock.resolve(accelerator="cpu", devices=devices, strategy=name,
                                 precision=precision, machine=interlock.Machine())
    assert isinstance(strategy, DDPStrategy)
    if timeout is not None:
        strategy.timeout = datetime.timedelta(seconds=timeout)
    return strategy


def assert_no_survivors(pid_dir: Path) -> None:
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert pids, "the ranks recorded no pids"
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    assert not alive, f"rank processes still alive after launch returned: {alive}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", LAUNCH_STYLES)
def test_two_ranks_match_one_process_on_the_full_batch(name: str) -> None:
    result = ddp(name).launch(workloads.train, 4)
    expected = workloads.baseline(4)
    for key, value in expected.items():
        close(result[key], value, f"{name} {key}")


@pytest.mark.timeout(60)
def test_no_backward_sync_accumulation_equals_the_large_batch() -> None:
    result = ddp().launch(workloads.train, 3, 2)
    expected = workloads.baseline(3, accumulate=2)
    for key, value in expected.items():
        close(result[key], value, f"{key}")


@pytest.mark.timeout(60)
def test_no_backward_sync_really_skips_the_all_reduce() -> None:
    """Without the final synchronised backward, ranks keep different gradients."""

    result = ddp().launch(_grads_without_sync)
    rank0, rank1 = result["ranks"]
    assert not torch.equal(rank0, rank1), "gradients were synchronised inside no_backward_sync"


def _grads_without_sync(strategy: Any) -> dict[str, Any]:
    net = strategy.setup_module(workloads.model())
    x, y = workloads.batch(0)
    x = x.chunk(2)[strategy.global_rank]
    y = y.chunk(2)[strategy.global_rank]
    with strategy.no_backward_sync(net):
        strategy.backward(torch.nn.functional.mse_loss(net(x), y), net)
    grad = next(net.parameters()).grad.clone()
    return {"ranks": strategy.all_gather(grad)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true"])
def test_parity_under_other_precisions(precision: str) -> None:
    two = ddp(precision=precision).launch(workloads.train, 3)
    one = interlock.resolve(accelerator="cpu", devices=1, strategy="single_device",
                            precision=precision, machine=interlock.Machine())
    single = one.launch(workloads.train, 3)
    for key, value in single.items():
        close(two[key], value, f"{precision} {key}", rtol=2e-2, atol=2e-3)


@pytest.mark.timeout(60)
def test_ranks_devices_and_world_are_consistent() -> None:
    ranks = ddp("ddp_spawn").launch(workloads.places)["ranks"]
    assert [r["global_rank"] for r in ranks] == [0, 1]
    assert [r["local_rank"] for r in ranks] == [0, 1]
    assert {r["node_rank"] for r in ranks} == {0}
    assert {r["world_size"] for r in ranks} == {2}
    assert [r["is_global_zero"] for r in ranks] == [True, False]
    assert {r["device"] for r in ranks} == {"cpu"}
    assert len({r["pid"] for r in ranks}) == 2 and os.getpid() not in {r["pid"] for r in ranks}


@pytest.mark.timeout(90)
def test_collectives_match_a_single_process_reference() -> None:
    views = ddp().launch(workloads.collectives)["ranks"]
    w = 2
    f = [torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r for r in range(w)]
    i = [torch.arange(4, dtype=torch.int64) * (r + 1) for r in range(w)]
    s = [torch.tensor(float(r + 1)) for r in range(w)]
    stacked = [torch.stack([torch.full((2,), float(10 * r + j)) for j in range(w)])
               for r in range(w)]
    reducers: dict[str, Callable[[list[torch.Tensor]], torch.Tensor]] = {
        "sum": lambda t: torch.stack(t).sum(0),
        "max": lambda t: torch.stack(t).amax(0),
        "min": lambda t: torch.stack(t).amin(0),
        "mean": lambda t: torch.stack(t).to(torch.float32).mean(0),
    }
    for rank, out in enumerate(views):
        for op, reduce in reducers.items():
            for kind, inputs in (("float", f), ("int", i), ("scalar", s),
                                 ("noncontig", [t.t() for t in f])):
                close(out[f"all_reduce_{op}_{kind}"], reduce(inputs),
                      f"rank {rank} all_reduce {op} {kind}")
        assert out["input_untouched"], f"rank {rank}: all_reduce modified its input"
        close(out["all_gather"], torch.stack(f), f"rank {rank} all_gather")
        close(out["all_gather_scalar"], torch.stack(s), f"rank {rank} all_gather_scalar")
        close(out["all_gather_noncontig"], torch.stack([t.t() for t in f]),
              f"rank {rank} all_gather_noncontig")
        close(out["broadcast"], f[1], f"rank {rank} broadcast")
        close(out["reduce"], f[0] + f[1] if rank == 0 else f[rank], f"rank {rank} reduce")
        if rank == 0:
            close(out["gather"], torch.stack(f), f"rank {rank} gather")
        else:
            assert out["gather"] is None
        close(out["scatter"], stacked[1][rank], f"rank {rank} scatter")
        close(out["reduce_scatter"], (stacked[0] + stacked[1])[rank],
              f"rank {rank} reduce_scatter")
        close(out["all_to_all"], torch.stack([stacked[j][rank] for j in range(w)]),
              f"rank {rank} all_to_all")
        assert out["all_gather_object"] == [{"rank": 0}, {"rank": 1}]
        assert out["broadcast_object"] == {"from": 1}
        assert out["gather_object"] == ([0, 2] if rank == 0 else None)
        assert out["scatter_object"] == f"to{rank}"
        close(out["strategy_all_reduce_mean"], (f[0] + f[1]) / 2,
              f"rank {rank} strategy.all_reduce mean")
        assert out["strategy_broadcast_object"] == {"r": 1}
        assert (out["all_true"], out["all_mixed"], out["any_mixed"], out["any_false"]) == (
            True, False, True, False), f"rank {rank}: reduce_boolean_decision is wrong"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_checkpoint_round_trip_restores_model_optimizer_and_scaler(
    tmp_path: Path, precision: str
) -> None:
    path = tmp_path / "ckpt" / "last.pt"
    out = ddp(precision=precision).launch(workloads.checkpoint_round_trip, str(path), 3)
    assert out["params_equal"], "model parameters differ after loading"
    assert out["optimizer_equal"], "optimizer state differs after loading"
    assert out["precision_state_after"] == out["precision_state"]
    if precision == "16-mixed":
        assert out["precision_state"]["scaler"]["scale"] > 0, out["precision_state"]
    assert out["epoch"] == 3 and out["rest"] == {"tag": "x"}
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"], "temporary files remain"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["ddp_fork", "ddp_spawn"])
def test_a_failing_rank_is_named_quickly_and_leaves_no_process(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with pytest.raises(RankFailedError) as info:
        ddp(name).launch(workloads.fail_on, 1, str(tmp_path))
    assert info.value.rank == 1, str(info.value)
    assert "deliberate failure on rank 1" in str(info.value)
    assert "Traceback" in str(info.value)
    # how fast is measured in benchmarks/, not asserted here: the timeout bounds it
    assert_no_survivors(tmp_path)
    # nor a file: torch's spawn writes a failed rank's traceback to a temp file of its own
    assert list(temp.iterdir()) == [], "the launch left files in the temp directory"


@pytest.mark.timeout(60)
def test_a_rank_that_never_arrives_times_out_instead_of_hanging(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        ddp("ddp_fork", timeout=3).launch(workloads.never_arrives, str(tmp_path))
    elapsed = time.monotonic() - started
    assert info.value.rank == 0, str(info.value)
    assert elapsed < 30, f"the hang took {elapsed:.1f}s to become an error"
    assert_no_survivors(tmp_path)


@pytest.mark.timeout(90)
def test_a_second_launch_in_the_same_process_works() -> None:
    before = dict(os.environ)
    first = ddp("ddp_fork").launch(workloads.places)
    second = ddp("ddp_fork").launch(workloads.places)
    assert [r["global_rank"] for r in first["ranks"]] == [0, 1]
    assert [r["global_rank"] for r in second["ranks"]] == [0, 1]
    assert not dist.is_initialized(), "the launching process was left with a process group"
    assert dict(os.environ) == before, "launch changed the launching process's environment"


@pytest.mark.timeout(60)
def test_teardown_is_idempotent_and_restores_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "0")
    strategy = interlock.resolve(accelerator="cpu", devices=1, strategy="ddp")
    assert strategy.plan is not None and strategy.plan.launcher == "external"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    # a torchrun-like single process: env:// rendezvous on a port we bind ourselves
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # torchrun's agent serves it
    strategy.setup_environment()
    assert dist.is_initialized() and strategy.world_size == 1
    strategy.teardown()
    strategy.teardown()
    assert not dist.is_initialized()
    assert os.environ["MASTER_PORT"] == str(store.port)


def test_fork_after_cuda_is_refused_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.strategies.launchers import LaunchError

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(LaunchError, match="CUDA was already initialised"):
        ddp("ddp_fork").launch(workloads.places)


@pytest.mark.timeout(90)
def test_a_large_result_comes_back_without_blocking() -> None:
    result = ddp("ddp_spawn").launch(workloads.large_result)
    assert result.shape == (1_000_000,) and float(result.sum()) == 1_000_000.0


def _gloo_group_in_a_cycle() -> dict[str, Any]:
    """A one-rank gloo process group (it runs worker threads) held by a dict that
    refers to itself, so that only a garbage collection can free it."""
    holder: dict[str, Any] = {"group": dist.ProcessGroupGloo(
        dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))}
    holder["self"] = holder
    return holder


#: a fresh interpreter: a checker registered at exit before the collective's hook
#: (exit hooks run last first), then a gloo group left in a reference cycle, as a
#: device mesh leaves its groups after teardown
_EXIT_SCRIPT = """
import atexit, datetime, os, sys
import torch.distributed as dist
from interlock.strategies.collectives import TorchCollective

def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip()
             for t in os.listdir("/proc/self/task")]
    print("gloo threads at exit:", names.count("pt_gloo_runloop"), flush=True)

atexit.register(gloo_threads)
collective = TorchCollective()
collective.setup(backend="gloo", rank=0, world_size=1, store=dist.HashStore())
holder = {"group": dist.ProcessGroupGloo(dist.HashStore(), 0, 1,
                                         datetime.timedelta(seconds=30))}
holder["self"] = holder
del holder
collective.teardown()
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                    reason="Linux only: counts the process's threads in /proc/self/task")
@pytest.mark.timeout(60)
def test_process_groups_in_a_cycle_are_freed_before_the_interpreter_shuts_down() -> None:
    """A rank whose groups were left to the cyclic collector met them in the
    interpreter's last collection, during shutdown, where a gloo thread that still held
    a tensor could not take the GIL and aborted the process (a rank that finished its
    work was reported as killed by a signal): they are collected at exit instead."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True,
                          text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gloo threads at exit: 0" in done.stdout, done.stdout + done.stderr[-2000:]


#: what the launching process keeps alive across a launch (see the test below)
_KEPT: dict[str, Any] = {}


def _collect_garbage(strategy: Any) -> bool:
    _KEPT.clear()  # this rank's copy of the cycle becomes garbage here
    gc.collect()
    return True


@pytest.mark.timeout(60)
def test_forked_ranks_never_finalise_what_they_inherited() -> None:
    """A gloo group's destructor joins its threads, which a forked child does not have:
    a rank whose garbage collection met an inherited group waited for ever (DeepSpeed's
    ZeRO-3 setup calls gc.collect()). The launching process collects its own garbage
    before it forks, and the ranks never finalise what they inherited, whether it was
    garbage before the fork or became garbage in the rank."""
    _gloo_group_in_a_cycle()  # garbage in this process before the launch
    _KEPT["cycle"] = _gloo_group_in_a_cycle()  # alive here, dropped in each rank
    try:
        assert ddp("ddp_fork").launch(_collect_garbage) is True
    finally:
        _KEPT.clear()
        gc.collect()


def _blocked_signals(strategy: Any) -> set[int]:
    return {int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])}


@pytest.mark.timeout(90)
def test_fork_holds_interrupts_while_forking_and_the_ranks_get_them_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT or SIGTERM handled by a child in the bytecodes between ``fork()`` and
    multiprocessing's ``try`` would send that child back into the caller's code (a
    second copy of the script): the parent holds both signals back while it forks, and
    each rank releases them before the training function runs."""
    import torch.multiprocessing as torch_mp

    held = {int(signal.SIGINT), int(signal.SIGTERM)}
    seen: list[set[int]] = []
    real = torch_mp.start_processes

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append({int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])})
        return real(*args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(torch_mp, "start_processes", recording)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    in_ranks = ddp("ddp_fork").launch(_blocked_signals)
    assert seen and held <= seen[0], f"fork ran with only {seen} blocked"
    assert not held & in_ranks, f"rank 0 runs the training function with {in_ranks} blocked"
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before, "the mask was not restored"


def test_the_forkserver_preloads_torch_and_interlock_but_not_the_users_modules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forkserver worker imported torch afresh (seconds of CPU each): Python
    3.11's server never imports its default preload, ``__main__``. The launcher now
    has the server import torch and the interlock modules the launch names, keeps
    what the user preloaded, and never imports the user's own modules there."""
    from multiprocessing import forkserver

    from interlock.strategies import base
    from interlock.strategies.launchers import multiprocessing as launcher

    server = forkserver.ForkServer()  # a server of its own, never started
    server.set_forkserver_preload(["__main__", "users_own_preload"])
    monkeypatch.setattr(forkserver, "_forkserver", server)
    strategy = ddp("ddp_forkserver")
    chosen = launcher.preload_forkserver(base._run_attempt, (0, strategy, workloads.places))
    assert chosen[:2] == ("__main__", "users_own_preload")
    assert {"torch", "torch.distributed", launcher.__name__, base.__name__,
            type(strategy).__module__} <= set(chosen)
    assert workloads.places.__module__ not in chosen, "a user's module was preloaded"
    state = vars(server)  # the server's private fields, which typeshed leaves out
    assert state["_preload_modules"] == list(chosen)
    state["_forkserver_pid"] = os.getpid()  # running: its preload can no longer change
    assert launcher.preload_forkserver(base._run_attempt, (0, strategy)) == ()


@pytest.mark.timeout(90)
def test_forkserver_workers_are_forked_from_a_server_that_holds_torch(
        tmp_path: Path) -> None:
    """End to end, in a fresh interpreter (this one's server may already run): after a
    launch the forkserver process has torch's library mapped, so later workers fork
    with torch loaded instead of importing it."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "forkserver_preload.py"
    script.write_text(textwrap.dedent("""
        from multiprocessing import forkserver
        import interlock

        def rank(strategy):
            return strategy.global_rank

        if __name__ == "__main__":
            strategy = interlock.resolve(accelerator="cpu", devices=2,
                                         strategy="ddp_forkserver")
            assert strategy.launch(rank) == 0
            pid = forkserver._forkserver._forkserver_pid
            with open(f"/proc/{pid}/maps") as maps:
                print("libtorch_cpu" in maps.read())
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=80, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "True", done.stdout
