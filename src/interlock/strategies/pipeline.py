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
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

#: ``split_fn(module, stage, num_stages) -> stage_module``: keeps the layers of stage
#: ``stage`` (0-based) and replaces the others with modules without parameters
SplitFn = Callable[[nn.Module, int, int], nn.Module]

#: the schedules offered, by the name an option gives
SCHEDULES: tuple[str, ...] = ("1F1B", "GPipe")
ScheduleName = Literal["1F1B", "GPipe"]


def split_sequential(module: nn.Module, stage: int, num_stages: int) -> nn.Module:
    """The default split: an `nn.Sequential` cut into ``num_stages`` runs of
    consecutive children, each holding as even a share of the layers with parameters
    as can be (earlier stages take one more). A child without parameters (an
    activation, dropout) goes with the layer before it, so no stage is left with
    nothing to train; those before the first such layer go to the first stage.

    Raises:
        ValueError: ``module`` is not an `nn.Sequential`, or has fewer layers with
            parameters than stages.
    """
    if not isinstance(module, nn.Sequential):
        raise ValueError(
            f"pipeline parallel splits an nn.Sequential by default, not a "
            f"{type(module).__name__}: pass ModelParallelStrategy(pipeline_split_fn="
            "fn(module, stage, num_stages) -> stage module)"
        )
    children = list(module)
    weighted = [i for i, child in enumerate(children)
                if any(True for _ in child.parameters())]
    if len(weighted) < num_stages:
        names = ", ".join(type(children[i]).__name__ for i in weighted) or "none"
        raise ValueError(
            f"pp={num_stages} stages, but the model has {len(weighted)} layer"
            f"{'s' if len(weighted) != 1 else ''} with parameters (children of its "
            f"nn.Sequential: {names}); every stage needs at least one to train: choose "
            f"pp <= {len(weighted)}, or pass a pipeline_split_fn"
        )
    size, extra = divmod(len(weighted), num_stages)
    starts = [0]  # where each stage's run of children begins
    for s in range(1, num_stages):
        starts.append(weighted[s * size + min(s, extra)])
    first = starts[stage]
    last = starts[stage + 1] if stage + 1 < num_stages else len(children)
    for index in range(len(children)):
        if not first <= index < last:
            module[index] = nn.Identity()
    return module


