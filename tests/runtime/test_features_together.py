"""Features combined as training scripts combine them, each run against the same loop
in one plain process: clipping and accumulation under pipelines, clipping under
tensor-parallel plans that leave a layer replicated, data-parallel replicas that a
parallelize function leaves unsynchronised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import together_workloads as tw
from harness import close, launch_forked
from layout_workloads import shard_stage

import interlock
from interlock.strategies.model_parallel import ModelParallelStrategy
from interlock.strategies.parallel import ParallelStrategy

CPU = interlock.Machine()

#: name -> (devices, parallelism, parallelize_fn)
LAYOUTS: dict[str, tuple[int, dict[str, int], Callable[..., Any]]] = {
    "pp2": (2, {"pp": 2, "dp_shard": 1}, shard_stage),
    "pp2_dp2": (4, {"pp": 2, "dp_shard": 2}, shard_stage),
    "tp2_head": (2, {"tp": 2, "dp_shard": 1}, tw.tp_first_layer_only),
    "fsdp2_tp2_head": (4, {"dp_shard": 2, "tp": 2}, tw.tp_first_layer_only),
}


def _model_parallel(layout: str, schedule: str = "1F1B") -> ParallelStrategy:
    devices, degrees, fn = LAYOUTS[layout]
    built = interlock.resolve(
        strategy=ModelParallelStrategy(parallelize_fn=fn, pipeline_schedule=schedule),  # type: ignore[arg-type]
        accelerator="cpu", devices=devices, machine=CPU, parallelism=degrees)
    assert isinstance(built, ParallelStrategy)
    return built


def _compare(layout: str, got: dict[str, Any], steps: int, accumulate: int,
             max_norm: float, last_size: int = 8) -> None:
    want = tw.baseline_clipped(steps, accumulate, max_norm, last_size)
    assert min(want["norms"]) > max_norm, "the clipping must be active to test it"
    close(got["norms"], want["norms"], f"{layout}: the norms clip_gradients_norm returned")
    close(got["params"], want["params"], f"{layout}: parameters after {steps} steps")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
@pytest.mark.parametrize("layout", ["pp2", "pp2_dp2"])
def test_a_pipeline_clips_the_whole_model_and_accumulates_like_one_process(
        layout: str, schedule: str) -> None:
    """The norm covers every stage (and shard) once, every stage clips with one
    coefficient, and a second forward_backward before the optimizer step adds to the
    first instead of dividing it again."""
    got = launch_forked(_model_parallel(layout, schedule), tw.train_clipped, 3, 2, 0.5)
    _compare(f"{layout} {schedule}", got, 3, 2, 0.5)


@pytest.mark.timeout(120)
def test_a_pipeline_keeps_accumulated_gradients_when_the_batch_shape_changes() -> None:
    """A new batch shape needs a new schedule, whose shape inference clears FSDP2
    gradients: what the step's first micro-batch accumulated must survive it."""
    got = launch_forked(_model_parallel("pp2_dp2"), tw.train_clipped, 2, 2, 0.5, 16)
    _compare("pp2_dp2, batches of 8 then 16", got, 2, 2, 0.5, 16)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ["tp2_head", "fsdp2_tp2_head"])
def test_clipping_under_a_tensor_parallel_plan_that_leaves_the_head_replicated(
        layout: str) -> None:
    got = launch_forked(_model_parallel(layout), tw.train_clipped, 3, 1, 0.5)
    _compare(layout, got, 3, 1, 0.5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("degrees", "fn", "unsynchronised"), [
    ({"dp_shard": 2, "tp": 1}, tw.leave_as_is, "dp_shard"),
    ({"dp_shard": 2, "tp": 2}, tw.tp_only, "dp_shard"),
    ({"dp_replicate": 2, "dp_shard": 2}, shard_stage, "dp_replicate"),
])
def test_replicas_a_parallelize_fn_leaves_unsynchronised_are_refused_at_setup(
        degrees: dict[str, int], fn: Callable[..., Any], unsynchronised: str) -> None:
    devices = 1
    for size in degrees.values():
        devices *= size
    strategy = interlock.resolve(strategy=ModelParallelStrategy(parallelize_fn=fn),
                                 accelerator="cpu", devices=devices, machine=CPU,
                                 parallelism=degrees)
    assert isinstance(strategy, ParallelStrategy)
    with pytest.raises(Exception, match=rf"not synchronised over {unsynchronised}") as info:
        launch_forked(strategy, tw.train_clipped, 1, 1, 0.5)
    assert "0.weight" in str(info.value) and "fully_shard" in str(info.value)


@pytest.mark.timeout(120)
def test_hsdp_through_a_parallelize_fn_trains_like_one_process() -> None:
    strategy = interlock.resolve(strategy=ModelParallelStrategy(parallelize_fn=tw.hsdp),
                                 accelerator="cpu", devices=4, machine=CPU,
                                 parallelism={"dp_replicate": 2, "dp_shard": 2})
    assert isinstance(strategy, ParallelStrategy)
    got = launch_forked(strategy, tw.train_clipped, 3, 2, 0.5)
    _compare("hsdp 2x2", got, 3, 2, 0.5)
