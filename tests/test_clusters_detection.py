"""Cluster detection in the cases users run into: processes another launcher started,
SLURM with and without srun, torchrun inside SLURM, partly filled allocations, the
switch that turns detection off, and local ranks with no device. Ends with a real job
of two processes started by this test, as the deepspeed launcher would start them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import interlock
from interlock import Machine, ResolutionError, plan
from interlock.engine.tables import ENVIRONMENT_VARIABLES, RENDEZVOUS_VARIABLE
from interlock.strategies.ddp import DDPStrategy
from interlock.strategies.environments import (
    ExternalLauncherEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from interlock.strategies.launchers import ExternalLauncher, SubprocessScriptLauncher
from interlock.strategies.launchers.base import RENDEZVOUS_ENV
from machines import slurm

#: what the deepspeed launcher exports to rank 0 of 2 processes on one node
DEEPSPEED = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def rules(result: interlock.Plan) -> list[str]:
    return [step.rule for step in result.trace]


def refusal(machine: Machine, **flags: object) -> ResolutionError:
    with pytest.raises(ResolutionError) as info:
        plan(machine=machine, **flags)  # type: ignore[arg-type]
    return info.value


# --------------------------------------------------------------------------- external


def test_processes_started_by_another_launcher_are_not_started_again() -> None:
    result = plan(accelerator="cpu", devices=2, machine=Machine(environ=DEEPSPEED))
    assert (result.cluster_environment, result.launcher, result.world_size) == (
        "external", "external", 2), result.explain()
    assert "cluster/external" in rules(result)
    assert any("launcher other than interlock's" in n for n in result.notes), result.notes


def test_deepspeeds_own_names_are_read_too() -> None:
    env = {**DEEPSPEED, "LOCAL_SIZE": "2", "CROSS_SIZE": "1", "CROSS_RANK": "0"}
    assert plan(accelerator="cpu", devices=2,
                machine=Machine(environ=env)).cluster_environment == "external"
    error = refusal(Machine(environ={**env, "WORLD_SIZE": "4", "CROSS_SIZE": "2"}),
                    accelerator="cpu", devices=4, num_nodes=2)
    assert error.code == "cluster-mismatch" and "LOCAL_SIZE=2" in error.reason, error


def test_interlocks_own_children_are_not_external() -> None:
    child = {**DEEPSPEED, "RANK": "1", "LOCAL_RANK": "1", RENDEZVOUS_VARIABLE: "127.0.0.1:5"}
    result = plan(accelerator="cpu", devices=2, machine=Machine(environ=child))
    assert (result.cluster_environment, result.launcher) == ("local", "subprocess")
    assert RENDEZVOUS_VARIABLE == RENDEZVOUS_ENV, "the engine and the launchers must agree"


@pytest.mark.parametrize(
    ("environ", "flags", "flag", "named"),
    [
        ({**DEEPSPEED, "WORLD_SIZE": "4"}, {"devices": 2}, "devices", "WORLD_SIZE=4"),
        ({**DEEPSPEED, "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"}, {"devices": 2},
         "devices", "LOCAL_WORLD_SIZE=4"),
        ({**DEEPSPEED, "LOCAL_RANK": "2", "RANK": "2", "WORLD_SIZE": "4"},
         {"devices": 2, "num_nodes": 2}, "devices", "LOCAL_RANK=2"),
    ],
)
def test_external_geometry_is_checked(environ: dict[str, str], flags: dict[str, object],
                                      flag: str, named: str) -> None:
    error = refusal(Machine(environ=environ), accelerator="cpu", **flags)
    assert (error.code, error.flag) == ("cluster-mismatch", flag), error
    assert named in error.reason, error.reason


def test_external_environment_reads_torchs_variables() -> None:
    env = ExternalLauncherEnvironment(environ={**DEEPSPEED, "RANK": "5", "LOCAL_RANK": "1",
                                               "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    assert env.creates_processes_externally
    assert (env.main_address, env.main_port, env.world_size(), env.global_rank(),
            env.local_rank(), env.node_rank()) == ("127.0.0.1", 29500, 8, 5, 1, 1)
    assert ExternalLauncherEnvironment(environ={**DEEPSPEED, "NODE_RANK": "3"}).node_rank() == 3
    unknown = ExternalLauncherEnvironment(environ={**DEEPSPEED, "RANK": "5", "LOCAL_RANK": "1"})
    with pytest.raises(ResolutionError, match="GROUP_RANK or") as info:
        unknown.node_rank()
    assert info.value.code == "invalid-environment"
    assert ExternalLauncherEnvironment.detect(DEEPSPEED)
    assert not ExternalLauncherEnvironment.detect({**DEEPSPEED, RENDEZVOUS_VARIABLE: "h:1"})


def test_every_launcher_honours_processes_created_elsewhere() -> None:
    # no plan: the strategy would use the script launcher, and must not
    ddp = DDPStrategy(parallel_devices=["cpu", "cpu"],
                      cluster_environment=ExternalLauncherEnvironment(environ=DEEPSPEED))
    assert isinstance(ddp.launcher, ExternalLauncher)
    spawn = DDPStrategy(parallel_devices=["cpu", "cpu"], start_method="spawn",
                        cluster_environment=TorchElasticEnvironment(environ={
                            **DEEPSPEED, "TORCHELASTIC_RUN_ID": "r"}))
    assert isinstance(spawn.launcher, ExternalLauncher)


def test_a_rank_the_script_launcher_started_runs_its_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a child re-running the script with a LocalEnvironment plugin plans "external"; it
    # must still run the launch it was started for and exit, as the script launcher's
    for key, value in {"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2",
                       RENDEZVOUS_ENV: "127.0.0.1:5", "INTERLOCK_LAUNCH_INDEX": "0"}.items():
        monkeypatch.setenv(key, value)
    strategy = interlock.resolve(accelerator="cpu", devices=2, plugins=[LocalEnvironment()],
                                 machine=Machine())
    assert strategy.plan is not None and strategy.plan.launcher == "external"
    assert isinstance(strategy.launcher, SubprocessScriptLauncher)


# --------------------------------------------------------------------------- local ranks


@pytest.mark.parametrize(
    ("make", "variable"),
    [
        # torchrun-style variables without LOCAL_WORLD_SIZE: only the local rank tells
        (lambda: TorchElasticEnvironment(environ={
            "TORCHELASTIC_RUN_ID": "r", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
            "GROUP_RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "1"}), "LOCAL_RANK=1"),
        (lambda: SLURMEnvironment(environ={**slurm(2, None, 2).environ, "SLURM_LOCALID": "1",
                                           "SLURM_PROCID": "1"}), "SLURM_LOCALID=1"),
        (lambda: MPIEnvironment(environ={"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
                                         "OMPI_COMM_WORLD_LOCAL_RANK": "1"}),
         "OMPI_COMM_WORLD_LOCAL_RANK=1"),
        (lambda: LSFEnvironment(environ={"LSB_JOBID": "1", "LSB_DJOB_RANKFILE": "/x",
                                         "JSM_NAMESPACE_LOCAL_RANK": "1",
                                         "JSM_NAMESPACE_SIZE": "2", "JSM_NAMESPACE_RANK": "1"}),
         "JSM_NAMESPACE_LOCAL_RANK=1"),
        (lambda: ExternalLauncherEnvironment(environ={**DEEPSPEED, "RANK": "1",
                                                      "LOCAL_RANK": "1"}), "LOCAL_RANK=1"),
    ],
)
def test_a_local_rank_without_a_device_is_refused_at_plan_time(make: object,
                                                                variable: str) -> None:
    env = make()  # type: ignore[operator]
    error = refusal(Machine(environ=dict(env.environ)), accelerator="cpu", devices=1,
                    num_nodes=2)
    assert error.code == "cluster-mismatch" and error.rule == "cluster/local-rank-out-of-range"
    assert variable in error.reason and "no device for it" in error.reason, error.reason
    with pytest.raises(ResolutionError, match="no device for it"):
        env.validate_settings(1, 2)  # the same check in the rank, before any collective


# --------------------------------------------------------------------------- SLURM


def test_srun_inside_salloc_is_slurm() -> None:
    # salloc -N1 -n4 (job name "interactive"), then: srun python train.py
    result = plan(devices=4, machine=slurm(4, "4", 1, job_name="interactive"))
    assert (result.cluster_environment, result.launcher) == ("slurm", "external")


def test_python_run_directly_in_salloc_launches_itself_and_says_why() -> None:
    # salloc -N1 -n4, then: python train.py (no srun: no job step)
    for name, rule in (("interactive", "cluster/slurm-interactive"),
                       ("myjob", "cluster/slurm-without-step")):
        result = plan(devices=4, machine=slurm(4, "4", 1, job_name=name, step=False))
        assert (result.cluster_environment, result.launcher) == ("local", "subprocess")
        assert rule in rules(result)
        notes = " ".join(result.notes)
        assert "srun" in notes and "SLURM" in notes, notes
        assert "available but not used" not in notes


def test_a_batch_script_running_python_directly_launches_itself() -> None:
    env = {**slurm(4, "4", 1, step=False).environ, "SLURM_PROCID": "0"}
    result = plan(devices=4, machine=Machine(cuda_devices=4, environ=env))
    assert (result.cluster_environment, result.launcher) == ("local", "subprocess")
    assert any("batch script" in note for note in result.notes), result.notes


def test_a_batch_script_without_srun_on_two_nodes_is_refused_with_the_way_out() -> None:
    """sbatch -N2 running python directly: only this node's processes would start, and
    they would wait for the other node's for ever."""
    for job_name in ("myjob", "interactive"):
        env = {**slurm(8, "4", 2, job_name=job_name, step=False).environ, "SLURM_PROCID": "0"}
        error = refusal(Machine(cuda_devices=4, environ=env), devices=4, num_nodes=2)
        assert (error.code, error.flag, error.choices) == ("cluster-mismatch", "num_nodes",
                                                           ("1",))
        assert "srun did not start this process" in error.reason
        assert "srun --ntasks-per-node" in error.reason
    one_node = {**slurm(8, "4", 2, step=False).environ, "SLURM_PROCID": "0"}
    assert plan(devices=4, num_nodes=1,
                machine=Machine(cuda_devices=4, environ=one_node)).launcher == "subprocess"


