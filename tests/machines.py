"""Machine snapshots shared by the engine's tests."""

from __future__ import annotations

from interlock import Machine

CPU = Machine()
NOTEBOOK = Machine(interactive=True)
ONE_GPU = Machine(cuda_devices=1)
EIGHT_GPUS = Machine(cuda_devices=8)
EIGHT_GPUS_NOTEBOOK = Machine(cuda_devices=8, interactive=True)
MPS = Machine(mps_available=True)
TPU = Machine(xla_devices=8, packages=frozenset({"torch_xla"}))
TPU_NO_PACKAGE = Machine(xla_devices=8)
NO_FORK = Machine(cuda_devices=2, start_methods=("spawn",))
FULL = Machine(cuda_devices=8, packages=frozenset({"deepspeed", "transformer_engine"}))


def torchelastic(world: int, local: int, nodes: int, **extra: str) -> Machine:
    env = {
        "TORCHELASTIC_RUN_ID": "job",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local),
        "GROUP_WORLD_SIZE": str(nodes),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        **extra,
    }
    return Machine(cuda_devices=8, environ=env)


def slurm(ntasks: int, per_node: str | None, nodes: int, job_name: str = "train",
          cuda: int = 4, step: bool = True) -> Machine:
    """Rank 0 of a SLURM job: started by srun (a job step) unless ``step`` is false, which
    leaves the allocation's variables only (salloc's shell; no SLURM_PROCID either)."""
    env = {"SLURM_NTASKS": str(ntasks), "SLURM_NNODES": str(nodes), "SLURM_JOB_NAME": job_name,
           "SLURM_JOB_ID": "42"}
    if step:
        env |= {"SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    if per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = per_node
    return Machine(cuda_devices=cuda, environ=env)
