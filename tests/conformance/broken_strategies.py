"""Deliberately broken strategies: each has one bug the conformance suite must catch.

Importing this module registers them (``--interlock-import broken_strategies``). Test
fixtures, not examples: they subclass DDPStrategy to change one behaviour each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

import interlock
from interlock import StrategySpec, registered
from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.strategies.ddp import DDPStrategy
from interlock.strategies.fsdp import FSDPStrategy
from interlock.strategies.model_parallel import ModelParallelStrategy
from interlock.strategies.module_wrapper import unwrap

T = TypeVar("T")


class SumsGradients(DDPStrategy):
    """Sums gradients across ranks instead of averaging them (a real bug class)."""

    def wrap_module(self, module: nn.Module) -> nn.Module:
        ddp = super().wrap_module(module)

        # unannotated: DDP compares the annotations with dist.GradBucket itself, and
        # this module's postponed annotations are strings
        def summed(state, bucket):  # type: ignore[no-untyped-def]
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            assert work is not None
            summed_future: torch.futures.Future[torch.Tensor] = work.get_future().then(
                lambda f: f.value()[0]
            )
            return summed_future

        ddp.register_comm_hook(None, summed)  # type: ignore[operator]
        return ddp


class GathersReversed(DDPStrategy):
    """all_gather returns the ranks' tensors in reverse order."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return super().all_gather(tensor).flip(0)


class LeaksProcessGroup(DDPStrategy):
    """teardown leaves the process group alive."""

    def teardown(self) -> None:
        self._collective._created = False  # the collective now thinks it owns nothing
        super().teardown()


class MiscountsWorld(DDPStrategy):
    """Once set up, reports one rank more than there is (its process group and data
    sharding stay right, so the bug is only in what it tells the framework)."""

    @property
    def world_size(self) -> int:
        return super().world_size + (1 if dist.is_initialized() else 0)

    @property
    def data_parallel_size(self) -> int:
        return super().world_size


class DropsOptimizerState(DDPStrategy):
    """Checkpoints lose the optimizer's per-parameter state."""

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        emptied: dict[str, Any] = {}
        for name, value in state.items():
            if isinstance(value, Optimizer):
                kept = value.state_dict()
                emptied[name] = _Emptied({"state": {}, "param_groups": kept["param_groups"]})
            else:
                emptied[name] = value
        super().save_checkpoint(path, emptied)


class CompressesUndeclared(DDPStrategy):
    """Rounds gradients to float16 in communication without declaring a tolerance."""

    def wrap_module(self, module: nn.Module) -> nn.Module:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp = super().wrap_module(module)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)  # type: ignore[operator]
        return ddp


class TearsDownOnce(DDPStrategy):
    """teardown destroys the process group without asking whether one still exists, so
    a second teardown raises."""

    def teardown(self) -> None:
        dist.destroy_process_group()
        self._collective._created = False  # destroyed here already
        super().teardown()


class ShardsNoData(DDPStrategy):
    """setup_dataloader hands the loader back as it is: every rank reads the whole
    dataset (the forgotten distributed sampler)."""

    def setup_dataloader(self, loader: Any, *, move_to_device: bool = True,
                         evaluation: bool = False) -> Any:
        return loader


class PrintsOnEveryRank(DDPStrategy):
    """strategy.print writes on every rank, not on rank 0 only."""

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)


class LoadsHalfway(DDPStrategy):
    """load_checkpoint restores the modules before it checks that every entry asked
    for is in the checkpoint, so a refused load leaves them half-loaded."""

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
        saved = self.checkpoint_io.load_checkpoint(path, map_location="cpu",
                                                   weights_only=weights_only)
        for name, target in state.items():
            if isinstance(target, nn.Module) and name in saved:
                unwrap(target).load_state_dict(saved[name])
        return super().load_checkpoint(path, state, weights_only=weights_only, verify=verify)


class DropsResult(DDPStrategy):
    """launch runs the function in every rank but returns None instead of rank 0's
    result."""

    def launch(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        super().launch(fn, *args, **kwargs)
        return cast(T, None)


class LosesOptimizerStateOnLoad(DDPStrategy):
    """load_checkpoint restores the modules but silently leaves every optimizer
    without its per-parameter state (a resumed AdamW starts its moments from zero)."""

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        **options: Any) -> dict[str, Any]:
        rest = super().load_checkpoint(path, state, **options)
        for value in state.values():
            if isinstance(value, Optimizer):
                value.state.clear()
        return rest