def test_fewer_tasks_than_tasks_per_node_makes_up_no_devices() -> None:
    # sbatch --ntasks=2 --ntasks-per-node=4; srun python train.py: two processes exist
    partial = slurm(2, "4", 1)
    assert plan(devices=2, machine=partial).world_size == 2
    error = refusal(partial, devices=4)
    assert error.code == "cluster-mismatch" and error.choices == ("2",), error
    assert "counts slots" in error.reason, error.reason
    # the step's own per-node count wins when srun exports it
    stepped = Machine(cuda_devices=4, environ={**partial.environ,
                                               "SLURM_STEP_TASKS_PER_NODE": "2"})
    assert plan(devices=2, machine=stepped).world_size == 2


def test_one_task_with_two_tasks_per_node_does_not_become_two_processes() -> None:
    # the report: --ntasks=1 --ntasks-per-node=2, srun python train.py, devices=1
    result = plan(devices=1, machine=slurm(1, "2", 1))
    assert (result.cluster_environment, result.world_size) == ("slurm", 1)


def test_heterogeneous_steps_are_refused_by_name() -> None:
    env = {**slurm(4, None, 2).environ, "SLURM_STEP_TASKS_PER_NODE": "3,1"}
    error = refusal(Machine(cuda_devices=4, environ=env), devices=2, num_nodes=2)
    assert error.code == "invalid-environment" and "SLURM_STEP_TASKS_PER_NODE" in error.reason
    uniform = {**slurm(4, None, 2).environ, "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    assert plan(devices=2, num_nodes=2,
                machine=Machine(cuda_devices=4, environ=uniform)).world_size == 4


