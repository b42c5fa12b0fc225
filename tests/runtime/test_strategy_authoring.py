"""What a strategy author relies on: option keys checked against the factory, DDP's
keyword pass-through checked against DistributedDataParallel, and `configure_ddp` as
the place for a communication hook."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pytest
import torch
import workloads
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import interlock
from interlock import Machine, ResolutionError, StrategySpec
from interlock.engine import registry
from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.strategies.ddp import DDPStrategy, ddp_parameters
from interlock.strategies.module_wrapper import StrategyModule

CPU = Machine()


@pytest.fixture
def registered() -> Iterator[list[StrategySpec]]:
    """Specs appended to the list are registered; all are unregistered afterwards."""
    added: list[StrategySpec] = []
    yield added
    for spec in added:
        registry.unregister(StrategySpec, spec.name)


def _spec(name: str, factory: str, options: Mapping[str, object]) -> StrategySpec:
    return StrategySpec(
        name=name, factory=factory, description="probe", family="other",
        accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
        launcher="fork", options=options,
    )


def _refusal(registered: list[StrategySpec], spec: StrategySpec) -> ResolutionError:
    interlock.register(spec)
    registered.append(spec)
    planned = interlock.plan(strategy=spec.name, devices=2, machine=CPU)  # plan() accepts
    with pytest.raises(ResolutionError) as info:
        planned.build()
    with pytest.raises(ResolutionError):
        interlock.resolve(strategy=spec.name, devices=2, machine=CPU)
    return info.value


def test_an_option_the_factory_does_not_take_is_refused_with_a_suggestion(
    registered: list[StrategySpec],
) -> None:
    error = _refusal(registered, _spec("fsdp_option_probe",
                                       "interlock.strategies.fsdp:FSDPStrategy",
                                       {"cpu_ofload": True}))
    assert (error.code, error.flag, error.value) == ("unknown-option", "strategy",
                                                     "fsdp_option_probe")
    assert error.suggestion == "cpu_offload" and "cpu_offload" in error.choices
    assert ("options give interlock.strategies.fsdp:FSDPStrategy the keyword 'cpu_ofload', "
            "which is not a parameter of FSDPStrategy. Did you mean 'cpu_offload'?"
            ) in str(error)


def test_an_option_naming_a_part_the_plan_provides_is_refused(
    registered: list[StrategySpec],
) -> None:
    error = _refusal(registered, _spec("ddp_part_option_probe",
                                       "interlock.strategies.ddp:DDPStrategy",
                                       {"start_method": "fork", "precision": "16-mixed"}))
    assert error.code == "unknown-option"
    assert "'precision'" in error.reason and "a part the plan provides" in error.reason


def test_ddp_options_are_checked_against_distributed_data_parallel(
    registered: list[StrategySpec],
) -> None:
    error = _refusal(registered, _spec("ddp_kwargs_probe",
                                       "interlock.strategies.ddp:DDPStrategy",
                                       {"start_method": "fork", "bucket_cap_mv": 5}))
    assert (error.code, error.value, error.suggestion) == (
        "unknown-option", "ddp_kwargs_probe", "bucket_cap_mb")
    assert "DistributedDataParallel" in error.reason


def test_accepted_ddp_options_reach_distributed_data_parallel(
    registered: list[StrategySpec],
) -> None:
    spec = _spec("ddp_kwargs_ok_probe", "interlock.strategies.ddp:DDPStrategy",
                 {"start_method": "fork", "bucket_cap_mb": 5, "broadcast_buffers": False})
    interlock.register(spec)
    registered.append(spec)
    strategy = interlock.resolve(strategy=spec.name, devices=2, machine=CPU)
    assert isinstance(strategy, DDPStrategy)
    assert strategy.ddp_kwargs["bucket_cap_mb"] == 5
    assert strategy.ddp_kwargs["broadcast_buffers"] is False


class KwargsDDP(DDPStrategy):
    """A subclass written the ordinary Python way: its constructor passes **kwargs on."""

    def __init__(self, *, note: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.note = note


def test_a_subclass_passing_kwargs_on_takes_the_options_of_its_parents(
    registered: list[StrategySpec],
) -> None:
    spec = _spec("kwargs_subclass_probe", f"{__name__}:KwargsDDP",
                 {"start_method": "fork", "note": "mine", "bucket_cap_mb": 5})
    interlock.register(spec)
    registered.append(spec)
    strategy = interlock.resolve(strategy=spec.name, devices=2, machine=CPU)
    assert isinstance(strategy, KwargsDDP)
    assert (strategy.start_method, strategy.note) == ("fork", "mine")
    assert strategy.ddp_kwargs["bucket_cap_mb"] == 5
    # what neither the subclass, DDPStrategy nor DistributedDataParallel takes: refused
    error = _refusal(registered, _spec("kwargs_subclass_bad_probe", f"{__name__}:KwargsDDP",
                                       {"start_method": "fork", "bucket_cap_mv": 5}))
    assert (error.code, error.suggestion) == ("unknown-option", "bucket_cap_mb")


def test_ddp_strategy_refuses_unknown_keywords_at_construction() -> None:
    with pytest.raises(ResolutionError) as info:
        DDPStrategy(start_method="fork", find_unused_paramters=True)
    assert (info.value.code, info.value.value) == ("unknown-option", "ddp_fork")
    assert info.value.suggestion == "find_unused_parameters"
    with pytest.raises(ResolutionError, match="'device_ids' is set by the strategy"):
        DDPStrategy(device_ids=[0])
    assert "module" not in ddp_parameters() and "bucket_cap_mb" in ddp_parameters()
    assert DDPStrategy(static_graph=True, bucket_cap_mb=1).ddp_kwargs["bucket_cap_mb"] == 1


def _plain_factory(plan: Any) -> Any:  # a function factory reads options itself
    return DDPStrategy(start_method="fork")


def test_a_function_factory_reads_its_options_itself(registered: list[StrategySpec]) -> None:
    spec = _spec("function_factory_probe", f"{__name__}:_plain_factory", {"anything": 1})
    interlock.register(spec)
    registered.append(spec)
    assert isinstance(interlock.resolve(strategy=spec.name, devices=2, machine=CPU),
                      DDPStrategy)


class CountingDDP(DDPStrategy):
    """Averages gradients through a communication hook that counts its calls."""

    registry_name: ClassVar[str] = "ddp_fork"

    def configure_ddp(self, ddp_module: DistributedDataParallel) -> None:
        state = {"calls": 0}
        self.hook_state = state

        # unannotated: DDP checks a hook's annotations against dist.GradBucket, and
        # this module's postponed annotations are strings
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            state["calls"] += 1
            return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

        ddp_module.register_comm_hook(state, hook)


def _train_and_count(strategy: CountingDDP) -> dict[str, Any]:
    module = strategy.setup_module(workloads.model())
    assert isinstance(module, StrategyModule)
    x, y = workloads.batch(0)
    share = x.chunk(strategy.world_size)[strategy.global_rank]
    target = y.chunk(strategy.world_size)[strategy.global_rank]
    loss = torch.nn.functional.mse_loss(module(share), target)
    strategy.backward(loss, module)
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    return {"calls": strategy.hook_state["calls"],
            "wrapped": isinstance(module.forward_module, DistributedDataParallel),
            "grads": strategy.collective.all_gather_object(grads)}


@pytest.mark.timeout(120)
def test_configure_ddp_registers_a_hook_on_every_rank() -> None:
    strategy = interlock.resolve(strategy=CountingDDP(start_method="fork"),
                                 accelerator="cpu", devices=2, machine=CPU)
    assert isinstance(strategy, CountingDDP)
    result = strategy.launch(_train_and_count)
    assert result["wrapped"], "wrap_module no longer returns the DistributedDataParallel"
    assert result["calls"] >= 1, "configure_ddp's hook never ran"
    rank0, rank1 = result["grads"]
    for a, b in zip(rank0, rank1, strict=True):
        torch.testing.assert_close(a, b, msg="the hook's all-reduce left ranks apart")


@pytest.mark.parametrize("spec", [s for s in BUILTIN_STRATEGIES if s.options],
                         ids=lambda s: s.name)
def test_every_builtin_rows_options_are_taken_by_its_factory(spec: StrategySpec) -> None:
    from interlock.strategies.build import check_options, load_factory

    check_options(spec, load_factory(spec))