class ForgetsRandomState(DDPStrategy):
    """A load leaves every generator as it was: a resumed run draws other dropout
    masks."""

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        **options: Any) -> dict[str, Any]:
        from interlock.strategies import random_state

        before = random_state.capture(self.root_device)
        rest = super().load_checkpoint(path, state, **options)
        random_state.restore_own(before, self.root_device)
        return rest


class ReshufflesOnRestart(DDPStrategy):
    """The shuffle seed mixes in state that survives an attempt (here the attempt
    number): a restarted attempt reads the epoch in another order."""

    def setup_dataloader(self, loader: Any, **options: Any) -> Any:
        from interlock.strategies.restarts import restart_attempt

        self._loader_setups = restart_attempt()
        return super().setup_dataloader(loader, **options)


class UntiesOnLoad(DDPStrategy):
    """load_checkpoint gives a tied parameter (a head sharing the embedding's weight)
    a copy of its own, which the optimizer does not step."""

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        **options: Any) -> dict[str, Any]:
        rest = super().load_checkpoint(path, state, **options)
        for value in state.values():
            if not isinstance(value, nn.Module):
                continue
            seen: set[int] = set()
            for module in unwrap(value).modules():
                for name, param in list(module.named_parameters(recurse=False)):
                    if id(param) in seen:
                        setattr(module, name, nn.Parameter(param.detach().clone()))
                    seen.add(id(param))
        return rest


class _Emptied(dict[str, Any]):
    """A plain state dict standing in for an optimizer when saving."""


BROKEN = {
    "broken_sums_gradients": (SumsGradients, "fork"),
    "broken_gathers_reversed": (GathersReversed, "fork"),
    "broken_leaks_process_group": (LeaksProcessGroup, "popen"),
    "broken_miscounts_world": (MiscountsWorld, "fork"),
    "broken_drops_optimizer_state": (DropsOptimizerState, "fork"),
    "broken_compresses_undeclared": (CompressesUndeclared, "fork"),
    "broken_tears_down_once": (TearsDownOnce, "fork"),
    "broken_shards_no_data": (ShardsNoData, "fork"),
    "broken_prints_on_every_rank": (PrintsOnEveryRank, "fork"),
    "broken_loads_halfway": (LoadsHalfway, "fork"),
    "broken_drops_result": (DropsResult, "fork"),
    "correct_ddp_subclass": (DDPStrategy, "fork"),
    "broken_loses_optimizer_state_on_load": (LosesOptimizerStateOnLoad, "fork"),
    "broken_forgets_random_state": (ForgetsRandomState, "fork"),
    "broken_reshuffles_on_restart": (ReshufflesOnRestart, "fork"),
    "broken_unties_on_load": (UntiesOnLoad, "fork"),
}

#: the only ones declaring "elastic": the fault checks relaunch a strategy five times,
#: so they run where a test asks about them (tests/conformance/test_fault_checks.py)
ELASTIC = frozenset({"broken_loses_optimizer_state_on_load", "broken_forgets_random_state",
                     "broken_reshuffles_on_restart", "broken_unties_on_load"})


def _register() -> None:
    template = next(s for s in BUILTIN_STRATEGIES if s.name == "ddp_fork")
    for name, (cls, start_method) in BROKEN.items():
        if name in registered(StrategySpec):
            continue
        interlock.register(interlock.StrategySpec(
            name=name, factory=f"{__name__}:{cls.__name__}",
            description=f"deliberately broken: {cls.__doc__}", family="ddp",
            accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true", "bf16-mixed"}),
            launcher="subprocess" if start_method == "popen" else start_method,
            options={"start_method": start_method},
            capabilities=template.capabilities if name in ELASTIC
            else template.capabilities - {"elastic"},
        ))


class MeshIgnoresTensorParallel(ModelParallelStrategy):
    """data_parallel_rank counts every rank as its own replica: tensor-parallel
    neighbours read different batches."""

    @property
    def data_parallel_rank(self) -> int:
        return self.global_rank % self.data_parallel_size


