"""The mesh checks train the recipe on each layout: a pipeline that clips by one
stage's norm, or divides what earlier micro-steps accumulated again, trains
plausible-looking numbers that only a comparison with one process on a pipeline
layout shows. The suite's own mesh check is run here on such broken strategies."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import interlock
from interlock import StrategySpec, registered
from interlock.conformance import mesh_checks
from interlock.conformance.checks import CheckFailed
from interlock.conformance.driver import _prepare
from interlock.conformance.launch_checks import LaunchContext


@pytest.fixture(scope="module", autouse=True)
def _broken_strategies() -> Iterator[None]:
    """The broken strategies registered for this module's tests only: every other test
    in this process sees the registry without them."""
    before = set(registered(StrategySpec))
    module = importlib.import_module("broken_strategies")
    module._register_mesh()  # again, should an earlier test have unregistered them
    yield
    for name in set(registered(StrategySpec)) - before:
        interlock.unregister(interlock.StrategySpec, name)


def _context(name: str, workdir: Path) -> LaunchContext:
    def resolve_layout(precision: str, devices: int, layout: Any) -> Any:
        return _prepare(interlock.resolve(strategy=name, accelerator="cpu", devices=devices,
                                          precision=precision, parallelism=layout))

    return LaunchContext(
        strategy=None, spec=registered(StrategySpec)[name], world_size=2, workdir=workdir,
        resolve=lambda precision, devices: resolve_layout(precision, devices, None),
        resolve_layout=resolve_layout, environ_before={}, passed=nn.Linear(1, 1),
        passed_before={})


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("name", "shown"), [
    ("broken_clips_one_stage", "the norms clip_gradients_norm returned differ"),
    ("broken_rescales_accumulated", "the parameters after"),
])
def test_the_pipeline_mesh_check_fails_a_broken_pipeline(name: str, shown: str,
                                                         tmp_path: Path) -> None:
    with pytest.raises(CheckFailed) as failed:
        mesh_checks.MESH_CHECKS["pp"](_context(name, tmp_path))
    message = str(failed.value)
    assert message.startswith("pp=2 x dp_shard=2: "), message
    assert f"the recipe (AdamW, warm-up, accumulation 2, clipping on): {shown}" in message, \
        message
