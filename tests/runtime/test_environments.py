"""Cluster environments: every property from a simulated environment, detection through
the engine's table, geometry checks, and acceptance as plugins by the engine."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

import interlock
from interlock import Machine, ResolutionError
from interlock.engine.tables import CLUSTER_NAMES, ENVIRONMENT_VARIABLES
from interlock.strategies.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
    environment_for,
    expand_hostlist,
    first_host,
)

TORCHELASTIC = {
    "TORCHELASTIC_RUN_ID": "run-7", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "2", "RANK": "6", "LOCAL_RANK": "2", "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
}
SLURM = {
    "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_JOB_NAME": "train", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1", "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_NODELIST": "node[001-003,007],gpu-a[1-2]",
}
#: what salloc (or sbatch, in the batch script) exports: an allocation, no srun step
SLURM_ALLOCATION = {"SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4",
                    "SLURM_JOB_NAME": "interactive", "SLURM_JOB_ID": "123456"}
KUBEFLOW = {
    "KUBERNETES_PORT": "tcp://10.96.0.1:443", "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
}
OPEN_MPI = {
    "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_ADDR": "n0", "MASTER_PORT": "29555",
}
PMI_ONE_NODE = {"PMI_SIZE": "4", "PMI_RANK": "2", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}


def lsf_environ(tmp_path: Path) -> dict[str, str]:
    rankfile = tmp_path / "rankfile"
    # First line: the launch node (runs no rank); then one line per slot.
    rankfile.write_text("batch1\nnode-a\nnode-a\nnode-b\nnode-b\n")
    return {
        "LSB_JOBID": "98765", "LSB_DJOB_RANKFILE": str(rankfile),
        "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_RANK": "3",
    }


def snapshot(env: ClusterEnvironment) -> dict[str, object]:
    return {
        "external": env.creates_processes_externally,
        "address": env.main_address,
        "port": env.main_port,
        "world": env.world_size(),
        "global": env.global_rank(),
        "local": env.local_rank(),
        "node": env.node_rank(),
    }


# --------------------------------------------------------------------------- properties


def test_local_defaults_in_a_plain_process() -> None:
    env = LocalEnvironment(environ={})
    assert snapshot(env) == {
        "external": False, "address": "127.0.0.1", "port": 0,
        "world": 1, "global": 0, "local": 0, "node": 0,
    }, "a plain process is rank 0 of 1; port 0 means the launcher picks a free one"


def test_local_child_of_the_script_launcher_reads_its_variables() -> None:
    env = LocalEnvironment(environ={
        "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4", "RANK": "3",
        "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "12345", "INTERLOCK_RENDEZVOUS": "h:1",
    })
    assert snapshot(env) == {
        "external": True, "address": "10.1.1.1", "port": 12345,
        "world": 4, "global": 3, "local": 1, "node": 1,
    }


def test_local_global_rank_without_rank_variable() -> None:
    child = LocalEnvironment(environ={"LOCAL_RANK": "3", "NODE_RANK": "0", "WORLD_SIZE": "4"})
    assert child.global_rank() == 3, "on node 0 the global rank is the local rank"
    remote = LocalEnvironment(environ={"LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4"})
    with pytest.raises(RuntimeError, match=r"local rank 1 on node 1.*set_global_rank"):
        remote.global_rank()
    remote.set_global_rank(3)
    assert remote.global_rank() == 3


def test_local_setters_override_the_environment() -> None:
    env = LocalEnvironment(environ={"WORLD_SIZE": "4", "RANK": "3"})
    env.set_world_size(6)
    env.set_global_rank(5)
    assert (env.world_size(), env.global_rank()) == (6, 5)
    with pytest.raises(ValueError, match="world size must be >= 1"):
        env.set_world_size(0)
    with pytest.raises(ValueError, match="global rank must be >= 0"):
        env.set_global_rank(-1)


def test_environment_is_read_lazily_from_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("INTERLOCK_RENDEZVOUS", raising=False)
    env = LocalEnvironment()
    assert env.creates_processes_externally is False
    monkeypatch.setenv("LOCAL_RANK", "2")  # another launcher's (or a scheduler's) variable
    assert (env.creates_processes_externally, env.local_rank()) == (False, 2), (
        "LOCAL_RANK alone does not make a process one of interlock's children")
    monkeypatch.setenv("INTERLOCK_RENDEZVOUS", "127.0.0.1:5")  # as interlock's launcher does
    assert env.creates_processes_externally is True


def test_torchelastic() -> None:
    assert snapshot(TorchElasticEnvironment(environ=TORCHELASTIC)) == {
        "external": True, "address": "10.0.0.1", "port": 29400,
        "world": 8, "global": 6, "local": 2, "node": 1,
    }


def test_slurm() -> None:
    assert snapshot(SLURMEnvironment(environ=SLURM)) == {
        "external": True, "address": "node001", "port": 15000 + 123456 % 5000,
        "world": 8, "global": 5, "local": 1, "node": 1,
    }


def test_slurm_master_variables_win_over_the_derived_ones() -> None:
    env = SLURMEnvironment(environ={**SLURM, "MASTER_ADDR": "login2", "MASTER_PORT": "29501"})
    assert (env.main_address, env.main_port) == ("login2", 29501)


def test_slurm_falls_back_to_the_job_node_list() -> None:
    environ = {k: v for k, v in SLURM.items() if k != "SLURM_NODELIST"}
    environ["SLURM_JOB_NODELIST"] = "cn[10-11]"
    assert SLURMEnvironment(environ=environ).main_address == "cn10"


def test_slurm_port_is_the_same_for_every_task_of_a_job() -> None:
    ports = {
        SLURMEnvironment(environ={**SLURM, "SLURM_PROCID": str(r)}).main_port for r in range(8)
    }
    assert ports == {18456}, "all tasks must derive the same port from SLURM_JOB_ID"
    other = SLURMEnvironment(environ={**SLURM, "SLURM_JOB_ID": "123457"}).main_port
    assert other == 18457, "the next job gets the next port"


def test_slurm_unreadable_node_list_is_an_environment_error() -> None:
    env = SLURMEnvironment(environ={**SLURM, "SLURM_NODELIST": "node[1-3"})
    with pytest.raises(ResolutionError, match="SLURM_NODELIST") as info:
        _ = env.main_address
    assert info.value.code == "invalid-environment"
    assert "MASTER_ADDR" in str(info.value), "the error should say how to work around it"


def test_kubeflow() -> None:
    assert snapshot(KubeflowEnvironment(environ=KUBEFLOW)) == {
        "external": True, "address": "job-master-0", "port": 23456,
        "world": 3, "global": 2, "local": 0, "node": 2,
    }


def test_lsf(tmp_path: Path) -> None:
    env = LSFEnvironment(environ=lsf_environ(tmp_path), hostname="node-b")
    assert env.hosts() == ("node-a", "node-b"), "the launch node is skipped, repeats dropped"
    assert snapshot(env) == {
        "external": True, "address": "node-a", "port": 15000 + 98765 % 5000,
        "world": 4, "global": 3, "local": 1, "node": 1,
    }


def test_lsf_matches_a_fully_qualified_host_name(tmp_path: Path) -> None:
    env = LSFEnvironment(environ=lsf_environ(tmp_path), hostname="node-b.cluster.example")
    assert env.node_rank() == 1


def test_lsf_host_outside_the_rank_file_is_an_environment_error(tmp_path: Path) -> None:
    env = LSFEnvironment(environ=lsf_environ(tmp_path), hostname="elsewhere")
    with pytest.raises(ResolutionError, match=r"elsewhere.*node-a, node-b") as info:
        env.node_rank()
    assert info.value.code == "invalid-environment"


def test_lsf_missing_rank_file_names_the_path(tmp_path: Path) -> None:
    environ = {**lsf_environ(tmp_path), "LSB_DJOB_RANKFILE": str(tmp_path / "gone")}
    with pytest.raises(ResolutionError, match="gone") as info:
        _ = LSFEnvironment(environ=environ).main_address
    assert info.value.code == "invalid-environment"


def test_mpi_open_mpi_on_two_nodes() -> None:
    assert snapshot(MPIEnvironment(environ=OPEN_MPI)) == {
        "external": True, "address": "n0", "port": 29555,
        "world": 8, "global": 5, "local": 1, "node": 1,
    }


def test_mpi_pmi_on_one_node_defaults_address_and_port() -> None:
    env = MPIEnvironment(environ=PMI_ONE_NODE)
    assert snapshot(env) == {
        "external": True, "address": "127.0.0.1", "port": 29500,
        "world": 4, "global": 2, "local": 2, "node": 0,
    }


def test_mpi_single_node_port_comes_from_the_job_namespace() -> None:
    def port(rank: int, namespace: str) -> int:
        environ = {**PMI_ONE_NODE, "PMI_RANK": str(rank), "PMIX_NAMESPACE": namespace}
        return MPIEnvironment(environ=environ).main_port

    expected = 15000 + zlib.crc32(b"prterun-host-4242@1") % 5000
    assert {port(r, "prterun-host-4242@1") for r in range(4)} == {expected}
    assert port(0, "prterun-host-4243@1") != expected, "another job should get another port"


def test_mpi_on_several_nodes_needs_master_variables() -> None:
    environ = {k: v for k, v in OPEN_MPI.items() if not k.startswith("MASTER_")}
    env = MPIEnvironment(environ=environ)
    for attribute in ("main_address", "main_port"):
        with pytest.raises(ResolutionError, match=r"spans 2 nodes.*MASTER_ADDR") as info:
            getattr(env, attribute)
        assert info.value.code == "invalid-environment"


def test_xla_reads_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch_xla cannot be installed here: a stand-in with the runtime's functions.
    runtime = types.ModuleType("torch_xla.runtime")
    runtime.world_size = lambda: 8  # type: ignore[attr-defined]
    runtime.global_ordinal = lambda: 5  # type: ignore[attr-defined]
    runtime.local_ordinal = lambda: 1  # type: ignore[attr-defined]
    runtime.host_index = lambda: 1  # type: ignore[attr-defined]
    package = types.ModuleType("torch_xla")
    package.__spec__ = importlib.machinery.ModuleSpec("torch_xla", None)
    package.runtime = runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla", package)
    monkeypatch.setitem(sys.modules, "torch_xla.runtime", runtime)

    env = XLAEnvironment(environ={})
    assert XLAEnvironment.detect() is True
    assert env.creates_processes_externally is False
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (
        8, 5, 1, 1,
    )
    env.set_world_size(8)
    with pytest.raises(ValueError, match=r"world size \(8\).*to 4"):
        env.set_world_size(4)
    for attribute in ("main_address", "main_port"):
        with pytest.raises(NotImplementedError, match="own rendezvous"):
            getattr(env, attribute)


@pytest.mark.skipif(XLAEnvironment.detect(), reason="torch_xla is installed")
def test_xla_without_torch_xla_says_how_to_install_it() -> None:
    with pytest.raises(ResolutionError, match="pip install") as info:
        XLAEnvironment().world_size()
    assert info.value.code == "missing-package"


# --------------------------------------------------------------------------- setters

EXTERNAL: list[tuple[Callable[[Path], ClusterEnvironment], int, int]] = [
    (lambda _: TorchElasticEnvironment(environ=TORCHELASTIC), 8, 6),
    (lambda _: SLURMEnvironment(environ=SLURM), 8, 5),
    (lambda _: KubeflowEnvironment(environ=KUBEFLOW), 3, 2),
    (lambda p: LSFEnvironment(environ=lsf_environ(p), hostname="node-b"), 4, 3),
    (lambda _: MPIEnvironment(environ=OPEN_MPI), 8, 5),
]


@pytest.mark.parametrize(("make", "world", "rank"), EXTERNAL)
def test_external_launchers_own_world_size_and_rank(
    make: Callable[[Path], ClusterEnvironment], world: int, rank: int, tmp_path: Path
) -> None:
    env = make(tmp_path)
    env.set_world_size(world)
    env.set_global_rank(rank)  # the values it already has: accepted
    with pytest.raises(ValueError, match=rf"world size \({world}\).*to {world + 1}"):
        env.set_world_size(world + 1)
    with pytest.raises(ValueError, match=rf"global rank \({rank}\).*to {rank + 1}"):
        env.set_global_rank(rank + 1)
    assert (env.world_size(), env.global_rank()) == (world, rank)


class _FourRanks(ClusterEnvironment):
    """A third-party environment that writes only what its cluster tells it."""

    name = "four_ranks"
    creates_processes_externally = True
    main_address = "10.0.0.1"
    main_port = 29500

    def world_size(self) -> int:
        return 4

    def global_rank(self) -> int:
        return 2

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return 2


def test_a_third_party_environment_need_not_write_the_setters() -> None:
    # set_world_size and set_global_rank were abstract, though interlock never calls
    # them: by default they accept only what the environment already says
    env = _FourRanks()
    env.set_world_size(4)
    env.set_global_rank(2)
    with pytest.raises(ValueError, match=r"four_ranks launcher decided the world size \(4\)"):
        env.set_world_size(8)
    with pytest.raises(ValueError, match=r"decided the global rank \(2\).*to 0"):
        env.set_global_rank(0)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({**TORCHELASTIC, "RANK": "six"}, "RANK=six"),
        ({**TORCHELASTIC, "WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
        ({k: v for k, v in TORCHELASTIC.items() if k != "MASTER_ADDR"}, "MASTER_ADDR (unset)"),
        ({**TORCHELASTIC, "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
    ],
)
def test_unreadable_variables_are_named(environ: dict[str, str], variable: str) -> None:
    env = TorchElasticEnvironment(environ=environ)
    with pytest.raises(ResolutionError) as info:
        snapshot(env)
    assert info.value.code == "invalid-environment"
    assert info.value.value == variable, f"the error should name {variable}: {info.value}"


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("cls", "environ", "expected"),
    [
        (TorchElasticEnvironment, TORCHELASTIC, True),
        (TorchElasticEnvironment, SLURM, False),
        (TorchElasticEnvironment, {}, False),
        (SLURMEnvironment, SLURM, True),
        # srun inside an interactive allocation (salloc; srun python ...): a job step
        (SLURMEnvironment, {**SLURM, "SLURM_JOB_NAME": "bash"}, True),
        (SLURMEnvironment, {**SLURM, "SLURM_JOB_NAME": "interactive"}, True),
        # no step: salloc's shell, or a batch script running python without srun
        (SLURMEnvironment, SLURM_ALLOCATION, False),
        (SLURMEnvironment, {**SLURM_ALLOCATION, "SLURM_JOB_NAME": "train",
                            "SLURM_PROCID": "0"}, False),
        (SLURMEnvironment, TORCHELASTIC, False),
        (KubeflowEnvironment, KUBEFLOW, True),
        (KubeflowEnvironment, {k: v for k, v in KUBEFLOW.items() if k != "KUBERNETES_PORT"},
         False),
        (KubeflowEnvironment, TORCHELASTIC, False),
        (LSFEnvironment, {"LSB_JOBID": "1", "LSB_DJOB_RANKFILE": "/x",
                          "JSM_NAMESPACE_LOCAL_RANK": "0", "JSM_NAMESPACE_SIZE": "2"}, True),
        (LSFEnvironment, {"LSB_JOBID": "1", "LSB_DJOB_RANKFILE": "/x"}, False),
        (MPIEnvironment, OPEN_MPI, True),
        (MPIEnvironment, PMI_ONE_NODE, True),
        (MPIEnvironment, {**PMI_ONE_NODE, "PMI_SIZE": "1"}, False),
        (MPIEnvironment, {"OMPI_COMM_WORLD_SIZE": "1"}, False),
        (LocalEnvironment, {}, True),
        (LocalEnvironment, SLURM, True),
    ],
)
def test_detect_answers_for_its_own_cluster(
    cls: type[ClusterEnvironment], environ: dict[str, str], expected: bool
) -> None:
    assert cls.detect(environ) is expected, f"{cls.__name__}.detect({environ})"


def test_detect_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert SLURMEnvironment.detect() is False
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    assert SLURMEnvironment.detect() is True


def test_xla_detection_is_torch_xla_importability() -> None:
    installed = importlib.util.find_spec("torch_xla") is not None
    assert XLAEnvironment.detect(TORCHELASTIC) is installed, "variables play no part"


def test_torchrun_inside_slurm_engine_picks_torchelastic() -> None:
    environ = {**SLURM, **TORCHELASTIC}
    assert TorchElasticEnvironment.detect(environ) and SLURMEnvironment.detect(environ)
    plan = interlock.plan(
        accelerator="cpu", devices=4, num_nodes=2, machine=Machine(environ=environ)
    )
    assert plan.cluster_environment == "torchelastic", plan.trace


# --------------------------------------------------------------------------- geometry

GEOMETRY: list[tuple[Callable[[Path], ClusterEnvironment], tuple[int, int], tuple[int, int],
                     tuple[str, str]]] = [
    (lambda _: TorchElasticEnvironment(environ=TORCHELASTIC), (4, 2), (2, 2),
     ("LOCAL_WORLD_SIZE=4", "devices=2")),
    (lambda _: SLURMEnvironment(environ=SLURM), (4, 2), (4, 1),
     ("SLURM_NNODES=2", "num_nodes=1")),
    (lambda _: KubeflowEnvironment(environ=KUBEFLOW), (1, 3), (2, 3),
     ("starts 1 process per node", "devices=2")),
    (lambda p: LSFEnvironment(environ=lsf_environ(p)), (2, 2), (3, 2),
     ("JSM_NAMESPACE_SIZE=4", "makes 6")),
    (lambda _: MPIEnvironment(environ=OPEN_MPI), (4, 2), (8, 1),
     ("OMPI_COMM_WORLD_LOCAL_SIZE=4", "devices=8")),
]


@pytest.mark.parametrize(("make", "good", "bad", "named"), GEOMETRY)
def test_validate_settings_uses_the_engines_geometry_check(
    make: Callable[[Path], ClusterEnvironment],
    good: tuple[int, int],
    bad: tuple[int, int],
    named: tuple[str, str],
    tmp_path: Path,
) -> None:
    env = make(tmp_path)
    env.validate_settings(*good)
    with pytest.raises(ResolutionError) as info:
        env.validate_settings(*bad)
    assert info.value.code == "cluster-mismatch"
    for text in named:
        assert text in str(info.value), f"{text!r} missing from: {info.value}"


@pytest.mark.parametrize("env", [LocalEnvironment(environ={}), XLAEnvironment(environ={})])
def test_validate_settings_accepts_any_geometry_where_interlock_starts_processes(
    env: ClusterEnvironment,
) -> None:
    env.validate_settings(8, 4)


# --------------------------------------------------------------------------- the engine


@pytest.mark.parametrize(
    ("make", "devices", "num_nodes"),
    [
        (lambda _: LocalEnvironment(environ={}), 2, 1),
        (lambda _: TorchElasticEnvironment(environ=TORCHELASTIC), 4, 2),
        (lambda _: SLURMEnvironment(environ=SLURM), 4, 2),
        (lambda _: KubeflowEnvironment(environ=KUBEFLOW), 1, 3),
        (lambda p: LSFEnvironment(environ=lsf_environ(p)), 2, 2),
        (lambda _: MPIEnvironment(environ=OPEN_MPI), 4, 2),
        (lambda _: XLAEnvironment(environ={}), 1, 1),
    ],
)
def test_each_environment_is_accepted_as_a_plugin(
    make: Callable[[Path], ClusterEnvironment], devices: int, num_nodes: int, tmp_path: Path
) -> None:
    env = make(tmp_path)
    plan = interlock.plan(
        accelerator="cpu", devices=devices, num_nodes=num_nodes, plugins=[env],
        machine=Machine(environ=dict(env.environ)),
    )
    assert plan.cluster_environment == env.name
    assert plan.world_size == devices * num_nodes


def test_environment_for_covers_every_cluster_name() -> None:
    for name in CLUSTER_NAMES:
        env = environment_for(name, {})
        assert type(env).name == name and env.name == name


def test_environment_for_unknown_name_suggests_a_close_one() -> None:
    with pytest.raises(ValueError, match=r"'slrum'.*Did you mean 'slurm'.*Choices: "):
        environment_for("slrum")


# --------------------------------------------------------------------------- host lists


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node001", ["node001"]),
        ("host-1.cluster.example", ["host-1.cluster.example"]),
        ("a1,b2,c3", ["a1", "b2", "c3"]),
        ("node[001-003]", ["node001", "node002", "node003"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("gpu[09-10]", ["gpu09", "gpu10"]),
        ("node[5]", ["node5"]),
        ("node[001-003,007],gpu-a[1-2]",
         ["node001", "node002", "node003", "node007", "gpu-a1", "gpu-a2"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("login,cn[1-2]", ["login", "cn1", "cn2"]),
        (" cn[3-4] ", ["cn3", "cn4"]),
    ],
)
def test_slurm_host_lists_expand(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize(
    "text", ["", "node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "node[]", "a,,b", "n[[1]]"]
)
def test_malformed_host_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(text)
