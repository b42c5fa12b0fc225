"""`DDPStrategy`: DistributedDataParallel with any of four launchers."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interlock.connector.builtin import BUILTIN_STRATEGIES
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.module_wrapper import StrategyModule
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.precision import Precision

if TYPE_CHECKING:
    from interlock.connector.planner import Plan

#: start method -> the registry name of that launch style: the first built-in DDP row
#: (in table order, presets left out) with that start method
DDP_NAMES: dict[str, str] = {}
for _spec in BUILTIN_STRATEGIES:
    if _spec.family == "ddp" and _spec.variant_of is None:
        DDP_NAMES.setdefault(str(_spec.options["start_method"]), _spec.name)
del _spec

#: start method -> launcher name, from the same rows
_LAUNCHER_OF = {
    str(s.options["start_method"]): str(s.launcher)
    for s in BUILTIN_STRATEGIES if s.family == "ddp" and s.launcher is not None
}


class DDPStrategy(ParallelStrategy):
    """Data parallel: a full replica per process, gradients averaged in backward.

    Args:
        start_method: ``"popen"`` re-runs the script per rank; ``"spawn"``, ``"fork"``
            and ``"forkserver"`` start worker processes from this one.
        find_unused_parameters, static_graph, gradient_as_bucket_view: passed to
            ``DistributedDataParallel``.
        backend: process-group backend; gloo on cpu and nccl on cuda by default.
        timeout: how long a collective waits for a missing rank before failing.
    """

    registry_name: ClassVar[str] = "ddp"

    def __init__(
        self,
        *,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device | str] | None = None,
        num_nodes: int | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        start_method: str = "popen",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        backend: str | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
        **ddp_kwargs: Any,
    ) -> None:
        if start_method not in DDP_NAMES:
            raise ValueError(
                f"start_method {start_method!r} is unknown; choose {', '.join(DDP_NAMES)}"
            )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            num_nodes=num_nodes, precision=precision, checkpoint_io=checkpoint_io,
            cluster_environment=cluster_environment, backend=backend, timeout=timeout,
        )
        self.start_method = start_method
        self.ddp_kwargs = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
            **ddp_kwargs,
        }

    @classmethod
    def from_plan(cls, plan: Plan) -> DDPStrategy:
        options: dict[str, Any] = dict(plan.spec.options)
        strategy = cls(**options)
        strategy.complete(plan)
        return strategy

    @property
    def name(self) -> str:
        """The registry name: its plan's, else that of its launch style."""
        return self.plan.strategy if self.plan is not None else DDP_NAMES[self.start_method]

    def _launcher_name(self) -> str:
        # the plan's launcher when there is a plan, else the table's for the start method
        planned = self.plan.launcher if self.plan is not None else None
        return planned or _LAUNCHER_OF[self.start_method]

    def wrap_module(self, module: nn.Module) -> nn.Module:
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Accumulate gradients locally: backward inside skips the all-reduce."""
        inner = module.forward_module if isinstance(module, StrategyModule) else module
        if not enabled or not isinstance(inner, DistributedDataParallel):
            yield
            return
        with inner.no_sync():
            yield
