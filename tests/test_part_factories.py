"""Every built-in part row names its implementation: a ``"module:Class"`` string the
engine never imports. Here each one is imported and checked against the runtime."""

from __future__ import annotations

import importlib
import multiprocessing
from typing import Any

import pytest
from typeguard import suppress_type_checks

import interlock
from interlock import InterlockDeprecationWarning, Machine
from interlock.engine.optimizers import OptimizerRow
from interlock.engine.tables import (
    ACCELERATORS,
    CLUSTERS,
    LAUNCHERS,
    PRECISIONS,
    AcceleratorRow,
    ClusterRow,
    LauncherRow,
    PrecisionRow,
)


def load(factory: str) -> Any:
    module, _, attribute = factory.partition(":")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def _ids(rows: tuple[Any, ...]) -> list[str]:
    return [row.name for row in rows]


@pytest.mark.parametrize("row", PRECISIONS, ids=_ids(PRECISIONS))
def test_precision_factory_is_the_plugin_the_runtime_builds(row: PrecisionRow) -> None:
    from interlock.strategies.precision import MissingPackageError, Precision, precision_for

    cls = load(row.factory)
    assert isinstance(cls, type) and issubclass(cls, Precision), (
        f"precision {row.name!r}: factory {row.factory} is not a Precision class")
    try:
        built = precision_for(row.name, "cpu")
    except MissingPackageError:  # Transformer Engine: the class is all we can check
        assert "transformer_engine" in row.requires
        return
    assert type(built) is cls, (
        f"precision {row.name!r}: the row names {row.factory}, but precision_for builds "
        f"{type(built).__module__}:{type(built).__qualname__} (plugin family {row.plugin!r})")


@pytest.mark.parametrize("row", ACCELERATORS,
                         ids=_ids(ACCELERATORS))
def test_accelerator_factory_is_the_class_of_that_name(row: AcceleratorRow) -> None:
    from interlock.strategies.accelerators import Accelerator, accelerator_for

    cls = load(row.factory)
    assert isinstance(cls, type) and issubclass(cls, Accelerator), row.factory
    assert cls.name == row.name, f"{row.factory}.name is {cls.name!r}, the row {row.name!r}"
    assert type(accelerator_for(row.name)) is cls, "accelerator_for builds another class"


def test_an_accelerator_class_needs_no_device_counting_of_its_own() -> None:
    """Devices come from the engine's Machine: an accelerator implements setup only."""
    import torch

    from interlock.strategies.accelerators import Accelerator

    class Plain(Accelerator):
        name = "cpu"

    accelerator = Plain()
    assert accelerator.parse_devices(2, Machine()) == ("cpu", "cpu")
    accelerator.setup_device(torch.device("cpu"))


@pytest.mark.parametrize("machine", [Machine(), Machine(cuda_devices=4)],
                         ids=["no-gpu", "4-gpus"])
def test_the_deprecated_device_counters_answer_as_plan_does(
        machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.strategies.accelerators.cpu import CPUAccelerator
    from interlock.strategies.accelerators.cuda import CUDAAccelerator

    monkeypatch.setattr(Machine, "probe", classmethod(lambda cls: machine))
    with pytest.warns(InterlockDeprecationWarning,
                      match=r"CUDAAccelerator\.is_available\(\) is deprecated"):
        available = CUDAAccelerator.is_available()
    with pytest.warns(InterlockDeprecationWarning,
                      match=r"CUDAAccelerator\.auto_device_count\(\) is deprecated"):
        count = CUDAAccelerator.auto_device_count()
    if machine.cuda_devices:
        planned = interlock.plan(accelerator="cuda", devices="auto", machine=machine)
        assert (available, count) == (True, len(planned.parallel_devices))
    else:
        with pytest.raises(interlock.ResolutionError):
            interlock.plan(accelerator="cuda", devices="auto", machine=machine)
        assert (available, count) == (False, 0)
    with pytest.warns(InterlockDeprecationWarning):
        assert (CPUAccelerator.is_available(), CPUAccelerator.auto_device_count()) == (True, 1)


@pytest.mark.parametrize("row", CLUSTERS,
                         ids=_ids(CLUSTERS))
def test_environment_factory_is_the_class_of_that_name(row: ClusterRow) -> None:
    from interlock.strategies.environments import ClusterEnvironment, environment_for

    cls = load(row.factory)
    assert isinstance(cls, type) and issubclass(cls, ClusterEnvironment), row.factory
    assert cls.name == row.name, f"{row.factory}.name is {cls.name!r}, the row {row.name!r}"
    assert type(environment_for(row.name, {})) is cls, "environment_for builds another class"


@pytest.mark.parametrize("row", LAUNCHERS, ids=_ids(LAUNCHERS))
def test_launcher_factory_is_a_launcher_of_that_name(row: LauncherRow) -> None:
    from interlock.strategies.launchers import Launcher, MultiProcessingLauncher

    cls = load(row.factory)
    assert isinstance(cls, type) and issubclass(cls, Launcher), row.factory
    name = getattr(cls, "name", None)
    if isinstance(name, str):
        assert name == row.name, f"{row.factory}.name is {name!r}, the row {row.name!r}"
        return
    # the multiprocessing launcher is named by the start method it is made with
    assert cls is MultiProcessingLauncher and row.start_method == row.name, row
    if row.start_method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"this platform has no {row.start_method!r} start method")
    assert MultiProcessingLauncher(start_method=row.start_method, num_processes=1).name == (
        row.name)


