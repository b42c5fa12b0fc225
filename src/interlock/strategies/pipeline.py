"""Pipeline parallel on `torch.distributed.pipelining`: stages, a schedule, a step.

A model is cut into ``pp`` stages of consecutive layers. Each pipeline rank keeps the
whole module's structure but only its own stage's layers (the others are replaced by
`torch.nn.Identity`, which has no parameters), so every parameter keeps its name:
a distributed checkpoint saved by the stages together is the whole model's, loadable
under any other layout.

A pipeline cannot run forward and backward separately: ``strategy.forward_backward``
runs one training step's forward and backward over all micro-batches (see
`PipelineRunner.step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

#: ``split_fn(module, stage, num_stages) -> stage_module``: keeps the layers of stage
#: ``stage`` (0-based) and replaces the others with modules without parameters
SplitFn = Callable[[nn.Module, int, int], nn.Module]

#: the schedules offered, by the name an option gives
SCHEDULES: tuple[str, ...] = ("1F1B", "GPipe")
ScheduleName = Literal["1F1B", "GPipe"]


def split_sequential(module: nn.Module, stage: int, num_stages: int) -> nn.Module:
    """The default split: an `nn.Sequential` cut into ``num_stages`` runs of
    consecutive children, as even as possible (earlier stages take one more).

    Raises:
        ValueError: ``module`` is not an `nn.Sequential`, or has fewer children than
            stages.
    """
    if not isinstance(module, nn.Sequential):
        raise ValueError(
            f"pipeline parallel splits an nn.Sequential by default, not a "
            f"{type(module).__name__}: pass ModelParallelStrategy(pipeline_split_fn="
            "fn(module, stage, num_stages) -> stage module)"
        )
    layers = len(module)
    if layers < num_stages:
        raise ValueError(
            f"pp={num_stages} stages, but the model has {layers} layer"
            f"{'s' if layers != 1 else ''} (children of its nn.Sequential); every stage "
            f"needs at least one: choose pp <= {layers}"
        )
    size, extra = divmod(layers, num_stages)
    first = stage * size + min(stage, extra)
    last = first + size + (1 if stage < extra else 0)
    for index in range(layers):
        if not first <= index < last:
            module[index] = nn.Identity()
    return module


class PipelineRunner(nn.Module):
    """One pipeline stage and its schedule: what ``setup_module`` returns under pp > 1.

    Calling it like a module is refused (a pipeline's forward needs the backward of
    the same step); `step` runs both.
    """

    def __init__(self, stage_module: nn.Module, *, stage: int, num_stages: int,
                 device: torch.device, group: dist.ProcessGroup, schedule: ScheduleName,
                 microbatches: int,
                 forward_context: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        super().__init__()
        self.stage_module = stage_module
        self.stage_index = stage
        self.num_stages = num_stages
        self._device = device
        self._group = group
        self._schedule_name = schedule
        self.microbatches = microbatches
        self._forward_context = forward_context
        self._schedules: dict[int, Any] = {}

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "a pipeline-parallel module runs forward and backward together: call "
            "strategy.forward_backward(module, inputs, target, loss_fn) for a training "
            "step instead of module(inputs)"
        )

    def _schedule(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        key = id(loss_fn)
        if key not in self._schedules:
            stage = PipelineStage(self.stage_module, self.stage_index, self.num_stages,
                                  self._device, group=self._group)
            kind = Schedule1F1B if self._schedule_name == "1F1B" else ScheduleGPipe
            # scale_grads: each micro-batch's gradient is divided by their number, so a
            # step equals one over the whole batch with a mean loss
            self._schedules = {key: (kind(stage, n_microbatches=self.microbatches,
                                          loss_fn=loss_fn, scale_grads=True), loss_fn)}
        return self._schedules[key][0]

    def step(self, inputs: torch.Tensor | None, target: torch.Tensor | None,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Forward and backward of one batch over all micro-batches; every stage
        returns the batch's mean loss (computed on the last stage, sent to the others).

        Args:
            inputs: the batch (read on the first stage; every stage may pass it).
            target: the targets (read on the last stage).
            loss_fn: ``loss_fn(output, target)``, a mean over the micro-batch.
        """
        if self.is_first and inputs is not None and inputs.shape[0] % self.microbatches:
            raise ValueError(
                f"a batch of {inputs.shape[0]} does not split into {self.microbatches} "
                "micro-batches of equal size: make the batch a multiple of "
                "pipeline_microbatches"
            )
        schedule = self._schedule(loss_fn)
        losses: list[torch.Tensor] = []
        with self._forward_context():
            if self.is_first and self.is_last:
                schedule.step(inputs, target=target, losses=losses)
            elif self.is_first:
                schedule.step(inputs)
            elif self.is_last:
                schedule.step(target=target, losses=losses)
            else:
                schedule.step()
        loss = (torch.stack([x.detach().float() for x in losses]).mean() if losses
                else torch.zeros((), device=self._device))
        # the last stage has the loss; the others learn it (ranks of the pp group are
        # global ranks, the last stage's is the group's last)
        last = dist.get_global_rank(self._group, self.num_stages - 1)
        dist.broadcast(loss, src=last, group=self._group)
        return loss


def pipeline_mesh_rank(mesh: DeviceMesh) -> int:
    """This rank's stage: its coordinate on the mesh's ``pp`` dimension."""
    return mesh["pp"].get_local_rank()


@contextlib.contextmanager
def no_context() -> Iterator[None]:
    yield
