"""resolve(), Plan.build() and the builder: wiring strategies from plans, names and
instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

import interlock
from interlock import Machine, ResolutionError, StrategySpec
from interlock.engine import registry
from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.tables import ACCELERATOR_NAMES
from interlock.strategies.accelerators import CPUAccelerator, accelerator_for
from interlock.strategies.build import build_strategy
from interlock.strategies.ddp import DDP_NAMES, DDPStrategy
from interlock.strategies.environments import LocalEnvironment, TorchElasticEnvironment
from interlock.strategies.io import TorchCheckpointIO
from interlock.strategies.launchers import ExternalLauncher
from interlock.strategies.precision import MixedPrecision, Precision
from interlock.strategies.single_device import SingleDeviceStrategy

CPU = Machine()


def test_every_accelerator_row_builds_an_accelerator_of_its_name() -> None:
    for name in ACCELERATOR_NAMES:
        assert accelerator_for(name).name == name


@pytest.mark.parametrize("name", sorted(
    n for n, s in interlock.registered(interlock.StrategySpec).items() if s.family == "ddp"))
def test_every_ddp_name_builds_with_the_planned_launcher(name: str) -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy=name, machine=CPU)
    assert isinstance(strategy, DDPStrategy)
    assert strategy.plan is not None and strategy.plan.strategy == name
    assert strategy.launcher is not None and strategy.launcher.name == strategy.plan.launcher
    assert strategy.name == name
    unused = strategy.plan.spec.options.get("find_unused_parameters", False)
    assert strategy.ddp_kwargs["find_unused_parameters"] is unused
    assert [str(d) for d in strategy.parallel_devices] == ["cpu", "cpu"]
    assert strategy.world_size == 2 and strategy.backend == "gloo"


def test_single_device_builds_and_runs_in_process() -> None:
    strategy = interlock.resolve(machine=CPU)
    assert isinstance(strategy, SingleDeviceStrategy) and strategy.launcher is None
    assert strategy.launch(lambda s: (s.world_size, str(s.root_device))) == (1, "cpu")


def test_plugins_become_the_strategys_parts() -> None:
    io = TorchCheckpointIO()
    precision = MixedPrecision("bf16-mixed", "cpu")
    strategy = interlock.resolve(accelerator="cpu", devices=2, plugins=[io, precision],
                                 machine=CPU)
    assert strategy.checkpoint_io is io and strategy.precision is precision


def test_an_external_cluster_gives_the_external_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"TORCHELASTIC_RUN_ID": "r", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "GROUP_WORLD_SIZE": "1", "RANK": "1", "LOCAL_RANK": "1", "GROUP_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_spawn")
    assert isinstance(strategy.launcher, ExternalLauncher)
    assert isinstance(strategy.cluster_environment, TorchElasticEnvironment)
    assert (strategy.global_rank, strategy.local_rank, strategy.world_size) == (1, 1, 2)


def test_a_strategy_instance_is_completed_from_the_plan() -> None:
    mine = DDPStrategy(start_method="spawn", find_unused_parameters=True)
    strategy = interlock.resolve(strategy=mine, accelerator="cpu", devices=2, machine=CPU)
    assert strategy is mine
    assert mine.plan is not None and mine.plan.strategy == "ddp_spawn"
    assert mine.launcher is not None and mine.launcher.name == "spawn"
    assert mine.ddp_kwargs["find_unused_parameters"] is True
    assert isinstance(mine.accelerator, CPUAccelerator) and len(mine.parallel_devices) == 2


def test_parts_given_to_an_instance_are_kept() -> None:
    precision = MixedPrecision("bf16-mixed", "cpu")
    mine = DDPStrategy(precision=precision, parallel_devices=["cpu", "cpu"])
    strategy = interlock.resolve(strategy=mine, accelerator="cpu", machine=CPU)
    assert strategy.precision is precision and strategy.plan is not None
    assert strategy.plan.precision == "bf16-mixed" and strategy.plan.world_size == 2


@pytest.mark.parametrize(
    ("instance", "flags", "flag"),
    [
        (lambda: DDPStrategy(precision=MixedPrecision("bf16-mixed", "cpu")),
         {"precision": "16-mixed"}, "precision"),
        (lambda: DDPStrategy(precision=Precision()), {"plugins": MixedPrecision("bf16-mixed",
                                                                              "cpu")},
         "precision"),
        (lambda: DDPStrategy(accelerator=CPUAccelerator()), {"accelerator": "cpu"},
         "accelerator"),
        (lambda: DDPStrategy(parallel_devices=["cpu", "cpu"]), {"devices": 2}, "devices"),
        (lambda: DDPStrategy(cluster_environment=LocalEnvironment()),
         {"plugins": [LocalEnvironment()]}, "plugins"),
        (lambda: DDPStrategy(checkpoint_io=TorchCheckpointIO()),
         {"plugins": [TorchCheckpointIO()]}, "plugins"),
        (lambda: DDPStrategy(num_nodes=4), {"num_nodes": 2}, "num_nodes"),
        (lambda: DDPStrategy(parallel_devices=["cpu", "cpu"]),
         {"accelerator": "cuda", "machine": Machine(cuda_devices=2)}, "accelerator"),
    ],
)
def test_a_part_set_twice_is_a_conflict(instance: Callable[[], DDPStrategy],
                                        flags: dict[str, Any], flag: str) -> None:
    with pytest.raises(ResolutionError) as info:
        interlock.resolve(strategy=instance(), **{"machine": CPU, **flags})
    assert (info.value.code, info.value.flag) == ("conflicting-flags", flag), str(info.value)


def test_an_accelerator_instance_is_used_as_given() -> None:
    accelerator = CPUAccelerator()
    strategy = interlock.resolve(accelerator=accelerator, devices=2, machine=CPU)
    assert strategy.accelerator is accelerator


@pytest.mark.parametrize("spec", BUILTIN_STRATEGIES, ids=lambda s: s.name)
def test_every_builtin_row_builds_its_strategy(spec: StrategySpec) -> None:
    machine = {
        "xla": interlock.Machine(xla_devices=8, packages=frozenset({"torch_xla"})),
        "cuda": interlock.Machine(cuda_devices=2, packages=frozenset({"deepspeed"})),
    }.get(next(iter(sorted(spec.accelerators - {"cpu"}) or ["cpu"])), CPU)
    devices = 1 if spec.max_devices == 1 else -1
    strategy = build_strategy(interlock.plan(strategy=spec.name, devices=devices,
                                             machine=machine))
    assert type(strategy).__name__ == spec.factory.rpartition(":")[2]
    assert strategy.name == spec.name and strategy.plan is not None


def test_a_missing_implementation_is_named_with_the_strategy() -> None:
    spec = StrategySpec(
        name="ddp_missing_module_probe", factory="interlock_nonexistent.module:Strategy",
        description="probe", family="ddp", accelerators=frozenset({"cpu"}),
        precisions=frozenset({"32-true"}), launcher="fork",
    )
    interlock.register(spec)
    try:
        p = interlock.plan(accelerator="cpu", devices=2, strategy=spec.name, machine=CPU)
        with pytest.raises(ImportError, match="strategy 'ddp_missing_module_probe' is "
                           "implemented by"):
            p.build()
    finally:
        registry.unregister(StrategySpec, spec.name)


def test_a_third_party_strategy_builds_through_its_factory() -> None:
    spec = StrategySpec(
        name="ddp_thirdparty_probe", factory="interlock.strategies.ddp:DDPStrategy",
        description="probe", family="ddp", accelerators=frozenset({"cpu"}),
        precisions=frozenset({"32-true"}), launcher="fork",
        options={"start_method": "fork"},
    )
    interlock.register(spec)
    try:
        strategy = interlock.resolve(strategy="ddp_thirdparty_probe", devices=2, machine=CPU)
        assert isinstance(strategy, DDPStrategy) and strategy.start_method == "fork"
    finally:
        registry.unregister(StrategySpec, "ddp_thirdparty_probe")


def test_ddp_names_cover_the_launch_styles() -> None:
    # the row of each launch style's name starts its ranks with that start method, and
    # an instance built by hand with it stands for that name and launcher
    for start_method, name in DDP_NAMES.items():
        built = interlock.resolve(strategy=name, accelerator="cpu", devices=2, machine=CPU)
        assert isinstance(built, DDPStrategy) and built.start_method == start_method
        by_hand = DDPStrategy(start_method=start_method)
        assert by_hand.name == name
        assert by_hand._launcher_name() == built.plan.launcher  # type: ignore[union-attr]


def test_an_instances_num_nodes_and_device_kind_are_adopted() -> None:
    mine = DDPStrategy(num_nodes=2, start_method="spawn")
    strategy = interlock.resolve(strategy=mine, accelerator="cpu", devices=2, machine=CPU)
    assert strategy.plan is not None and strategy.plan.world_size == 4
    assert strategy.world_size == 4
    kinds = DDPStrategy(parallel_devices=["cpu", "cpu"])
    assert interlock.plan(strategy=kinds, machine=Machine(cuda_devices=2)).accelerator == "cpu"


def test_resolving_an_instance_again_follows_the_new_plan() -> None:
    mine = DDPStrategy(start_method="fork")
    interlock.resolve(strategy=mine, accelerator="cpu", devices=2, machine=CPU)
    launcher = mine.launcher
    interlock.resolve(strategy=mine, accelerator="cpu", devices=3, machine=CPU)
    assert len(mine.parallel_devices) == 3 and mine.world_size == 3
    assert mine.launcher is not launcher and mine.launcher is not None


class _NotAPrecision:
    interlock_part_kind: ClassVar[str] = "precision"
    precision = "32-true"


class _NotAStrategy:
    interlock_part_kind: ClassVar[str] = "strategy"
    name = "ddp"

    def given_parts(self) -> dict[str, object]:
        return {}


def test_stand_ins_are_refused_when_building() -> None:
    with pytest.raises(ResolutionError, match="does not derive from interlock"):
        interlock.resolve(plugins=[_NotAPrecision()], machine=CPU)
    with pytest.raises(ResolutionError, match="does not derive from interlock"):
        interlock.resolve(strategy=_NotAStrategy(), devices=2, machine=CPU)


def test_a_foreign_process_group_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        strategy = interlock.resolve(accelerator="cpu", devices=1, strategy="ddp", machine=CPU)
        with pytest.raises(RuntimeError, match="did not create it"):
            strategy.setup_environment()
    finally:
        dist.destroy_process_group()
