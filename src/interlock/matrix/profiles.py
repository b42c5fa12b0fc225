"""Named machine profiles: the machines the matrix and the docs are computed for."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.engine.machine import START_METHODS, Machine


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A machine snapshot with a name and a one-line description.

    Attributes:
        name: short kebab-case name used on the command line and in the lock file.
        description: what kind of machine (and job) it stands for.
        environment: the launch environment it exemplifies in the docs (local,
            notebook, torchrun, slurm, no-fork) or "" for none.
        machine: the snapshot.
        job: (devices per node, num_nodes) of the job the docs ask for on it: a
            cluster's job geometry, which its variables describe too.
    """

    name: str
    description: str
    environment: str
    machine: Machine
    job: tuple[int, int] = (2, 1)


def _torchrun(per_node: int, nodes: int) -> dict[str, str]:
    return {"TORCHELASTIC_RUN_ID": "job", "WORLD_SIZE": str(nodes * per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_WORLD_SIZE": str(nodes), "RANK": "0",
            "LOCAL_RANK": "0", "GROUP_RANK": "0", "MASTER_ADDR": "node0",
            "MASTER_PORT": "29500"}


def _slurm(per_node: int, nodes: int) -> dict[str, str]:
    # rank 0 of a job step that srun started (SLURM_STEP_ID marks the step; without it
    # the variables describe only an allocation, and interlock launches by itself)
    return {"SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
            "SLURM_NTASKS": str(nodes * per_node), "SLURM_NTASKS_PER_NODE": str(per_node),
            "SLURM_NNODES": str(nodes), "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "4242",
            "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
            "SLURM_NODELIST": "gpu[01-02]"}


#: the jobs of the cluster profiles: (devices per node, num_nodes)
_SLURM_JOB = (4, 2)
_TORCHRUN_JOB = (8, 2)

PROFILES: tuple[Profile, ...] = (
    Profile(name="cpu-laptop", description="CPU-only laptop", environment="local",
            machine=Machine()),
    Profile(name="cpu-notebook", description="CPU-only Jupyter notebook",
            environment="notebook", machine=Machine(interactive=True)),
    Profile(name="cuda-1", description="workstation with 1 CUDA GPU", environment="",
            machine=Machine(cuda_devices=1)),
    Profile(name="cuda-8", description="server with 8 CUDA GPUs", environment="",
            machine=Machine(cuda_devices=8)),
    Profile(name="cuda-8-notebook", description="8 CUDA GPUs in a Jupyter notebook",
            environment="", machine=Machine(cuda_devices=8, interactive=True)),
    Profile(name="mps", description="Apple silicon Mac (MPS)", environment="",
            machine=Machine(mps_available=True)),
    Profile(name="tpu-v4-8", description="TPU v4-8 host: 8 XLA devices, torch_xla installed",
            environment="", machine=Machine(xla_devices=8, packages=frozenset({"torch_xla"}))),
    Profile(name="slurm-2x4", description="SLURM job, 2 nodes x 4 GPUs (rank 0's environment)",
            environment="slurm", job=_SLURM_JOB,
            machine=Machine(cuda_devices=_SLURM_JOB[0], environ=_slurm(*_SLURM_JOB))),
    Profile(name="torchrun-2x8", description="torchrun, 2 nodes x 8 GPUs (rank 0's environment)",
            environment="torchrun", job=_TORCHRUN_JOB,
            machine=Machine(cuda_devices=_TORCHRUN_JOB[0], environ=_torchrun(*_TORCHRUN_JOB))),
    Profile(name="no-fork", description="a platform without fork (Windows-like), 2 CUDA GPUs",
            environment="no-fork",
            machine=Machine(cuda_devices=2,
                            start_methods=tuple(m for m in START_METHODS if m != "fork"))),
    Profile(name="cpu-extras", description="CPU-only machine with deepspeed installed",
            environment="", machine=Machine(packages=frozenset({"deepspeed"}))),
    Profile(name="cuda-8-extras",
            description="8 CUDA GPUs with deepspeed and transformer_engine installed",
            environment="",
            machine=Machine(cuda_devices=8,
                            packages=frozenset({"deepspeed", "transformer_engine"}))),
)


def profile_named(name: str) -> Profile:
    """The profile called ``name``; ValueError listing the names otherwise."""
    for profile in PROFILES:
        if profile.name == name:
            return profile
    raise ValueError(
        f"no machine profile named {name!r}; profiles: {', '.join(p.name for p in PROFILES)}"
    )