def test_the_engine_never_imports_a_factory() -> None:
    """Every factory lives in the runtime (or a plugin), which the engine never imports:
    the factory strings name modules outside interlock.engine."""
    rows: tuple[PrecisionRow | AcceleratorRow | ClusterRow | LauncherRow, ...] = (
        *PRECISIONS, *ACCELERATORS, *CLUSTERS, *LAUNCHERS)
    for row in rows:
        assert row.factory.startswith("interlock.strategies."), row


def _build(kind: str, name: Any) -> object:
    """Build the part ``name`` (or row) of ``kind`` the way a strategy does."""
    from interlock.strategies.accelerators import accelerator_for
    from interlock.strategies.environments import LocalEnvironment, environment_for
    from interlock.strategies.io import checkpoint_io_for
    from interlock.strategies.launchers import launcher_for
    from interlock.strategies.precision.from_row import plugin_from_row

    builders: dict[str, Any] = {
        "accelerator": accelerator_for,
        "cluster environment": environment_for,
        "checkpoint IO": checkpoint_io_for,
        "launcher": lambda n: launcher_for(n, num_processes=2, num_nodes=1,
                                           cluster=LocalEnvironment({})),
        "precision": lambda n: plugin_from_row(n, "cpu"),
    }
    return builders[kind](name)


@pytest.mark.parametrize(("kind", "typo", "meant"), [
    ("accelerator", "cudaa", "cuda"),
    ("cluster environment", "slurmm", "slurm"),
    ("checkpoint IO", "torchh", "torch"),
    ("launcher", "forkk", "fork"),
    ("precision", "bf16-mixd", "bf16-mixed"),
])
def test_every_part_kind_refuses_an_unknown_name_alike(kind: str, typo: str,
                                                        meant: str) -> None:
    with pytest.raises(ValueError) as refused:
        _build(kind, typo)
    message = str(refused.value)
    assert message.startswith(f"unknown {kind} {typo!r}. Did you mean {meant!r}? Choices: ")
    assert meant in message.partition("Choices: ")[2].rstrip(".").split(", ")


def test_a_factory_of_another_kind_is_refused_naming_both() -> None:
    from interlock.strategies.accelerators import Accelerator
    from interlock.strategies.factories import part_class

    with pytest.raises(TypeError) as refused:
        part_class(LauncherRow, "fork", Accelerator)
    assert str(refused.value) == (
        "launcher 'fork': its factory interlock.strategies.launchers.multiprocessing:"
        "MultiProcessingLauncher is not a subclass of "
        "interlock.strategies.accelerators.base.Accelerator")
    row, cls = part_class(LauncherRow, "fork", object)
    assert row.name == "fork" and cls.__name__ == "MultiProcessingLauncher"


@pytest.mark.parametrize("kind", ["accelerator", "cluster environment", "checkpoint IO",
                                  "launcher", "precision"])
def test_every_part_kind_builds_from_its_row_and_refuses_another_kinds(kind: str) -> None:
    """A plan hands its rows to the builders: a row of the kind builds what its name
    builds, and a row of another kind is named as such, not as an unknown name."""
    row_type = {"accelerator": AcceleratorRow, "cluster environment": ClusterRow,
                "checkpoint IO": interlock.CheckpointIORow, "launcher": LauncherRow,
                "precision": PrecisionRow}[kind]
    name = {"accelerator": "cpu", "cluster environment": "local", "checkpoint IO": "torch",
            "launcher": "fork", "precision": "bf16-mixed"}[kind]
    row: Any = interlock.registered(row_type)[name]
    assert type(_build(kind, row)) is type(_build(kind, name))
    other = interlock.registered(OptimizerRow)["adamw"]
    with suppress_type_checks(), pytest.raises(ValueError) as refused:
        _build(kind, other)  # a row of another kind, past the type checker
    article = "an" if kind == "accelerator" else "a"
    assert str(refused.value) == (f"expected {article} {kind} row ({row_type.__name__}) or "
                                  "its name, got OptimizerRow 'adamw'")
