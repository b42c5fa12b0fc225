"""`ParallelStrategy`: one process per device over a torch.distributed group."""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from interlock.engine.parallelism import MeshLayout, Parallelism
from interlock.engine.registry import registered
from interlock.engine.tables import AcceleratorRow
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.base import Strategy
from interlock.strategies.collectives import Collective, TorchCollective
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.launchers import Launcher, launcher_for
from interlock.strategies.launchers.base import (
    ERROR_FILE_ENV,
    RANK0_SERVES_ENV,
    RENDEZVOUS_ENV,
    environment_variables,
)
from interlock.strategies.launchers.rendezvous import connect_store
from interlock.strategies.precision import Precision
from interlock.strategies.uneven import ReturnWatch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from interlock.strategies.mesh import Meshes
    from interlock.strategies.parts import Parts

#: Process-group timeout unless the strategy is given one: long enough for slow
#: checkpoints, finite so that a rank that never arrives becomes an error, not a hang.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)

#: The methods that need the strategy's process group: each one (and every override a
#: subclass defines) first checks that the group exists, and refuses with
#: :class:`NotSetUpError` before any side effect (a checkpoint file, a moved module).
NEEDS_PROCESS_GROUP: tuple[str, ...] = (
    "all_reduce", "all_gather", "broadcast", "barrier", "reduce_boolean_decision",
    "setup_module", "setup_module_and_optimizers", "save_checkpoint",
)

_F = TypeVar("_F", bound=Callable[..., Any])


class NotSetUpError(RuntimeError):
    """A multi-process strategy was asked for something that needs its process group
    in a process where it has none: before :meth:`~ParallelStrategy.setup_environment`
    (which :meth:`~interlock.strategies.base.Strategy.launch` calls in every process it
    starts), or after :meth:`~ParallelStrategy.teardown`."""


def _requires_process_group(method: _F) -> _F:
    """``method`` preceded by the process-group check (applied once per function)."""
    if getattr(method, "_interlock_needs_group", False):
        return method

    @functools.wraps(method)
    def checked(self: ParallelStrategy, *args: Any, **kwargs: Any) -> Any:
        if not self.collective.is_initialized:
            raise NotSetUpError(_not_set_up_message(self, method.__name__))
        return method(self, *args, **kwargs)

    checked._interlock_needs_group = True  # type: ignore[attr-defined]
    return cast(_F, checked)


def _not_set_up_message(strategy: ParallelStrategy, method: str) -> str:
    return (
        f"{type(strategy).__name__}.{method}() needs the process group that the strategy "
        "creates in each of its processes, and this process has none. Call it inside "
        "the function given to strategy.launch(fn), which starts the processes and runs "
        "fn(strategy, ...) in each of them; in processes that a launcher started "
        "(torchrun, srun, mpirun), call strategy.setup_environment() first."
    )


