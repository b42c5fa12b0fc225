"""The Plan is the only handoff: a strategy built from a plan holds exactly the parts the
plan names, and never chooses one again (the XLA strategies used to pick their own
checkpoint IO and drop a plugin the user passed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import Machine, Plan, StrategySpec
from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.strategies.base import Strategy
from interlock.strategies.build import build_strategy
from interlock.strategies.ddp import DDPStrategy
from interlock.strategies.environments import LocalEnvironment
from interlock.strategies.io import TorchCheckpointIO
from interlock.strategies.io.xla_io import XLACheckpointIO
from interlock.strategies.xla import SingleDeviceXLAStrategy, XLAFSDPStrategy, XLAStrategy

CPU = Machine()
#: a TPU host as the engine sees it; building needs no torch_xla (it is imported only
#: when a strategy sets up), so these tests run anywhere
TPU = Machine(xla_devices=8, packages=frozenset({"torch_xla"}))
GPUS = Machine(cuda_devices=2, packages=frozenset({"deepspeed"}))


class RecordingIO(TorchCheckpointIO):
    """A checkpoint IO plugin of the user's own: torch.save files, and a log of saves."""

    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any) -> None:
        self.saved.append(str(path))
        super().save_checkpoint(checkpoint, path)


def _machine_for(spec: StrategySpec) -> Machine:
    if "xla" in spec.accelerators:
        return TPU
    return GPUS if "cpu" not in spec.accelerators or spec.requires else CPU


def _names(strategy: Strategy) -> dict[str, object]:
    """The strategy's parts, by the names a Plan uses for them."""
    launcher = strategy.launcher
    return {
        "launcher": launcher.name if launcher is not None else None,
        "cluster_environment": strategy.cluster_environment.name,
        "precision": strategy.precision.precision,
        "checkpoint_io": getattr(type(strategy.checkpoint_io), "name",
                                 type(strategy.checkpoint_io).__name__),
    }


def _planned(plan: Plan) -> dict[str, object]:
    return {"launcher": plan.launcher, "cluster_environment": plan.cluster_environment,
            "precision": plan.precision, "checkpoint_io": plan.checkpoint_io}


@pytest.mark.parametrize("spec", BUILTIN_STRATEGIES, ids=lambda s: s.name)
def test_a_strategy_built_from_a_plan_holds_the_parts_the_plan_names(
    spec: StrategySpec,
) -> None:
    machine = _machine_for(spec)
    devices = 1 if spec.max_devices == 1 else (2 if machine is CPU else -1)
    plan = interlock.plan(strategy=spec.name, devices=devices, machine=machine)
    strategy = build_strategy(plan)
    assert strategy.plan is plan
    assert _names(strategy) == _planned(plan), plan.explain()


@pytest.mark.parametrize("name", ["xla", "xla_fsdp", "single_xla"])
def test_a_checkpoint_io_plugin_is_used_as_given_by_the_xla_strategies(name: str) -> None:
    io = RecordingIO()
    devices = 1 if name == "single_xla" else 8
    strategy = interlock.resolve(strategy=name, devices=devices, plugins=[io], machine=TPU)
    assert strategy.plan is not None and strategy.plan.checkpoint_io == "RecordingIO"
    assert strategy.checkpoint_io is io, (
        f"{type(strategy).__name__} replaced the checkpoint IO plugin the user passed "
        f"with {type(strategy.checkpoint_io).__name__}"
    )


@pytest.mark.parametrize("cls", [XLAStrategy, XLAFSDPStrategy, SingleDeviceXLAStrategy])
def test_an_xla_instance_takes_its_checkpoint_io_from_the_plan(cls: type[Strategy]) -> None:
    # an instance given no checkpoint IO has none of its own: a plugin is no conflict,
    # and without one the plan's (xla) is used
    devices = 1 if cls is SingleDeviceXLAStrategy else 8
    assert "checkpoint_io" not in cls().given_parts()
    io = RecordingIO()
    with_plugin = interlock.resolve(strategy=cls(), devices=devices, plugins=[io], machine=TPU)
    assert with_plugin.checkpoint_io is io
    planned = interlock.resolve(strategy=cls(), devices=devices, machine=TPU)
    assert planned.plan is not None and planned.plan.checkpoint_io == "xla"
    assert type(planned.checkpoint_io) is XLACheckpointIO


