"""The launcher as an axis: ``plan(strategy=..., launcher=...)``, launch-style names as
presets of ``ddp``, launcher rows that name the strategies they start, and presets a
package registers (`StrategyPreset`)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest

import interlock
from interlock import (
    LauncherRow,
    Machine,
    PackageRow,
    PrecisionRow,
    RegistrationError,
    ResolutionError,
    StrategyPreset,
    StrategySpec,
    plan,
    register,
    unregister,
)
from interlock.strategies.ddp import DDPStrategy
from machines import CPU, NOTEBOOK

#: every launch-style name and the launcher it planned to before the launcher axis
LAUNCH_STYLES = {
    "ddp": "subprocess", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork",
    "ddp_forkserver": "forkserver",
}

#: what a plan of ddp under a launcher must share with the preset that names it
SAME = ("accelerator", "precision", "parallel_devices", "num_nodes", "world_size",
        "launcher", "cluster_environment", "checkpoint_io", "parallelism", "mesh")


def test_every_launch_style_name_plans_to_ddp_under_its_launcher() -> None:
    specs = interlock.registered(interlock.StrategySpec)
    for name, launcher in LAUNCH_STYLES.items():
        for variant in (name, f"{name}_find_unused_parameters_true"):
            if variant not in specs:  # ddp_forkserver has no find_unused presets
                continue
            found = plan(strategy=variant, accelerator="cpu", devices=2, machine=CPU)
            assert (found.strategy, found.launcher) == (variant, launcher)
            assert found.spec.factory == specs["ddp"].factory
            assert (found.spec.preset_of or found.spec.name) == "ddp"


@pytest.mark.parametrize("name", sorted(LAUNCH_STYLES))
def test_ddp_with_a_launcher_plans_like_the_preset_that_names_it(name: str) -> None:
    preset = plan(strategy=name, accelerator="cpu", devices=2, machine=CPU)
    axis = plan(strategy="ddp", launcher=LAUNCH_STYLES[name], accelerator="cpu", devices=2,
                machine=CPU)
    assert axis.strategy == "ddp" and axis.launcher == LAUNCH_STYLES[name]
    for field in SAME:
        assert getattr(axis, field) == getattr(preset, field), field
    # the spec differs only in its name, description and how it came to be
    assert axis.spec.precisions == preset.spec.precisions
    assert axis.spec.capabilities == preset.spec.capabilities
    assert axis.spec.memory == preset.spec.memory


def test_auto_and_none_keep_the_strategys_own_launcher() -> None:
    for value in (None, "auto", " AUTO "):
        found = plan(strategy="ddp_fork", launcher=value, accelerator="cpu", devices=2,
                     machine=CPU)
        assert found.launcher == "fork"
    assert plan(strategy="ddp", launcher="SPAWN", accelerator="cpu", devices=2,
                machine=CPU).launcher == "spawn"


def test_a_preset_that_pins_its_launcher_refuses_another_and_names_the_way() -> None:
    with pytest.raises(ResolutionError) as caught:
        plan(strategy="ddp_spawn", launcher="fork", accelerator="cpu", devices=2, machine=CPU)
    error = caught.value
    assert (error.code, error.flag, error.rule) == ("unsupported-launcher", "launcher",
                                                    "launcher-flag/unsupported")
    assert "'ddp_spawn' is 'ddp' under the spawn launcher" in error.reason
    assert "strategy='ddp'" in error.choices and "launcher='spawn'" in error.choices


def test_strategies_that_take_one_launcher_or_none_refuse_others() -> None:
    with pytest.raises(ResolutionError) as caught:
        plan(strategy="fsdp", launcher="spawn", accelerator="cpu", devices=2, machine=CPU)
    assert caught.value.code == "unsupported-launcher"
    assert "'fsdp' runs under subprocess only" in caught.value.reason
    assert caught.value.choices[0] == "launcher='subprocess'"
    assert "strategy='ddp'" in caught.value.choices
    with pytest.raises(ResolutionError) as caught:
        plan(launcher="fork", accelerator="cpu", devices=1, machine=CPU)
    assert caught.value.code == "unsupported-launcher"
    assert "runs in the calling process" in caught.value.reason
    assert "strategy='auto' chose 'single_device'" in caught.value.reason


@pytest.mark.parametrize(("value", "words"), [
    ("sapwn", "Did you mean 'spawn'?"),
    (" External ", "the cluster environment decides it"),
    (3, "must be a launcher name, got int"),
    (["fork"], "must be a launcher name, got list"),
])
def test_an_unknown_launcher_is_refused_with_the_names_there_are(value: object,
                                                                 words: str) -> None:
    from typeguard import suppress_type_checks

    with suppress_type_checks(), pytest.raises(ResolutionError) as caught:
        plan(strategy="ddp", launcher=value, accelerator="cpu",  # type: ignore[arg-type]
             devices=2, machine=CPU)
    assert caught.value.code == "unknown-launcher"
    assert words in str(caught.value)
    assert "external" not in caught.value.choices and "spawn" in caught.value.choices


def test_in_a_notebook_auto_takes_the_launcher_asked_for() -> None:
    assert plan(devices=2, accelerator="cpu", machine=NOTEBOOK).strategy == "ddp_notebook"
    found = plan(devices=2, accelerator="cpu", launcher="fork", machine=NOTEBOOK)
    assert (found.strategy, found.launcher) == ("ddp", "fork")
    with pytest.raises(ResolutionError) as caught:
        plan(devices=2, accelerator="cpu", launcher="spawn", machine=NOTEBOOK)
    assert caught.value.code == "interactive-incompatible"


@pytest.fixture
def grid() -> Iterator[None]:
    """A package that brings a launcher for ddp and fsdp, which needs the package, and
    a preset naming fsdp under it."""
    register(PackageRow(name="ilk_gridpkg", install="pip install ilk-gridpkg"))
    register(LauncherRow(
        name="ilk_grid", start_method=None, interactive=True, launches_single=True,
        description="a grid", factory="interlock.strategies.launchers.external:ExternalLauncher",
        strategies=frozenset({"ddp", "fsdp"}), requires=("ilk_gridpkg",)))
    register(StrategyPreset(name="ilk_grid_fsdp", strategy="fsdp",
                                     launcher="ilk_grid", description="fsdp on the grid"))
    yield
    unregister(StrategySpec, "ilk_grid_fsdp")
    unregister(LauncherRow, "ilk_grid")
    unregister(PackageRow, "ilk_gridpkg")


def with_grid() -> Machine:
    """This machine with the grid's package (known only while it is registered)."""
    return Machine(packages=frozenset({"ilk_gridpkg"}))