class ParallelStrategy(Strategy):
    """The rank bookkeeping and process-group setup every multi-process strategy shares.

    The methods named in :data:`NEEDS_PROCESS_GROUP` raise :class:`NotSetUpError`
    where the strategy has no process group (before launch, or after teardown), in
    subclasses that override them too.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in NEEDS_PROCESS_GROUP:
            if name in cls.__dict__:
                setattr(cls, name, _requires_process_group(cls.__dict__[name]))

    def __init__(
        self,
        *,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device | str] | None = None,
        num_nodes: int | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        backend: str | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision,
                         checkpoint_io=checkpoint_io, cluster_environment=cluster_environment)
        if parallel_devices is not None and not parallel_devices:
            raise ValueError("a parallel strategy needs at least one device")
        self.parallel_devices = [torch.device(d) for d in parallel_devices or ()]
        if self.parallel_devices:
            self._given["devices"] = tuple(str(d) for d in self.parallel_devices)
        if num_nodes is not None:
            self._given["num_nodes"] = num_nodes
        self.num_nodes = num_nodes or 1
        self._backend = backend
        self.timeout = timeout
        self._collective = TorchCollective()
        self._exported: ExitStack | None = None
        self._return_watch: ReturnWatch | None = None
        self._meshes: Meshes | None = None

    def _place(self, parts: Parts) -> None:
        # what the constructor was not given follows the (latest) plan
        if "devices" not in self._given:
            self.parallel_devices = list(parts.parallel_devices)
        if "num_nodes" not in self._given:
            self.num_nodes = parts.num_nodes

    def _make_launcher(self) -> Launcher | None:
        # the devices' kind; a strategy built by hand without devices (XLAStrategy())
        # says its plan's accelerator, else "cpu"
        device_type = (self.parallel_devices[0].type if self.parallel_devices
                       else self.plan.accelerator if self.plan is not None else "cpu")
        return launcher_for(self._launcher_row(), num_processes=self.num_processes,
                            num_nodes=self.num_nodes, cluster=self.cluster_environment,
                            device_type=device_type)

    @property
    def collective(self) -> Collective:
        return self._collective

    @property
    def backend(self) -> str:
        """gloo for cpu, nccl for cuda, unless given."""
        if self._backend is not None:
            return self._backend
        return registered(AcceleratorRow)[self.parallel_devices[0].type].backend

    @property
    def num_processes(self) -> int:
        """How many processes run on each node: one per device in ``parallel_devices``."""
        return len(self.parallel_devices)

    @property
    def global_rank(self) -> int:
        return self.cluster_environment.global_rank()

    @property
    def local_rank(self) -> int:
        return self.cluster_environment.local_rank()

    @property
    def node_rank(self) -> int:
        return self.cluster_environment.node_rank()

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[self.local_rank]

    # ----------------------------------------------------------------- the mesh

    @property
    def parallelism(self) -> Parallelism:
        """The degrees of parallelism, every one an int: the plan's (a strategy built
        by hand is completed first)."""
        self.complete_by_hand()
        assert self.plan is not None
        return self.plan.parallelism

    @property
    def mesh_layout(self) -> MeshLayout:
        """The device mesh's dimensions (outermost first) and sizes."""
        return MeshLayout.of(self.parallelism)

    @property
    def meshes(self) -> Meshes:
        """The device mesh and its flattened groups by name (``"tp"``, ``"dp"``,
        ``"dp_shard_cp"``, ...), built on first use after :meth:`setup_environment`
        (a collective: every rank must ask, in the same order)."""
        if self._meshes is None:
            if not self._collective.owns_group:
                raise NotSetUpError(
                    f"{type(self).__name__} has no device mesh before setup_environment() "
                    "(launch() calls it in every process it starts)"
                )
            from interlock.strategies.mesh import build_meshes

            self._meshes = build_meshes(self.root_device.type, self.mesh_layout)
        return self._meshes

    @property
    def device_mesh(self) -> DeviceMesh:
        """The device mesh, one dimension per name of
        `interlock.engine.parallelism.DIMS`; flattened groups through :attr:`meshes`."""
        return self.meshes.root

    @property
    def data_parallel_size(self) -> int:
        """dp_replicate x dp_shard: the ranks that see different batches."""
        return self.parallelism.data_parallel

    @property
    def data_parallel_rank(self) -> int:
        """This rank's place in the data-loading group ``dp`` (ranks of one
        tensor-, context- or pipeline-parallel group share it)."""
        return self.mesh_layout.flattened("dp", self.global_rank)[0]

    def setup_environment(self) -> None:
        if self._collective.owns_group:
            return  # set up already: idempotent
        if self._collective.is_initialized:
            raise RuntimeError(
                "a torch.distributed process group already exists in this process and "
                "this strategy did not create it; destroy it (or tear the other strategy "
                "down) before setting this one up"
            )
        self.cluster_environment.validate_settings(self.num_processes, self.num_nodes)
        self.accelerator.setup_device(self.root_device)
        rendezvous = os.environ.get(RENDEZVOUS_ENV)
        store = None
        if rendezvous:
            serve = self.global_rank == 0 and os.environ.get(RANK0_SERVES_ENV) == "1"
            store = connect_store(rendezvous, self.timeout, serve=serve)
        else:  # processes made by a cluster launcher: torch's env:// rendezvous
            cluster = self.cluster_environment
            self._export({"MASTER_ADDR": cluster.main_address,
                          "MASTER_PORT": str(cluster.main_port)})
        self._collective.setup(backend=self.backend, rank=self.global_rank,
                               world_size=self.world_size, store=store, timeout=self.timeout)
        self._return_watch = ReturnWatch(self.global_rank, self.world_size)
        self._return_watch.start()

    def _announce_return(self) -> None:
        if self._return_watch is not None:
            self._return_watch.returned()

    def _explain_failure(self, exc: BaseException) -> BaseException | None:
        return self._return_watch.explain(exc) if self._return_watch is not None else None

    def _announce_failure(self, exc: BaseException) -> int | None:
        # Only a launcher that names the first process to exit needs this (mpirun,
        # srun, torchrun); interlock's own launchers give their workers an error file
        # (the script launcher's children run under "external" too) and compare the
        # recorded failure times.
        named_by_exit = (self._launcher_name() == "external"
                         and ERROR_FILE_ENV not in os.environ)
        if self._return_watch is None or not named_by_exit:
            return None
        return self._return_watch.failed(exc)

    def _export(self, values: dict[str, str]) -> None:
        """Set variables for torch, restored at teardown."""
        self._exported = ExitStack()
        self._exported.enter_context(environment_variables(values))

    def teardown(self) -> None:
        self._meshes = None
        if self._return_watch is not None:
            self._return_watch.stop()
            self._return_watch = None
        self._collective.teardown()
        if self._exported is not None:
            self._exported.close()
            self._exported = None
        if self._cluster_environment is not None:
            self._cluster_environment.teardown()
        super().teardown()


# The methods ParallelStrategy inherits from Strategy get the check here; those a
# subclass defines get it in __init_subclass__.
for _name in NEEDS_PROCESS_GROUP:
    if _name not in ParallelStrategy.__dict__:
        setattr(ParallelStrategy, _name, _requires_process_group(getattr(Strategy, _name)))
del _name
