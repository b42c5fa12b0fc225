"""`SLURMEnvironment`: processes started by ``srun`` inside a SLURM job."""

from __future__ import annotations

from interlock.engine.errors import ResolutionError
from interlock.strategies.environments._external import ExternalEnvironment
from interlock.strategies.environments._variables import (
    port_from_job,
    read_int,
    read_port,
    read_str,
)
from interlock.strategies.environments.hostlist import first_host


class SLURMEnvironment(ExternalEnvironment):
    """Ranks from the variables srun exports to every task.

    ``SLURM_PROCID`` (global rank), ``SLURM_LOCALID``, ``SLURM_NODEID``, and the step's
    ``SLURM_STEP_NUM_TASKS`` (``SLURM_NTASKS`` when that is absent).
    The main address is ``MASTER_ADDR`` when set, else the first host of
    ``SLURM_NODELIST`` (``SLURM_JOB_NODELIST`` when that is absent). The main port is
    ``MASTER_PORT`` when set, else ``15000 + SLURM_JOB_ID % 5000``: every task of the
    job computes the same port without communicating.

    Detected only where srun started the process (``SLURM_STEP_ID`` is set): in salloc's
    shell or a batch script that runs python directly, interlock's launcher starts the
    processes.
    """

    name = "slurm"

    @property
    def main_address(self) -> str:
        address = self.environ.get("MASTER_ADDR", "").strip()
        if address:
            return address
        name = "SLURM_NODELIST" if "SLURM_NODELIST" in self.environ else "SLURM_JOB_NODELIST"
        nodelist = read_str(self.name, self.environ, name)
        try:
            return first_host(nodelist)
        except ValueError as exc:
            raise ResolutionError(
                "invalid-environment",
                flag="environment",
                value=f"{name}={nodelist}",
                reason=f"the slurm environment cannot read the host list in {name}: {exc}; "
                "set MASTER_ADDR to the first node's host name.",
            ) from exc

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in self.environ:
            return read_port(self.name, self.environ, "MASTER_PORT")
        return port_from_job(self.name, self.environ, "SLURM_JOB_ID")

    def world_size(self) -> int:
        # the step's own count: with --preserve-env SLURM_NTASKS keeps the allocation's
        name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in self.environ else "SLURM_NTASKS"
        return read_int(self.name, self.environ, name, minimum=1)

    def global_rank(self) -> int:
        return read_int(self.name, self.environ, "SLURM_PROCID")

    def local_rank(self) -> int:
        return read_int(self.name, self.environ, "SLURM_LOCALID")

    def node_rank(self) -> int:
        return read_int(self.name, self.environ, "SLURM_NODEID")