def test_a_checkpoint_io_plugin_writes_the_checkpoints(tmp_path: Path) -> None:
    io = RecordingIO()
    strategy = interlock.resolve(plugins=[io], machine=CPU)
    strategy.launch(lambda s: s.save_checkpoint(tmp_path / "ckpt.pt", {"step": 3}))
    assert io.saved == [str(tmp_path / "ckpt.pt")]
    assert strategy.load_checkpoint(tmp_path / "ckpt.pt", {"step": 0}) == {}


def test_the_launcher_follows_the_plan_not_the_start_method() -> None:
    # a row whose launcher disagrees with its start method: the plan's launcher wins
    spec = StrategySpec(
        name="ddp_handoff_probe", factory="interlock.strategies.ddp:DDPStrategy",
        description="probe", family="ddp", accelerators=frozenset({"cpu"}),
        precisions=frozenset({"32-true"}), launcher="fork",
        options={"start_method": "spawn"},
    )
    interlock.register(spec)
    try:
        strategy = interlock.resolve(strategy=spec.name, devices=2, machine=CPU)
        assert isinstance(strategy, DDPStrategy) and strategy.launcher is not None
        assert strategy.launcher.name == "fork"
    finally:
        interlock.unregister(interlock.StrategySpec, spec.name)


def test_an_external_plan_gives_the_external_launcher_whatever_the_class_uses() -> None:
    # a LocalEnvironment plugin that says another launcher created the processes
    env = LocalEnvironment({"LOCAL_RANK": "0", "INTERLOCK_RENDEZVOUS": "127.0.0.1:1"})
    strategy = interlock.resolve(strategy="xla", devices=8, plugins=[env], machine=TPU)
    assert strategy.plan is not None and strategy.plan.launcher == "external"
    assert strategy.launcher is not None and strategy.launcher.name == "external"


def test_a_strategy_built_by_hand_completes_through_a_plan_of_its_own() -> None:
    """No defaults of its own: the first part it was not given comes from
    ``plan(strategy=self)``, the plan ``resolve(strategy=self)`` would make."""
    plain = DDPStrategy(parallel_devices=["cpu", "cpu"])
    assert plain.plan is None
    assert plain.launcher is not None and plain.launcher.name == "subprocess"
    assert plain.plan is not None
    resolved = interlock.resolve(strategy=DDPStrategy(parallel_devices=["cpu", "cpu"]))
    assert resolved.plan is not None
    for field in ("strategy", "accelerator", "precision", "parallel_devices", "launcher",
                  "cluster_environment", "checkpoint_io", "parallelism"):
        assert getattr(plain.plan, field) == getattr(resolved.plan, field), field
    spawn = DDPStrategy(parallel_devices=["cpu", "cpu"], start_method="spawn")
    assert type(spawn.checkpoint_io) is TorchCheckpointIO  # any part completes it
    assert spawn.plan is not None and spawn.plan.strategy == "ddp_spawn"
    assert spawn.launcher is not None and spawn.launcher.name == "spawn"
    # what it was given stays; the plan fills in the rest
    env = LocalEnvironment({})
    given = DDPStrategy(parallel_devices=["cpu", "cpu"], cluster_environment=env)
    assert given.cluster_environment is env and given.plan is None
    assert type(given.accelerator).__name__ == "CPUAccelerator" and given.plan is not None
    assert given.cluster_environment is env
    # a strategy this machine cannot run is refused with the engine's reason
    with pytest.raises(interlock.ResolutionError) as info:
        XLAStrategy().launcher  # noqa: B018 - the property completes the strategy
    assert info.value.code == "unsupported-accelerator"


def test_plan_build_hands_the_plan_to_the_same_builder() -> None:
    plan = interlock.plan(accelerator="cpu", devices=2, machine=CPU)
    built = plan.build()
    assert isinstance(built, DDPStrategy) and built.plan is plan


class _NameReadsAPart(DDPStrategy):
    """A broken subclass: its name depends on a part the plan is to give."""

    @property
    def name(self) -> str:
        return "ddp" if self.precision is not None else "ddp_spawn"


def test_a_strategy_whose_name_reads_a_part_is_refused_not_planned_forever() -> None:
    broken = _NameReadsAPart(parallel_devices=["cpu", "cpu"])
    with pytest.raises(RuntimeError, match="asked for one of its parts while the engine "
                       "was planning it"):
        broken.launcher  # noqa: B018 - the property completes the strategy
    assert broken.plan is None
    with pytest.raises(RuntimeError, match="while the engine was planning it"):
        broken.launcher  # noqa: B018 - and again: the guard was reset
