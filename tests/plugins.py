"""Minimal plugin objects, declared the way the runtime's plugin classes declare them."""

from __future__ import annotations


class BF16Plugin:
    interlock_part_kind = "precision"
    precision = "bf16-mixed"


class HalfTruePlugin:
    interlock_part_kind = "precision"
    precision = "16-true"


class BadPrecisionPlugin:
    interlock_part_kind = "precision"
    precision = "fp8"


class MyCheckpointIO:
    interlock_part_kind = "checkpoint_io"


class MyCluster:
    interlock_part_kind = "cluster_environment"
    name = "my-cluster"
    creates_processes_externally = True


class LocalCluster:
    interlock_part_kind = "cluster_environment"
    name = "local"
    creates_processes_externally = False


class GridCluster:
    """A cluster environment plugin of the kind a registered ``ilk_grid`` launcher runs
    its ranks in (tests/test_rules_each.py registers it)."""

    interlock_part_kind = "cluster_environment"
    name = "ilk_grid"
    creates_processes_externally = False


class HalfDeclaredCluster:
    interlock_part_kind = "cluster_environment"
    name = "nameless"


class NotAPlugin:
    pass


class Fp16MixedPlugin:
    interlock_part_kind = "precision"
    precision = "16-mixed"


class StandInAccelerator:
    """Declares itself an accelerator part the way the runtime's Accelerator does."""

    interlock_part_kind = "accelerator"

    def __init__(self, name: str) -> None:
        self.name = name


class StandInStrategy:
    """Declares itself a strategy part the way the runtime's Strategy does."""

    interlock_part_kind = "strategy"

    def __init__(self, name: str, **parts: object) -> None:
        self.name = name
        self._parts = parts

    def given_parts(self) -> dict[str, object]:
        return dict(self._parts)


class StandInModelParallel(StandInStrategy):
    """A strategy instance given the older degree options, as ModelParallelStrategy
    reports them."""

    def __init__(self, name: str = "model_parallel", data_parallel_size: object = "auto",
                 tensor_parallel_size: object = "auto") -> None:
        super().__init__(name)
        self._degrees = {"data_parallel_size": data_parallel_size,
                         "tensor_parallel_size": tensor_parallel_size}

    def degree_options(self) -> dict[str, object]:
        return dict(self._degrees)


def three_devices() -> int:
    """A registered accelerator's device counter that finds three devices."""
    return 3


def failing_device_count() -> int:
    """A device counter whose driver is missing."""
    raise RuntimeError("the driver is not loaded")


def junk_device_count() -> object:
    """A device counter that returns something other than a count."""
    return "3"