@pytest.mark.usefixtures("grid")
def test_a_launcher_row_reaches_the_strategies_it_names_and_their_open_presets() -> None:
    for name in ("ddp", "ddp_find_unused_parameters_true", "fsdp"):
        found = plan(strategy=name, launcher="ilk_grid", accelerator="cpu", devices=2,
                     machine=with_grid())
        assert found.launcher == "ilk_grid" and found.spec.requires == ("ilk_gridpkg",)
    # a preset that pins its launcher, and a strategy the row does not name
    for name in ("ddp_spawn", "model_parallel"):
        with pytest.raises(ResolutionError) as caught:
            plan(strategy=name, launcher="ilk_grid", accelerator="cpu", devices=2,
                 machine=with_grid())
        assert caught.value.code == "unsupported-launcher"


@pytest.mark.usefixtures("grid")
def test_the_launchers_package_is_required_with_its_install_hint() -> None:
    for flags in ({"strategy": "ddp", "launcher": "ilk_grid"}, {"strategy": "ilk_grid_fsdp"}):
        with pytest.raises(ResolutionError) as caught:
            plan(accelerator="cpu", devices=2, machine=CPU, **flags)  # type: ignore[arg-type]
        assert caught.value.code == "missing-package"
        assert "pip install ilk-gridpkg" in caught.value.reason


@pytest.mark.usefixtures("grid")
def test_a_registered_preset_is_its_strategy_under_its_launcher() -> None:
    specs = interlock.registered(interlock.StrategySpec)
    preset, fsdp = specs["ilk_grid_fsdp"], specs["fsdp"]
    assert (preset.launcher, preset.launchers, preset.preset_of) == ("ilk_grid", frozenset(),
                                                                      "fsdp")
    for field in ("factory", "family", "accelerators", "precisions", "capabilities",
                  "precision_plugin", "parallel_dims", "default_parallelism", "memory"):
        assert getattr(preset, field) == getattr(fsdp, field), field
    via_preset = plan(strategy="ilk_grid_fsdp", accelerator="cpu", devices=2,
                      machine=with_grid())
    via_axis = plan(strategy="fsdp", launcher="ilk_grid", accelerator="cpu", devices=2,
                    machine=with_grid())
    for field in SAME:
        assert getattr(via_preset, field) == getattr(via_axis, field), field
    assert pickle.loads(pickle.dumps(via_preset)).spec == preset


