"""ModelParallelStrategy on 2 CPU ranks: TP=2 and DP=2 against the unsharded baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sharded_workloads as sw
import torch
import workloads
from harness import close, launch_forked

import interlock
from interlock import Parallelism, ResolutionError
from interlock.strategies.model_parallel import ModelParallelStrategy

SPLITS = {
    "tp2": (sw.tensor_parallel, 1, 2),
    "dp2": (sw.data_parallel, 2, 1),
}


def model_parallel(split: str = "tp2", devices: int = 2, **options: Any) -> ModelParallelStrategy:
    fn, dp, tp = SPLITS[split]
    strategy = interlock.resolve(
        strategy=ModelParallelStrategy(parallelize_fn=fn, data_parallel_size=dp,
                                       tensor_parallel_size=tp, **options),
        accelerator="cpu", devices=devices, machine=interlock.Machine(),
    )
    assert isinstance(strategy, ModelParallelStrategy)
    return strategy


@pytest.mark.timeout(90)
@pytest.mark.parametrize("split", list(SPLITS))
def test_two_ranks_match_the_unsharded_baseline(split: str) -> None:
    result = launch_forked(model_parallel(split), workloads.train, 4)
    expected = workloads.baseline(4)
    for key, value in expected.items():
        close(result[key], value, f"{split} {key}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("split", list(SPLITS))
def test_accumulation_with_no_backward_sync_equals_the_large_batch(split: str) -> None:
    result = launch_forked(model_parallel(split), workloads.train, 3, 2)
    expected = workloads.baseline(3, accumulate=2)
    for key, value in expected.items():
        close(result[key], value, f"{split} accumulated {key}")


@pytest.mark.timeout(90)
def test_tensor_parallel_ranks_share_a_batch() -> None:
    strategy = model_parallel("tp2")
    assert (strategy.data_parallel_size, strategy.world_size) == (1, 2)
    ranks = launch_forked(strategy, workloads.places)["ranks"]
    assert [r["global_rank"] for r in ranks] == [0, 1]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("split", list(SPLITS))
def test_distributed_checkpoint_round_trip_and_reload_elsewhere(tmp_path: Path,
                                                               split: str) -> None:
    path = tmp_path / "ckpt"
    saved = launch_forked(model_parallel(split), sw.train_and_save, str(path), 3)
    assert (path / ".metadata").is_file()
    for other in ("tp2", "dp2"):
        loaded = launch_forked(model_parallel(other), sw.load_into_fresh, str(path))
        what = f"saved by {split}, loaded by {other}"
        close(loaded["params"], saved["params"], f"{what}: parameters")
        close(loaded["optimizer"], saved["optimizer"], f"{what}: optimizer state")
        assert loaded["step"] == 3, what
    single = interlock.resolve(accelerator="cpu", devices=1, strategy="single_device",
                               machine=interlock.Machine())
    loaded = single.launch(sw.load_into_fresh, str(path))
    close(loaded["params"], saved["params"], f"saved by {split}, loaded by one process")


@pytest.mark.timeout(120)
def test_a_full_checkpoint_is_gathered_into_the_ddp_layout(tmp_path: Path) -> None:
    path = tmp_path / "full.pt"
    saved = launch_forked(model_parallel("tp2", save_distributed_checkpoint=False),
                          sw.train_and_save, str(path), 2)
    raw = torch.load(path, weights_only=True)
    close(raw["model"], saved["params"], "the full file's parameters")
    loaded = launch_forked(model_parallel("tp2"), sw.load_into_fresh, str(path))
    close(loaded["params"], saved["params"], "full file loaded into TP=2")
    close(loaded["optimizer"], saved["optimizer"], "full file's optimizer state in TP=2")


@pytest.mark.timeout(120)
def test_empty_init_allocates_only_shards(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    saved = launch_forked(model_parallel("tp2"), sw.train_and_save, str(path), 2)
    loaded = launch_forked(model_parallel("tp2"), sw.load_into_fresh, str(path), True)
    assert loaded["built_on_meta"]
    sizes = {n: p.numel() for n, p in workloads.model().named_parameters()}
    sharded = [n for n, numel in sizes.items()
               if sum(local[n] for local in loaded["local_numel"]) == numel]
    assert {"0.weight", "0.bias", "2.weight"} <= set(sharded), loaded["local_numel"]
    close(loaded["params"], saved["params"], "empty-init model after loading")


def test_a_strategy_built_by_hand_checks_its_degrees_with_the_numbers() -> None:
    """Without a plan the older options are checked against the world at once."""
    def degrees(**options: Any) -> Parallelism:
        return ModelParallelStrategy(**options).degrees

    assert degrees(parallel_devices=["cpu"] * 4, num_nodes=2) == Parallelism(dp_shard=2, tp=4)
    assert degrees(parallel_devices=["cpu"] * 8, data_parallel_size=2) == \
        Parallelism(dp_shard=2, tp=4)
    with pytest.raises(ResolutionError, match="tp=3 does not divide the world size 8"):
        ModelParallelStrategy(parallel_devices=["cpu"] * 8, tensor_parallel_size=3)
    with pytest.raises(ResolutionError, match=r"dp_shard=2 x tp=2 = 4, but the world has 8"):
        ModelParallelStrategy(parallel_devices=["cpu"] * 8, data_parallel_size=2,
                              tensor_parallel_size=2)
    with pytest.raises(ResolutionError, match="dp_shard=0 is not a degree"):
        ModelParallelStrategy(parallel_devices=["cpu"] * 8, data_parallel_size=0)


def test_a_split_that_does_not_fit_the_world_fails_at_resolve() -> None:
    with pytest.raises(ValueError, match="the world has 2 ranks"):
        interlock.resolve(
            strategy=ModelParallelStrategy(parallelize_fn=sw.tensor_parallel,
                                           data_parallel_size=2, tensor_parallel_size=2),
            accelerator="cpu", devices=2, machine=interlock.Machine(),
        )


@pytest.mark.timeout(60)
def test_missing_or_broken_parallelize_fn_is_explained() -> None:
    from interlock.strategies.launchers import RankFailedError

    by_name = interlock.resolve(strategy="model_parallel", accelerator="cpu", devices=2,
                                machine=interlock.Machine())
    assert isinstance(by_name, ModelParallelStrategy)
    with pytest.raises(RankFailedError, match="needs a parallelize_fn"):
        launch_forked(by_name, workloads.train, 1)
    with pytest.raises(RankFailedError, match=r"returned NoneType, not the nn\.Module"):
        launch_forked(ModelParallelStrategy(parallelize_fn=sw.not_a_module,
                                            accelerator=by_name.accelerator,
                                            parallel_devices=["cpu", "cpu"]),
                      workloads.train, 1)

