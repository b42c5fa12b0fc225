"""`MPIEnvironment`: processes started by ``mpirun``/``mpiexec``; mpi4py is not needed."""

from __future__ import annotations

from interlock.engine.errors import ResolutionError
from interlock.engine.tables import OPEN_MPI_VARIABLES, PMI_VARIABLES
from interlock.strategies.environments._external import ExternalEnvironment
from interlock.strategies.environments._variables import (
    port_from_job,
    read_int,
    read_port,
)

#: Variables identifying the job, identical in every rank of it: PMIx's namespace (Open MPI
#: 5, PRRTE, srun --mpi=pmix) and Open MPI 4's launcher URI and job id.
JOB_ID_VARIABLES = ("PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid")

#: The single-node port when no job identifier is exported (torch's customary default).
DEFAULT_PORT = 29500


class MPIEnvironment(ExternalEnvironment):
    """Ranks from the variables the MPI launcher exports to every process.

    Open MPI's ``OMPI_COMM_WORLD_*`` are read when present, else ``PMI_RANK``,
    ``PMI_SIZE``, ``MPI_LOCALRANKID`` and ``MPI_LOCALNRANKS``. Ranks are assumed to be
    placed in blocks of the local size (the launchers' default by-slot mapping), so the
    node rank is ``global_rank // local_size``.

    A job on several nodes needs ``MASTER_ADDR`` and ``MASTER_PORT`` (for example
    ``mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500``): nothing in the MPI
    variables names rank 0's host. On a single node the address defaults to
    ``127.0.0.1`` and the port is derived from the first of :data:`JOB_ID_VARIABLES`
    that is set (identical in all ranks of a job, different between jobs), else
    :data:`DEFAULT_PORT`; set ``MASTER_PORT`` to run two such jobs on one host.
    """

    name = "mpi"

    def _names(self) -> tuple[str, str, str, str]:
        return OPEN_MPI_VARIABLES if OPEN_MPI_VARIABLES[0] in self.environ else PMI_VARIABLES

    def local_size(self) -> int:
        """Number of ranks on this node."""
        return read_int(self.name, self.environ, self._names()[3], minimum=1)

    def num_nodes(self) -> int:
        """Number of nodes the job spans."""
        return -(-self.world_size() // self.local_size())

    def _require_on_many_nodes(self, name: str) -> None:
        nodes = self.num_nodes()
        if nodes > 1:
            raise ResolutionError(
                "invalid-environment",
                flag="environment",
                value=f"{name} (unset)",
                reason=f"the MPI job spans {nodes} nodes, and nothing in the MPI variables "
                f"names rank 0's host; export MASTER_ADDR and MASTER_PORT to every rank "
                "(mpirun -x MASTER_ADDR=<rank 0 host> -x MASTER_PORT=<free port>).",
            )

    @property
    def main_address(self) -> str:
        address = self.environ.get("MASTER_ADDR", "").strip()
        if address:
            return address
        self._require_on_many_nodes("MASTER_ADDR")
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in self.environ:
            return read_port(self.name, self.environ, "MASTER_PORT")
        self._require_on_many_nodes("MASTER_PORT")
        for name in JOB_ID_VARIABLES:
            if self.environ.get(name, "").strip():
                return port_from_job(self.name, self.environ, name)
        return DEFAULT_PORT

    def world_size(self) -> int:
        return read_int(self.name, self.environ, self._names()[0], minimum=1)

    def global_rank(self) -> int:
        return read_int(self.name, self.environ, self._names()[1])

    def local_rank(self) -> int:
        return read_int(self.name, self.environ, self._names()[2])

    def node_rank(self) -> int:
        return self.global_rank() // self.local_size()