@pytest.mark.parametrize(("preset", "words"), [
    (StrategyPreset(name="ilk_p", strategy="no_such", description="x"),
     "strategy 'no_such' is not a registered strategy"),
    (StrategyPreset(name="ilk_p", strategy="fsdp", launcher="spawn", description="x"),
     "launcher 'spawn' is not one strategy 'fsdp' runs under; it takes subprocess"),
    (StrategyPreset(name="ilk_p", strategy="single_device", launcher="fork", description="x"),
     "it takes none (it runs in the calling process)"),
    (StrategyPreset(name="ilk_p", strategy="ddp", launcher=["fork"],  # type: ignore[arg-type]
                    description="x"), "launcher must be a launcher name or None, got list"),
    (StrategyPreset(name="ilk_p", strategy="ddp", description=""),
     "description must be a non-empty string"),
    (StrategyPreset(name="ilk_p", strategy="ddp", description="x", options={"bogus": 1}),
     None),
    (StrategyPreset(name="ddp_spawn", strategy="ddp", launcher="fork", description="x"),
     "already taken"),
])
def test_a_malformed_preset_is_refused_with_the_reason(preset: StrategyPreset,
                                                       words: str | None) -> None:
    if words is None:  # options are checked against the factory when the plan is built
        register(preset)
        try:
            with pytest.raises(ResolutionError) as caught:
                interlock.resolve(strategy="ilk_p", accelerator="cpu", devices=2, machine=CPU)
            assert caught.value.code == "unknown-option" and "bogus" in caught.value.reason
        finally:
            unregister(StrategySpec, "ilk_p")
        return
    with pytest.raises(RegistrationError, match="cannot register strategy") as refused:
        register(preset)
    assert words in str(refused.value)
    assert "ilk_p" not in interlock.registered(interlock.StrategySpec)


def test_a_precision_that_names_ddp_reaches_every_launcher_and_preset_of_it() -> None:
    register(PrecisionRow(
        name="ilk-bf16-x", param_dtype="bfloat16", compute_dtype="bfloat16", scaler=False,
        plugin="ilk_x", factory="interlock.strategies.precision.half:HalfPrecision",
        description="x", accelerators=frozenset({"cpu"}), strategies=frozenset({"ddp"})))
    try:
        for flags in ({"strategy": "ddp"}, {"strategy": "ddp", "launcher": "forkserver"},
                      {"strategy": "ddp_spawn"}, {"strategy": "ddp_notebook"},
                      {"strategy": "ddp_fork_find_unused_parameters_true"}):
            found = plan(precision="ilk-bf16-x", accelerator="cpu", devices=2, machine=CPU,
                         **flags)  # type: ignore[arg-type]
            assert found.precision == "ilk-bf16-x"
        with pytest.raises(ResolutionError) as caught:
            plan(strategy="model_parallel", precision="ilk-bf16-x", accelerator="cpu",
                 devices=2, machine=CPU)
        assert caught.value.code == "unsupported-precision"
    finally:
        unregister(PrecisionRow, "ilk-bf16-x")


def _rank_and_start(strategy: DDPStrategy) -> tuple[int, str, str]:
    return (strategy.global_rank, strategy.start_method,
            strategy.launcher.name if strategy.launcher else "")


@pytest.mark.timeout(120)
def test_ddp_built_with_a_launcher_starts_its_ranks_with_it() -> None:
    strategy = interlock.resolve(strategy="ddp", launcher="fork", accelerator="cpu",
                                 devices=2, machine=CPU)
    assert isinstance(strategy, DDPStrategy)
    assert strategy.name == "ddp" and strategy.start_method == "fork"
    assert strategy.launch(_rank_and_start) == (0, "fork", "fork")


def test_the_cli_takes_a_launcher(capsys: pytest.CaptureFixture[str]) -> None:
    from interlock.cli import main

    assert main(["plan", "--strategy", "ddp", "--launcher", "forkserver", "--devices", "2",
                 "--accelerator", "cpu", "--simulate", "cpu"]) == 0
    assert "launcher:             forkserver" in capsys.readouterr().out
    assert main(["plan", "--strategy", "fsdp", "--launcher", "fork", "--devices", "2",
                 "--accelerator", "cpu", "--simulate", "cpu"]) == 2
    assert "[unsupported-launcher]" in capsys.readouterr().err