class ClipsOneStage(ModelParallelStrategy):
    """clip_gradients_norm measures only this pipeline stage's gradients (torch's
    clip_grad_norm_ on the stage, without the reduction over pp)."""

    def clip_gradients_norm(self, module: nn.Module, optimizer: Optimizer, max_norm: float,
                            norm_type: float = 2.0) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm


class RescalesAccumulated(ModelParallelStrategy):
    """Under pp every pipeline step divides all gradients by the micro-batch count
    (torch's scale_grads=True), what earlier micro-steps accumulated included."""

    def forward_backward(self, module: nn.Module, inputs: Any, target: Any,
                         loss_fn: Callable[[Any, Any], torch.Tensor]) -> torch.Tensor:
        if int(self.parallelism.pp) > 1:
            with torch.no_grad():
                for param in module.parameters():
                    if param.grad is not None:
                        param.grad.div_(self.pipeline_microbatches)
        return super().forward_backward(module, inputs, target, loss_fn)


#: broken strategies of the model-parallel family (their bugs show on a mesh)
BROKEN_MESH: dict[str, type[ModelParallelStrategy]] = {
    "broken_mesh_ignores_tp": MeshIgnoresTensorParallel,
    "broken_clips_one_stage": ClipsOneStage,
    "broken_rescales_accumulated": RescalesAccumulated,
}
#: the pipeline ones declare pp (with dp_shard, its partner on the mesh)
_PIPELINED = frozenset({"broken_clips_one_stage", "broken_rescales_accumulated"})


def _register_mesh() -> None:
    template = next(s for s in BUILTIN_STRATEGIES if s.name == "model_parallel")
    for name, cls in BROKEN_MESH.items():
        if name in registered(StrategySpec):
            continue
        pipelined = name in _PIPELINED
        interlock.register(interlock.StrategySpec(
            name=name, factory=f"{__name__}:{cls.__name__}",
            description=f"deliberately broken: {cls.__doc__}", family="model_parallel",
            accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
            launcher="fork",
            parallel_dims=frozenset({"dp_shard", "pp" if pipelined else "tp"}),
            default_parallelism={"dp_shard": "auto"} if pipelined
            else {"tp": "node", "dp_shard": "auto"},
            capabilities=template.capabilities & {"accumulation", "clipping"}
            if pipelined else frozenset(),
        ))


class ClipsLocalShards(FSDPStrategy):
    """clip_gradients_norm measures only this rank's shards of the gradients, so each
    rank clips by its own norm (a sharded clip without the reduction)."""

    def clip_gradients_norm(self, module: nn.Module, optimizer: Optimizer, max_norm: float,
                            norm_type: float = 2.0) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        self.precision.unscale_gradients(optimizer)
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                 for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type)
                                                     for g in grads]), norm_type)
        coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coefficient)
        measured: torch.Tensor = norm
        return measured


def _register_fsdp() -> None:
    template = next(s for s in BUILTIN_STRATEGIES if s.name == "fsdp")
    if "broken_clips_local_shards" in registered(StrategySpec):
        return
    interlock.register(interlock.StrategySpec(
        name="broken_clips_local_shards", factory=f"{__name__}:ClipsLocalShards",
        description=f"deliberately broken: {ClipsLocalShards.__doc__}", family="fsdp",
        accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
        launcher="fork", precision_plugin="fsdp",
        capabilities=template.capabilities - {"elastic"},
        parallel_dims=frozenset({"dp_shard"}), default_parallelism={"dp_shard": "auto"},
    ))


class ClaimsSharding(DDPStrategy):
    """Registered with FSDP's memory traits (every state sharded over dp_shard), but a
    DDP underneath: every rank keeps the whole model, its gradients and its optimizer
    state. It trains exactly like DDP; only what it says of its memory is wrong."""


def _register_memory() -> None:
    if "broken_claims_sharding" in registered(StrategySpec):
        return
    interlock.register(interlock.StrategySpec(
        name="broken_claims_sharding", factory=f"{__name__}:ClaimsSharding",
        description=f"deliberately broken: {ClaimsSharding.__doc__}", family="ddp",
        accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true", "bf16-mixed"}),
        launcher="fork", options={"start_method": "fork"},
        parallel_dims=frozenset({"dp_shard"}), default_parallelism={"dp_shard": "auto"},
        memory=interlock.MemoryTraits(),
    ))


_register()
_register_mesh()
_register_fsdp()
_register_memory()
