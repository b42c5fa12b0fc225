"""`ModelParallelStrategy`: tensor parallelism and FSDP2 over a 2-D device mesh."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule

from interlock.strategies import checkpointing
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.mesh import Degree, MeshDegrees
from interlock.strategies.module_wrapper import unwrap
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.precision import Precision
from interlock.strategies.sharding import (
    broadcast_from_rank0,
    has_meta_tensors,
    materialize_meta,
    rank0_random_stream,
)

if TYPE_CHECKING:
    from interlock.strategies.parts import Parts

#: ``parallelize_fn(module, device_mesh) -> module``: applies tensor parallelism
#: (``torch.distributed.tensor.parallel.parallelize_module`` on
#: ``device_mesh["tensor_parallel"]``) and/or FSDP2 (``fully_shard`` on
#: ``device_mesh["data_parallel"]``), in that order
ParallelizeFn = Callable[[nn.Module, DeviceMesh], nn.Module]

#: the mesh's dimension names, outermost first
MESH_DIMS = ("data_parallel", "tensor_parallel")


class ModelParallelStrategy(ParallelStrategy):
    """A user function parallelises the model over a ``(data_parallel, tensor_parallel)``
    device mesh.

    Ranks in the same tensor-parallel group see the same batch: shard data by
    :attr:`data_parallel_rank` over :attr:`data_parallel_size`, not by global rank.

    Args:
        parallelize_fn: called once per rank in :meth:`setup_module` with the module
            and the 2-D mesh; returns the parallelised module.
        data_parallel_size, tensor_parallel_size: mesh degrees, or ``"auto"`` (tensor
            parallel within a node, data parallel across nodes). Their product must
            be the world size.
        save_distributed_checkpoint: checkpoints as a distributed directory (True) or
            one full file gathered on rank 0 (False).
        backend, timeout: as for every parallel strategy.
    """

    registry_name: ClassVar[str] = "model_parallel"
    materializes_meta: ClassVar[bool] = True

    def __init__(
        self,
        *,
        parallelize_fn: ParallelizeFn | None = None,
        data_parallel_size: Degree = "auto",
        tensor_parallel_size: Degree = "auto",
        save_distributed_checkpoint: bool = True,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device | str] | None = None,
        num_nodes: int | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        backend: str | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(
            accelerator=accelerator, parallel_devices=parallel_devices, num_nodes=num_nodes,
            precision=precision, checkpoint_io=checkpoint_io,
            cluster_environment=cluster_environment, backend=backend, timeout=timeout,
        )
        if parallelize_fn is not None and not callable(parallelize_fn):
            raise TypeError(
                f"ModelParallelStrategy(parallelize_fn={parallelize_fn!r}): expected a "
                "function (module, device_mesh) -> module"
            )
        self.parallelize_fn = parallelize_fn
        self._requested = (data_parallel_size, tensor_parallel_size)
        if self.parallel_devices:  # checked now when the world is already known
            self._degrees()
        self.save_distributed_checkpoint = save_distributed_checkpoint
        self._mesh: DeviceMesh | None = None

    def _place(self, parts: Parts) -> None:
        super()._place(parts)
        self._degrees()  # a split that does not fit the planned world fails at resolve

    def _degrees(self) -> MeshDegrees:
        return MeshDegrees.resolve(
            data_parallel=self._requested[0], tensor_parallel=self._requested[1],
            world_size=self.world_size, devices_per_node=self.num_processes,
        )

    @property
    def degrees(self) -> MeshDegrees:
        """The resolved mesh degrees (``"auto"`` filled in)."""
        return self._degrees()

    @property
    def device_mesh(self) -> DeviceMesh:
        """The ``(data_parallel, tensor_parallel)`` mesh (after :meth:`setup_environment`)."""
        if self._mesh is None:
            raise RuntimeError(
                "ModelParallelStrategy has no device mesh before setup_environment()"
            )
        return self._mesh

    @property
    def data_parallel_size(self) -> int:
        return self.degrees.data_parallel

    @property
    def data_parallel_rank(self) -> int:
        # mesh coordinates: rank = dp_rank * tp + tp_rank
        return self.global_rank // self.degrees.tensor_parallel

    def setup_environment(self) -> None:
        degrees = self._degrees()  # refuse a bad split before any process group exists
        super().setup_environment()
        if self._mesh is None:
            self._mesh = init_device_mesh(
                self.root_device.type, (degrees.data_parallel, degrees.tensor_parallel),
                mesh_dim_names=MESH_DIMS,
            )

    def teardown(self) -> None:
        self._mesh = None
        super().teardown()

    # ----------------------------------------------------------------- modules

    def wrap_module(self, module: nn.Module) -> nn.Module:
        if self.parallelize_fn is None:
            raise ValueError(
                "ModelParallelStrategy needs a parallelize_fn(module, device_mesh) that "
                "applies tensor parallelism and/or fully_shard: pass "
                "strategy=ModelParallelStrategy(parallelize_fn=...) to interlock.resolve()"
            )
        on_meta = has_meta_tensors(module)
        broadcast_from_rank0(module)  # one starting point, whatever each rank built
        parallel = self.parallelize_fn(module, self.device_mesh)
        if not isinstance(parallel, nn.Module):
            raise TypeError(
                f"parallelize_fn returned {type(parallel).__name__}, not the nn.Module it "
                "parallelised"
            )
        if on_meta:
            with rank0_random_stream(self.root_device):
                materialize_meta(parallel, self.root_device)
        return parallel

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Skip the data-parallel gradient reduction of every FSDP2 unit inside."""
        units = [m for m in unwrap(module).modules() if isinstance(m, FSDPModule)]
        if not enabled or not units:
            yield
            return
        for unit in units:
            unit.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.set_requires_gradient_sync(True, recurse=False)

    # ----------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """A distributed checkpoint directory, or one full file gathered on rank 0."""
        checkpointing.save(self, path, state, distributed=self.save_distributed_checkpoint)

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
        """Load a distributed checkpoint directory (any mesh) or a full file."""
        return checkpointing.load(self, path, state, weights_only=weights_only, verify=verify)
