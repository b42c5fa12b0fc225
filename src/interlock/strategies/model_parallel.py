"""`ModelParallelStrategy`: a user function parallelises the model over the plan's
N-D device mesh (pipeline, data, context and tensor parallel)."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from interlock.engine.parallelism import FLATTENED, Degree, Parallelism, fill
from interlock.strategies import checkpointing
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.module_wrapper import StrategyModule, unwrap
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.pipeline import (
    SCHEDULES,
    PipelineRunner,
    ScheduleName,
    SplitFn,
    refuse_ties_across_stages,
    split_sequential,
    tied_parameters,
)
from interlock.strategies.precision import Precision
from interlock.strategies.sharding import (
    broadcast_from_rank0,
    has_meta_tensors,
    materialize_meta,
    rank0_random_stream,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from interlock.strategies.parts import Parts

#: ``parallelize_fn(module, device_mesh) -> module``: applies tensor parallelism
#: (``parallelize_module`` on ``device_mesh["tp"]``), context parallel, and FSDP2
#: (``fully_shard`` on ``device_mesh["dp_shard"]``, or the 2-D
#: ``device_mesh["dp_replicate", "dp_shard"]`` for HSDP), in that order. Under pipeline
#: parallel it receives this rank's stage.
ParallelizeFn = Callable[[nn.Module, DeviceMesh], nn.Module]


class ModelParallelStrategy(ParallelStrategy):
    """A user function parallelises the model over the plan's device mesh, whose
    dimensions are `interlock.engine.parallelism.DIMS` (see ``docs/parallelism.md``).

    Ranks of one tensor-, context- or pipeline-parallel group see the same batch:
    shard data by :attr:`data_parallel_rank` over :attr:`data_parallel_size`, not by
    global rank.

    Args:
        parallelize_fn: called once per rank in :meth:`setup_module` with the module
            (this rank's pipeline stage, under pp > 1) and the full mesh; returns the
            parallelised module.
        data_parallel_size, tensor_parallel_size: the older spellings of
            ``parallelism={"dp_shard": ..., "tp": ...}``, translated by the engine
            (with a note); both ``"auto"`` keep the default (tensor parallel within a
            node, sharded data parallel across nodes).
        save_distributed_checkpoint: checkpoints as a distributed directory (True) or
            one full file gathered on rank 0 (False; not with pipeline parallel, whose
            stages hold different layers).
        pipeline_schedule: ``"1F1B"`` or ``"GPipe"`` (torch.distributed.pipelining).
        pipeline_microbatches: micro-batches per step under pp > 1 (default 2 x pp;
            1F1B needs at least pp); the batch must divide into them.
        pipeline_split_fn: ``fn(module, stage, num_stages) -> stage module`` keeping
            stage ``stage``'s layers under their own names; default: an
            ``nn.Sequential`` cut into runs of consecutive children, every stage
            with a fair share of the children that have parameters.
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
        pipeline_schedule: ScheduleName = "1F1B",
        pipeline_microbatches: int | None = None,
        pipeline_split_fn: SplitFn | None = None,
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
        if pipeline_schedule not in SCHEDULES:
            raise ValueError(f"ModelParallelStrategy(pipeline_schedule={pipeline_schedule!r})"
                             f": expected one of {', '.join(SCHEDULES)}")
        _check_microbatches(pipeline_microbatches)
        self.parallelize_fn = parallelize_fn
        self._requested = (data_parallel_size, tensor_parallel_size)
        self.pipeline_schedule = pipeline_schedule
        self._microbatches = pipeline_microbatches
        self.pipeline_split_fn = pipeline_split_fn or split_sequential
        if self.parallel_devices:  # checked now when the world is already known
            self._requested_layout()
        self.save_distributed_checkpoint = save_distributed_checkpoint

    def degree_options(self) -> dict[str, object]:
        """The older degree options as given (read by the engine, which translates
        them into the parallelism flag)."""
        return {"data_parallel_size": self._requested[0],
                "tensor_parallel_size": self._requested[1]}

    def _place(self, parts: Parts) -> None:
        super()._place(parts)
        self._check_layout()

    def _requested_layout(self) -> Parallelism:
        """The layout the older options ask for (or tensor parallel within a node and
        sharded data parallel across nodes), checked against the devices given at
        construction; the plan decides the layout itself.

        Raises:
            ResolutionError: ``invalid-parallelism`` (a ValueError) when they do not fit.
        """
        dp, tp = self._requested
        if dp == "auto" and tp == "auto":
            requested = Parallelism(tp=self.num_processes)
        else:
            requested = Parallelism(dp_shard=dp, tp=tp)
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"
        return fill(requested, self.world_size,
                    where=f"{nodes} x {self.num_processes} devices")

    def _check_layout(self) -> None:
        if int(self.parallelism.pp) > 1 and not self.save_distributed_checkpoint:
            raise ValueError(
                "ModelParallelStrategy(save_distributed_checkpoint=False) gathers one full "
                f"file on rank 0, but under pp={self.parallelism.pp} the pipeline stages "
                "hold different layers: keep save_distributed_checkpoint=True (a "
                "distributed checkpoint loads under any layout, single device included)"
            )

    @property
    def degrees(self) -> Parallelism:
        """The degrees of parallelism (every one an int); :attr:`parallelism`."""
        return self.parallelism

    @property
    def pipeline_microbatches(self) -> int:
        """Micro-batches per step under pipeline parallel."""
        return self._microbatches or 2 * int(self.parallelism.pp)

    @pipeline_microbatches.setter
    def pipeline_microbatches(self, value: int | None) -> None:
        """Micro-batches for the modules set up from now on (None: 2 x pp)."""
        _check_microbatches(value)
        self._microbatches = value

    @property
    def holds_every_parameter(self) -> bool:
        """False under pp > 1: each rank sets up its pipeline stage's layers only."""
        return int(self.parallelism.pp) == 1

    def setup_environment(self) -> None:
        self._check_layout()  # refuse a bad layout before any process group exists
        super().setup_environment()
        self.meshes  # noqa: B018 - built now, by every rank in step

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
        pp = int(self.parallelism.pp)
        stage = self.device_mesh["pp"].get_local_rank()
        if pp > 1:
            tied = tied_parameters(module)
            module = self.pipeline_split_fn(module, stage, pp)
            refuse_ties_across_stages(tied, module, stage=stage, num_stages=pp,
                                      group=self.device_mesh["pp"].get_group(),
                                      device=self.root_device)
        parallel = self.parallelize_fn(module, self.device_mesh)
        if not isinstance(parallel, nn.Module):
            raise TypeError(
                f"parallelize_fn returned {type(parallel).__name__}, not the nn.Module it "
                "parallelised"
            )
        self._check_data_parallel_sync(parallel)
        if on_meta:
            with rank0_random_stream(self.root_device):
                materialize_meta(parallel, self.root_device)
        if pp == 1:
            return parallel
        if self.pipeline_schedule == "1F1B" and self.pipeline_microbatches < pp:
            raise ValueError(
                f"the 1F1B schedule needs at least as many micro-batches as stages: "
                f"pipeline_microbatches={self.pipeline_microbatches} < pp={pp}"
            )
        return PipelineRunner(
            parallel, stage=stage, num_stages=pp, device=self.root_device,
            group=self.device_mesh["pp"].get_group(), schedule=self.pipeline_schedule,
            microbatches=self.pipeline_microbatches,
            forward_context=self.precision.forward_context,
        )

    def _check_data_parallel_sync(self, module: nn.Module) -> None:
        """Refuse parameters that ``parallelize_fn`` left unsynchronised over a
        data-parallel dimension of more than one rank.

        Those ranks read different batches (:attr:`data_parallel_rank`), so a
        parameter that nothing reduces over them trains a different replica on each.
        A parameter is synchronised over a dimension when it is a DTensor whose mesh
        spans it (FSDP2 over ``dp_shard``, HSDP over ``(dp_replicate, dp_shard)``) or
        sits in a module that DDP or ``replicate`` wraps.

        Raises:
            ValueError: naming the parameters and the dimensions they miss.
        """
        degrees = self.parallelism
        needed = [dim for dim in ("dp_replicate", "dp_shard") if int(getattr(degrees, dim)) > 1]
        if not needed:
            return
        replicated = _replicated_prefixes(module)
        missing: dict[str, list[str]] = {}
        for name, param in module.named_parameters():
            if any(name.startswith(prefix) for prefix in replicated):
                continue
            spans = _mesh_dims(param)
            for dim in needed:
                if dim not in spans:
                    missing.setdefault(dim, []).append(name)
        if not missing:
            return
        dims = ", ".join(missing)
        names = sorted({n for names in missing.values() for n in names})
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        mesh = ('device_mesh["dp_replicate", "dp_shard"] (HSDP)' if len(needed) == 2
                else f'device_mesh["{needed[0]}"]')
        raise ValueError(
            f"parallelize_fn left parameters not synchronised over {dims} "
            f"(parallelism {degrees.describe()}): {shown}. The ranks of {dims} read "
            "different batches, so these replicas would train apart. Apply fully_shard "
            f"to the module on {mesh} in parallelize_fn, or plan with "
            f"{' and '.join(f'{d}=1' for d in missing)}"
        )

    def setup_module(self, module: nn.Module) -> StrategyModule:
        """As for every strategy; under pp > 1 the returned module's state dict is this
        rank's stage (the layers of the others are `nn.Identity`)."""
        wrapped = super().setup_module(module)
        runner = wrapped.forward_module
        if isinstance(runner, PipelineRunner) and runner.stage_module is not wrapped.module:
            return StrategyModule(runner, runner.stage_module, self.precision)
        return wrapped

    def _pipeline_group(self) -> ProcessGroup | None:
        # each pipeline rank holds one stage: a gradient norm is combined over them
        return self.device_mesh["pp"].get_group() if int(self.parallelism.pp) > 1 else None

    def forward_backward(self, module: nn.Module, inputs: Any, target: Any,
                         loss_fn: Callable[[Any, Any], torch.Tensor]) -> torch.Tensor:
        """One training step's forward and backward; under pp > 1 through the
        pipeline schedule over :attr:`pipeline_microbatches` micro-batches."""
        runner = unwrap_runner(module)
        if runner is None:
            return super().forward_backward(module, inputs, target, loss_fn)
        inputs = self.precision.convert_input(inputs)
        return runner.step(inputs, target, loss_fn)

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


def unwrap_runner(module: nn.Module) -> PipelineRunner | None:
    """The pipeline runner inside a module ``setup_module`` returned, if any."""
    forward = getattr(module, "forward_module", module)
    return forward if isinstance(forward, PipelineRunner) else None


def _mesh_dims(param: torch.Tensor) -> set[str]:
    """The mesh dimensions a DTensor parameter spans (flattened groups and the older
    names expanded); none for a plain tensor."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return set()
    from interlock.strategies.mesh import OLDER_NAMES

    spans = {**{name: dims for name, (dims, _) in FLATTENED.items()}, **OLDER_NAMES}
    found: set[str] = set()
    for name in param.device_mesh.mesh_dim_names or ():
        found.update(spans.get(name, (name,)))
    return found


def _replicated_prefixes(module: nn.Module) -> list[str]:
    """Name prefixes of the submodules whose gradients DDP or composable ``replicate``
    all-reduces (their parameters are synchronised without being DTensors)."""
    from torch.distributed._composable.contract import _get_registry

    prefixes: list[str] = []
    for name, sub in module.named_modules():
        registry = _get_registry(sub) or {}
        if isinstance(sub, nn.parallel.DistributedDataParallel) or "replicate" in registry:
            prefixes.append(f"{name}." if name else "")
    return prefixes


def _check_microbatches(value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 1):
        raise ValueError(f"ModelParallelStrategy(pipeline_microbatches={value!r}): "
                         "expected an int >= 1")