def tied_parameters(module: nn.Module) -> list[tuple[str, ...]]:
    """The names of each parameter that ``module`` holds under more than one name
    (tied weights: a language model's embedding and output head)."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [tuple(group) for group in names.values() if len(group) > 1]


def refuse_ties_across_stages(tied: list[tuple[str, ...]], stage_module: nn.Module, *,
                              stage: int, num_stages: int, group: dist.ProcessGroup,
                              device: torch.device) -> None:
    """Refuse a split that puts one tied parameter on more than one stage.

    Each such stage would keep a copy of its own, updated by that stage's gradient
    only: the copies drift apart from the first step, and nothing says so. Every stage
    learns where each tied parameter landed (one small all-reduce over the pipeline
    group) and all of them raise alike.

    Raises:
        ValueError: naming the tied names and the stages that hold them.
    """
    if not tied:
        return
    held = {name for name, _ in stage_module.named_parameters(remove_duplicate=False)}
    where = torch.zeros(num_stages, len(tied), dtype=torch.int64)
    for index, names in enumerate(tied):
        where[stage, index] = int(any(name in held for name in names))
    where = where.to(device)
    dist.all_reduce(where, group=group)
    for index, names in enumerate(tied):
        stages = [s for s in range(num_stages) if int(where[s, index])]
        if len(stages) > 1:
            raise ValueError(
                f"{' and '.join(names)} are one parameter (tied weights), but the "
                f"pipeline split puts it on stages {', '.join(map(str, stages))}: each "
                "stage would train its own copy from its own gradient, and the copies "
                "would drift apart silently. Pipeline parallel does not keep weights "
                "tied across stages: untie them (give each layer its own parameter), or "
                "pass a pipeline_split_fn that keeps the tied layers on one stage"
            )


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
        self._schedules: dict[str, Any] = {}
        self._loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

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

    def _batch_shapes(self, inputs: torch.Tensor | None,
                      target: torch.Tensor | None) -> tuple[int, ...]:
        """The shapes of this step's batch as every stage sees them: the first stage's
        inputs and the last stage's targets, agreed over the pipeline group (one small
        all-reduce), so that every stage decides alike whether its schedule still fits.
        """
        width = 1 + _MAX_DIMS
        mine = torch.full((2, width), -1, dtype=torch.int64)
        for row, tensor, holds in ((0, inputs, self.is_first), (1, target, self.is_last)):
            if holds and isinstance(tensor, torch.Tensor):
                dims = list(tensor.shape)[:_MAX_DIMS]
                mine[row, 0] = tensor.numel()
                mine[row, 1:1 + len(dims)] = torch.tensor(dims, dtype=torch.int64)
        agreed = mine.to(self._device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self._group)
        return tuple(int(v) for v in agreed.flatten().tolist())

    def _schedule(self, shapes: tuple[int, ...]) -> tuple[Any, bool]:
        """The schedule for batches of ``shapes``, and whether it was built now.

        Built once and kept while the batch shape stays: a new `PipelineStage` infers
        its shapes by a real forward and backward, after which torch clears the
        gradients of FSDP2 units (gradients accumulated by earlier steps would be lost).
        """
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        if self._schedules.get("shapes") == shapes:
            return self._schedules["schedule"], False
        stage = PipelineStage(self.stage_module, self.stage_index, self.num_stages,
                              self._device, group=self._group)
        kind = Schedule1F1B if self._schedule_name == "1F1B" else ScheduleGPipe
        count = self.microbatches

        def scaled(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            # Each micro-batch's loss is divided by their number, so a step equals one
            # over the whole batch with a mean loss. Not scale_grads=True: the schedule
            # would divide every .grad at the end of the step, gradients accumulated
            # by earlier steps (gradient accumulation) included.
            loss_fn = self._loss_fn
            if loss_fn is None:
                raise RuntimeError("the pipeline schedule ran outside PipelineRunner.step")
            return loss_fn(output, target) / count

        schedule = kind(stage, n_microbatches=count, loss_fn=scaled, scale_grads=False)
        self._schedules = {"shapes": shapes, "schedule": schedule}
        return schedule, True

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
        schedule, fresh = self._schedule(self._batch_shapes(inputs, target))
        self._loss_fn = loss_fn
        # a schedule built now clears FSDP2 gradients: what earlier steps accumulated
        # is set aside and added back
        carried = _set_aside_gradients(self.stage_module) if fresh else {}
        losses: list[torch.Tensor] = []
        try:
            with self._forward_context():
                if self.is_first and self.is_last:
                    schedule.step(inputs, target=target, losses=losses)
                elif self.is_first:
                    schedule.step(inputs)
                elif self.is_last:
                    schedule.step(target=target, losses=losses)
                else:
                    schedule.step()
        finally:
            self._loss_fn = None
            _add_back_gradients(carried)
        # the losses recorded are the scaled ones: their sum is the batch's mean loss
        loss = (torch.stack([x.detach().float() for x in losses]).sum() if losses
                else torch.zeros((), device=self._device))
        # the last stage has the loss; the others learn it (ranks of the pp group are
        # global ranks, the last stage's is the group's last)
        last = dist.get_global_rank(self._group, self.num_stages - 1)
        dist.broadcast(loss, src=last, group=self._group)
        return loss


#: dimensions of a batch's shape compared when deciding whether a schedule still fits
_MAX_DIMS = 7


def _set_aside_gradients(module: nn.Module) -> dict[nn.Parameter, torch.Tensor]:
    """Take the gradients off ``module``'s parameters (they are None after this)."""
    carried: dict[nn.Parameter, torch.Tensor] = {}
    for param in module.parameters():
        if param.grad is not None:
            carried[param] = param.grad
            param.grad = None
    return carried


@torch.no_grad()
def _add_back_gradients(carried: dict[nn.Parameter, torch.Tensor]) -> None:
    """Add gradients set aside by `_set_aside_gradients` to what the parameters hold."""
    for param, grad in carried.items():
        if param.grad is None:
            param.grad = grad
        else:
            param.grad.add_(grad)


