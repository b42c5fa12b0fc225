"""`FSDPStrategy`: fully sharded data parallel on FSDP2 (``fully_shard``).

Each rank keeps ``1/world_size`` of every parameter, gradient and optimizer state; a
sharded module gathers its full parameters just before its forward and backward and
frees them again after (``reshard_after_forward``). Runs on cuda over nccl and on the
CPU over gloo.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
)

from interlock.strategies import checkpointing
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.module_wrapper import unwrap
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.precision import Precision
from interlock.strategies.precision.fsdp import FSDPPrecision
from interlock.strategies.sharding import (
    apply_activation_checkpointing,
    broadcast_from_rank0,
    has_meta_tensors,
    materialize_meta,
    rank0_random_stream,
)

#: which submodules get their own ``fully_shard`` call (the root always gets one): a
#: set of module classes, or a predicate over modules
WrapPolicy = Iterable[type[nn.Module]] | Callable[[nn.Module], bool]

StateDictType = Literal["full", "sharded"]


class FSDPStrategy(ParallelStrategy):
    """Fully sharded data parallel: parameters sharded over the ``dp_shard`` ranks,
    and, with ``parallelism={"dp_replicate": R, ...}``, replicated R times (HSDP: each
    replica sharded within its group, gradients averaged across replicas).

    Args:
        auto_wrap_policy: module classes (or a predicate) whose instances are sharded
            as separate units: each gathers its parameters only while it runs, which
            is what bounds peak memory. None shards the root module as one unit.
        activation_checkpointing: module classes whose activations are recomputed in
            backward instead of kept.
        reshard_after_forward: free gathered parameters after forward (True), keep
            them until backward (False), or reshard to a smaller group of this size.
        cpu_offload: keep shards, gradients and optimizer state in CPU memory between
            uses (needs an accelerator to offload from: cuda).
        state_dict_type: checkpoints as one ``"full"`` file (gathered on rank 0, the
            DDP layout) or a ``"sharded"`` directory (torch.distributed.checkpoint).
        backend, timeout: as for every parallel strategy.
    """

    registry_name: ClassVar[str] = "fsdp"
    materializes_meta: ClassVar[bool] = True

    def __init__(
        self,
        *,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device | str] | None = None,
        num_nodes: int | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        auto_wrap_policy: WrapPolicy | None = None,
        activation_checkpointing: Iterable[type[nn.Module]] | None = None,
        reshard_after_forward: bool | int = True,
        cpu_offload: bool = False,
        state_dict_type: str = "full",
        backend: str | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        if state_dict_type not in ("full", "sharded"):
            raise ValueError(
                f"FSDPStrategy(state_dict_type={state_dict_type!r}): expected 'full' or "
                "'sharded'"
            )
        if not isinstance(reshard_after_forward, bool) and (
            not isinstance(reshard_after_forward, int) or reshard_after_forward < 1
        ):
            raise ValueError(
                f"FSDPStrategy(reshard_after_forward={reshard_after_forward!r}): expected a "
                "bool or a group size >= 1"
            )
        super().__init__(
            accelerator=accelerator, parallel_devices=parallel_devices, num_nodes=num_nodes,
            precision=precision, checkpoint_io=checkpoint_io,
            cluster_environment=cluster_environment, backend=backend, timeout=timeout,
        )
        self.auto_wrap_policy = _as_predicate(auto_wrap_policy)
        self.activation_checkpointing = tuple(activation_checkpointing or ())
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.state_dict_type: StateDictType = (
            "sharded" if state_dict_type == "sharded" else "full"
        )

    @property
    def name(self) -> str:
        if self.plan is not None:
            return self.plan.strategy
        return "fsdp_cpu_offload" if self.cpu_offload else "fsdp"

    @property
    def shard_mesh(self) -> DeviceMesh:
        """What ``fully_shard`` gets: the 2-D ``(dp_replicate, dp_shard)`` mesh for HSDP
        (replicas of a sharded model) when dp_replicate > 1, else the 1-D ``dp_shard``
        mesh."""
        if int(self.parallelism.dp_replicate) > 1:
            return self.device_mesh["dp_replicate", "dp_shard"]
        return self.meshes["dp_shard"]

    def setup_environment(self) -> None:
        if self.cpu_offload and self.root_device.type == "cpu":
            raise ValueError(
                "FSDPStrategy(cpu_offload=True) offloads from an accelerator to CPU memory; "
                "on the CPU there is nothing to offload: use strategy='fsdp'"
            )
        super().setup_environment()
        self.meshes  # noqa: B018 - built now, by every rank in step

    # ----------------------------------------------------------------- modules

    def wrap_module(self, module: nn.Module) -> nn.Module:
        on_meta = has_meta_tensors(module)
        broadcast_from_rank0(module)  # one starting point, whatever each rank built
        apply_activation_checkpointing(module, self.activation_checkpointing)
        options = self._shard_options()
        # children before parents: a unit's parameters are those no inner unit took
        for sub in reversed(list(module.modules())[1:]):
            if self.auto_wrap_policy(sub):
                fully_shard(sub, **options)
        fully_shard(module, **options)
        if on_meta:
            with rank0_random_stream(self.root_device):
                materialize_meta(module, torch.device("cpu") if self.cpu_offload
                                 else self.root_device)
        return module

    def _shard_options(self) -> dict[str, Any]:
        precision = self.precision
        policy = (precision.mixed_precision_policy if isinstance(precision, FSDPPrecision)
                  else None)
        options: dict[str, Any] = {
            "mesh": self.shard_mesh,
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": policy or MixedPrecisionPolicy(),
        }
        if self.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        return options

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Accumulate unsharded gradients locally; the first backward outside reduces
        the accumulated sum."""
        inner = unwrap(module)
        if not enabled or not isinstance(inner, FSDPModule):
            yield
            return
        inner.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            inner.set_requires_gradient_sync(True)

    # ----------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """Save ``state`` as one full file (``state_dict_type="full"``, the layout every
        strategy loads) or a distributed checkpoint directory (``"sharded"``)."""
        checkpointing.save(self, path, state, distributed=self.state_dict_type == "sharded")

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
        """Load a full file or a distributed checkpoint directory saved at any world size."""
        return checkpointing.load(self, path, state, weights_only=weights_only, verify=verify)


def _as_predicate(policy: WrapPolicy | None) -> Callable[[nn.Module], bool]:
    if policy is None:
        return lambda module: False
    if callable(policy) and not isinstance(policy, type):
        return policy
    classes = tuple(policy)  # type: ignore[arg-type]
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(
                f"auto_wrap_policy: expected nn.Module classes or a callable, got {cls!r}"
            )
    return lambda module: isinstance(module, classes)
