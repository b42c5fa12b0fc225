"""N-D layouts on 4 CPU ranks (gloo) against one plain process: HSDP 2x2, FSDP 2 x TP 2,
PP 2 x DP 2; the mesh each rank sees; checkpoints resharded across layouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import layout_workloads as lw
import pytest
import torch
import workloads
from harness import close, launch_forked

import interlock
from interlock.engine.parallelism import DIMS, FLATTENED, MeshLayout
from interlock.strategies.model_parallel import ModelParallelStrategy
from interlock.strategies.parallel import ParallelStrategy

CPU = interlock.Machine()

#: name -> (strategy, parallelism)
LAYOUTS: dict[str, tuple[str, dict[str, int]]] = {
    "hsdp_2x2": ("fsdp", {"dp_replicate": 2, "dp_shard": 2}),
    "fsdp2_tp2": ("model_parallel", {"dp_shard": 2, "tp": 2}),
    "pp2_dp2": ("model_parallel", {"pp": 2, "dp_shard": 2}),
}


def resolve(layout: str, devices: int = 4, precision: str = "32-true",
            sharded: bool = False) -> ParallelStrategy:
    """The layout's strategy; ``sharded``: FSDP saves a distributed checkpoint."""
    strategy, degrees = LAYOUTS[layout]
    flag: Any = _fsdp_sharded() if strategy == "fsdp" and sharded else strategy
    if strategy == "model_parallel":
        fn = lw.shard_stage if "pp" in degrees else lw.fsdp_tp
        flag = ModelParallelStrategy(parallelize_fn=fn)
    built = interlock.resolve(strategy=flag, accelerator="cpu", devices=devices,
                              precision=precision, machine=CPU, parallelism=degrees)
    assert isinstance(built, ParallelStrategy)
    return built


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_training_matches_one_plain_process(layout: str) -> None:
    strategy = resolve(layout)
    result = launch_forked(strategy, lw.train_layout, 3)
    close(result["params"], workloads.baseline(3), f"{layout}: parameters after 3 steps")
    assert len(result["losses"]) == 3
    expected = MeshLayout.of(strategy.parallelism)
    for seen in result["layout"]:
        rank = seen["rank"]
        assert seen["coords"] == expected.coordinates(rank), (layout, rank, seen)
        for name in FLATTENED:
            assert tuple(seen["flattened"][name]) == expected.flattened(name, rank), (
                f"{layout}: rank {rank}'s {name} group")
        assert tuple(seen["data"]) == expected.flattened("dp", rank), (layout, rank)


def _declared(layout: str) -> list[str]:
    """The precisions the layout's strategy row declares on the CPU, 32-true first."""
    spec = interlock.registered(interlock.StrategySpec)[LAYOUTS[layout][0]]
    return sorted(spec.precisions_on("cpu"), key=lambda p: (p != "32-true", p))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("layout", "precision"), [
    (layout, precision) for layout in LAYOUTS for precision in _declared(layout)
    if precision != "32-true"])
def test_every_declared_precision_matches_one_plain_process(layout: str,
                                                             precision: str) -> None:
    """The rows' other precisions on each layout, against the conformance suite's
    single-process reference in that precision (its tolerance for the compute dtype)."""
    from interlock.conformance import reference

    strategy = resolve(layout, precision=precision)
    got = launch_forked(strategy, lw.train_reference, 2)
    close(got, reference.baseline(precision, 2), f"{layout} in {precision}",
          **reference.tolerance(precision, None))