def test_torchrun_inside_slurm_is_torchelastic_with_a_note() -> None:
    env = {**slurm(2, "1", 2).environ, "TORCHELASTIC_RUN_ID": "r", "WORLD_SIZE": "8",
           "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "GROUP_RANK": "0", "MASTER_ADDR": "n0", "MASTER_PORT": "29400"}
    result = plan(devices=4, num_nodes=2, machine=Machine(cuda_devices=4, environ=env))
    assert (result.cluster_environment, result.launcher) == ("torchelastic", "external")
    assert "cluster/torchelastic-in-slurm" in rules(result)
    assert any("SLURM variables" in note and "ignored" in note for note in result.notes)


def test_a_launcher_inside_a_one_task_srun_step_is_external() -> None:
    # srun -n1 deepspeed train.py: srun started the launcher, the launcher this process
    env = {**slurm(1, "1", 1).environ, **DEEPSPEED}
    result = plan(accelerator="cpu", devices=2, machine=Machine(environ=env))
    assert (result.cluster_environment, result.launcher) == ("external", "external")
    assert "cluster/external-in-slurm" in rules(result)
    # the same variables exported from SLURM's own (same world): SLURM stays in charge
    same = {**slurm(2, "2", 1).environ, **DEEPSPEED}
    assert plan(accelerator="cpu", devices=2,
                machine=Machine(environ=same)).cluster_environment == "slurm"


# --------------------------------------------------------------------------- the switch


def test_detection_can_be_turned_off_by_the_environment() -> None:
    env = {**slurm(8, "4", 2).environ, **DEEPSPEED, "INTERLOCK_CLUSTER_DETECTION": "OFF"}
    result = plan(accelerator="cpu", devices=2, machine=Machine(environ=env))
    assert (result.cluster_environment, result.launcher) == ("local", "subprocess")
    assert "cluster/detection-off" in rules(result)
    note = next(n for n in result.notes if "detection is off" in n)
    assert "slurm" in note and "external" in note, note
    assert "INTERLOCK_CLUSTER_DETECTION" in ENVIRONMENT_VARIABLES, "probe() must keep it"


def test_a_misspelt_switch_is_refused() -> None:
    error = refusal(Machine(environ={"INTERLOCK_CLUSTER_DETECTION": "of"}))
    assert error.code == "invalid-environment" and error.choices == ("on", "off")


def test_detection_can_be_turned_off_by_a_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RENDEZVOUS_ENV, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")  # the scheduler's, meaning something else
    result = plan(accelerator="cpu", devices=2, plugins=[LocalEnvironment()],
                  machine=Machine(environ=DEEPSPEED))
    assert (result.cluster_environment, result.launcher) == ("local", "subprocess")


# --------------------------------------------------------------------------- a real job

WORKER = textwrap.dedent(
    """
    import json
    import os

    import torch

    import interlock


    def work(strategy):
        total = strategy.all_reduce(torch.tensor([strategy.global_rank + 1.0]), "sum")
        return {"rank": strategy.global_rank, "world": strategy.world_size,
                "total": float(total.item())}


    strategy = interlock.resolve(accelerator="cpu", devices=2)
    result = strategy.launch(work)
    assert strategy.plan is not None
    print("RESULT " + json.dumps({**result, "pid": os.getpid(),
                                  "cluster": strategy.plan.cluster_environment,
                                  "launcher": strategy.plan.launcher}), flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_environ() -> dict[str, str]:
    drop = set(ENVIRONMENT_VARIABLES) | {"INTERLOCK_LAUNCH_INDEX", "INTERLOCK_LAUNCH_HISTORY",
                                         "INTERLOCK_RANK0_SERVES", "INTERLOCK_ERROR_FILE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    src = str(Path(interlock.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _start_world(directory: Path, source: str) -> list[subprocess.Popen[str]]:
    """Two processes running ``source``, started as a cluster launcher would start them
    (the env:// variables only), each in a process group of its own."""
    script = directory / "worker.py"
    script.write_text(source, encoding="utf-8")
    base = {**_clean_environ(), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port())}
    return [
        subprocess.Popen([sys.executable, str(script)], cwd=directory,
                         env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
        for rank in range(2)
    ]


def _end_world(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)  # the whole group: anything it may have started
            proc.wait()


def test_two_processes_started_elsewhere_join_one_world(tmp_path: Path) -> None:
    procs = _start_world(tmp_path, WORKER)
    outputs: list[tuple[int, str, str]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            outputs.append((proc.returncode, out, err))
    finally:
        _end_world(procs)
    for code, out, err in outputs:
        assert code == 0, f"a worker failed (exit {code}):\n{out}\n{err}"
    lines = [line for _, out, _ in outputs for line in out.splitlines()
             if line.startswith("RESULT ")]
    results = sorted((json.loads(line[7:]) for line in lines), key=lambda r: r["rank"])
    assert len(results) == 2, f"expected one result per process, got {lines}: a process " \
        "started others"
    assert [r["rank"] for r in results] == [0, 1], f"two ranks of one world: {results}"
    for r in results:
        assert (r["world"], r["total"]) == (2, 3.0), f"not one world of 2: {results}"
        assert (r["cluster"], r["launcher"]) == ("external", "external"), results
    assert {r["pid"] for r in results} == {p.pid for p in procs}, "ran in the processes given"


FAILING_WORKER = textwrap.dedent(
    """
    import interlock


    def work(strategy):
        strategy.barrier()
        if strategy.global_rank == 1:
            raise RuntimeError("rank 1 breaks on purpose")
        while True:
            strategy.barrier()  # fails once rank 1's connections close


    interlock.resolve(accelerator="cpu", devices=2).launch(work)
    """
)


@pytest.mark.timeout(90)
def test_a_rank_failing_after_its_peer_lets_that_peer_exit_first(tmp_path: Path) -> None:
    """mpirun and srun name the first process to exit with an error. Rank 0's barrier
    breaks because rank 1 failed; rank 0 then waits for rank 1 to exit first, so that
    such a launcher names rank 1, the cause, not rank 0."""
    procs = _start_world(tmp_path, FAILING_WORKER)
    order: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while len(order) < 2 and time.monotonic() < deadline:
            order += [rank for rank, proc in enumerate(procs)
                      if rank not in order and proc.poll() is not None]
            time.sleep(0.01)
    finally:
        _end_world(procs)
    errors = [proc.communicate()[1] for proc in procs]
    assert len(order) == 2, f"the job did not end: {errors}"
    assert all(proc.returncode != 0 for proc in procs), errors
    assert "rank 1 breaks on purpose" in errors[1], errors[1]
    assert "rank 0 failed after rank 1 did" in errors[0], errors[0]
    assert "failed after" not in errors[1], errors[1]
    assert order == [1, 0], f"rank {order[0]} exited first:\n{errors[0]}"


def test_auto_devices_follow_the_processes_a_cluster_started_per_node() -> None:
    """torchrun --nproc_per_node=1 on an 8-GPU host with devices left on auto: one
    process per node uses cuda:0 (a note says why) instead of a cluster-mismatch; the
    same count given explicitly as 8 is still refused, and on cpu auto follows an MPI
    job's two local ranks."""
    from machines import torchelastic

    one = plan(num_nodes=2, machine=torchelastic(2, 1, 2))
    assert one.parallel_devices == ("cuda:0",), one.parallel_devices
    assert "cluster/auto-devices-follow-cluster" in rules(one)
    assert any("LOCAL_WORLD_SIZE=1" in note for note in one.notes), one.notes
    with pytest.raises(ResolutionError) as info:
        plan(devices=8, num_nodes=2, machine=torchelastic(2, 1, 2))
    assert info.value.code == "cluster-mismatch"
    mpi = plan(accelerator="cpu", machine=Machine(environ={
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}))
    assert (mpi.cluster_environment, mpi.parallel_devices, mpi.strategy) == (
        "mpi", ("cpu", "cpu"), "ddp")
    # more processes per node than this host has GPUs: still refused
    with pytest.raises(ResolutionError) as info:
        plan(machine=torchelastic(16, 16, 1))
    assert info.value.code == "cluster-mismatch"