@pytest.mark.timeout(120)
def test_tensor_parallel_neighbours_read_the_same_batch() -> None:
    result = launch_forked(resolve("fsdp2_tp2"), lw.train_layout, 1)
    by_rank = {seen["rank"]: seen for seen in result["layout"]}
    assert [tuple(by_rank[r]["data"]) for r in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert set(by_rank[0]["coords"]) == set(DIMS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("saved_by", ["hsdp_2x2", "fsdp2_tp2", "pp2_dp2"])
def test_checkpoints_reshard_across_layouts(tmp_path: Path, saved_by: str) -> None:
    path = tmp_path / "ckpt"
    saved = launch_forked(resolve(saved_by, sharded=True), lw.train_and_save_layout,
                          str(path), 2)
    others = [name for name in LAYOUTS if name != saved_by]
    for other in others:
        loaded = launch_forked(resolve(other), lw.load_layout, str(path))
        close(loaded["params"], saved["params"], f"saved by {saved_by}, loaded by {other}")
        assert loaded["step"] == 2
    fsdp4 = interlock.resolve(strategy=_fsdp_sharded(), accelerator="cpu", devices=4,
                              machine=CPU)
    assert isinstance(fsdp4, ParallelStrategy)
    loaded = launch_forked(fsdp4, lw.load_layout, str(path))
    close(loaded["params"], saved["params"], f"saved by {saved_by}, loaded by FSDP 4")
    single = interlock.resolve(strategy="single_device", accelerator="cpu", machine=CPU)
    loaded = single.launch(lw.load_layout, str(path))
    close(loaded["params"], saved["params"], f"saved by {saved_by}, loaded by one process")
    ddp = interlock.resolve(strategy="ddp_fork", accelerator="cpu", devices=2, machine=CPU)
    assert isinstance(ddp, ParallelStrategy)
    loaded = launch_forked(ddp, lw.load_layout, str(path))
    close(loaded["params"], saved["params"], f"saved by {saved_by}, loaded by DDP 2")


def _fsdp_sharded() -> Any:
    from interlock.strategies.fsdp import FSDPStrategy

    return FSDPStrategy(state_dict_type="sharded")


@pytest.mark.timeout(240)
def test_the_other_way_round_fsdp4_ddp2_and_one_process_load_into_the_layouts(
        tmp_path: Path) -> None:
    """FSDP 4's distributed checkpoint into every layout; the full files of DDP 2 and of
    one process into the layouts without a pipeline (a pipeline refuses full files:
    test_a_pipeline_refuses_...)."""
    fsdp4 = interlock.resolve(strategy=_fsdp_sharded(), accelerator="cpu", devices=4,
                              machine=CPU)
    ddp2 = interlock.resolve(strategy="ddp_fork", accelerator="cpu", devices=2, machine=CPU)
    assert isinstance(fsdp4, ParallelStrategy) and isinstance(ddp2, ParallelStrategy)
    single = interlock.resolve(strategy="single_device", accelerator="cpu", machine=CPU)
    saves: list[tuple[str, Path, dict[str, Any], list[str]]] = [
        ("FSDP 4", tmp_path / "fsdp4",
         launch_forked(fsdp4, lw.train_and_save_layout, str(tmp_path / "fsdp4"), 2),
         list(LAYOUTS)),
        ("DDP 2", tmp_path / "ddp2.pt",
         launch_forked(ddp2, lw.train_and_save_layout, str(tmp_path / "ddp2.pt"), 2),
         ["hsdp_2x2", "fsdp2_tp2"]),
        ("one process", tmp_path / "one.pt",
         single.launch(lw.train_and_save_layout, str(tmp_path / "one.pt"), 2),
         ["hsdp_2x2", "fsdp2_tp2"]),
    ]
    for saver, path, saved, layouts in saves:
        for layout in layouts:
            loaded = launch_forked(resolve(layout), lw.load_layout, str(path))
            close(loaded["params"], saved["params"], f"saved by {saver}, loaded by {layout}")


def test_the_default_split_keeps_every_layer_name() -> None:
    from interlock.strategies.pipeline import split_sequential

    with pytest.raises(ValueError, match=r"pp=4 stages, but the model has 2 layers "
                       r"with parameters \(children of its nn.Sequential: Linear, Linear\)"):
        split_sequential(workloads.model(), 0, 4)
    # three children, but the middle one (Tanh) has nothing to train: not a stage
    with pytest.raises(ValueError, match=r"pp=3 stages, but the model has 2 layers"):
        split_sequential(workloads.model(), 0, 3)
    with pytest.raises(ValueError, match=r"splits an nn\.Sequential by default"):
        split_sequential(torch.nn.Linear(2, 2), 0, 2)
    first, last = (split_sequential(workloads.model(), s, 2) for s in (0, 1))
    assert isinstance(first, torch.nn.Sequential) and isinstance(last, torch.nn.Sequential)
    assert [type(m).__name__ for m in first] == ["Linear", "Tanh", "Identity"]
    assert [type(m).__name__ for m in last] == ["Identity", "Identity", "Linear"]
    assert set(last.state_dict()) == {"2.weight", "2.bias"}


@pytest.mark.timeout(120)
def test_the_default_split_gives_every_stage_layers_with_parameters() -> None:
    """Eight children, four with parameters, four stages: one Linear each, the
    activation after a layer kept with it."""
    from interlock.strategies.pipeline import split_sequential

    def net() -> torch.nn.Sequential:
        layers: list[torch.nn.Module] = [torch.nn.Dropout(0.1)]
        for _ in range(4):
            layers += [torch.nn.Linear(4, 4), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    kept = [[type(m).__name__ for m in split_sequential(net(), s, 4).children()
             if not isinstance(m, torch.nn.Identity)] for s in range(4)]
    assert kept == [["Dropout", "Linear", "ReLU"], ["Linear", "ReLU"], ["Linear", "ReLU"],
                    ["Linear"]]
    uneven = [sum(isinstance(m, torch.nn.Linear)
                  for m in split_sequential(net(), s, 3).children()) for s in range(3)]
    assert uneven == [2, 1, 1]


@pytest.mark.timeout(120)
def test_a_pipeline_refuses_a_plain_forward_and_a_full_file_with_the_way_out(
        tmp_path: Path) -> None:
    path = tmp_path / "full.pt"
    single = interlock.resolve(strategy="single_device", accelerator="cpu", machine=CPU)
    single.launch(lw.train_and_save_layout, str(path), 1)
    pipeline = interlock.resolve(
        strategy=ModelParallelStrategy(parallelize_fn=lw.shard_stage), accelerator="cpu",
        devices=2, machine=CPU, parallelism={"pp": 2, "dp_shard": 1})
    assert isinstance(pipeline, ParallelStrategy)
    said = launch_forked(pipeline, lw.misuse_pipeline, str(path))
    assert "strategy.forward_backward(module, inputs, target, loss_fn)" in said["forward"]
    assert "is one full file, but under pipeline parallel (pp=2)" in said["load"]
