"""Features combined as training scripts combine them, each run against the same loop
in one plain process: clipping and accumulation under pipelines, clipping under
tensor-parallel plans that leave a layer replicated, data-parallel replicas that a
parallelize function leaves unsynchronised."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import together_workloads as tw
import torch
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


def _set_up_the_whole_model(strategy: ParallelStrategy, tied: bool) -> dict[str, Any]:
    """An optimizer created over the whole model before setup, as scripts write it;
    what each stage's optimizer steps after setup."""
    from interlock.conformance import recipes

    model = recipes.build(0.0, tied)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-2)
    module, (opt,) = strategy.setup_module_and_optimizers(model, [adamw])
    stepped = {id(p) for group in opt.param_groups for p in group["params"]}
    held = [name.rsplit("stage_module.", 1)[-1] for name, p in module.named_parameters()
            if id(p) in stepped]
    return {"stages": strategy.collective.all_gather_object(held),
            "count": len(stepped)}


@pytest.mark.timeout(120)
def test_an_optimizer_over_the_whole_model_steps_each_stage_s_own_layers() -> None:
    got = launch_forked(_model_parallel("pp2"), _set_up_the_whole_model, False)
    first, last = got["stages"]
    assert first and last and not set(first) & set(last), got
    assert "embed.weight" in first and "head.weight" in last, got
    assert got["count"] == len(first), "rank 0's optimizer steps what its stage lacks"


@pytest.mark.timeout(120)
def test_weights_tied_across_pipeline_stages_are_refused_on_every_stage() -> None:
    """The embedding on the first stage and the tied head on the last would each train
    a copy of their own: refused at setup, naming both, on every rank alike."""
    with pytest.raises(Exception, match=r"embed.weight and head.weight are one parameter "
                       r"\(tied weights\), but the pipeline split puts it on stages 0, 1"
                       ) as info:
        launch_forked(_model_parallel("pp2"), _set_up_the_whole_model, True)
    assert "untie them" in str(info.value)


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


def _sharded_fsdp() -> Any:
    from interlock.strategies.fsdp import FSDPStrategy

    return FSDPStrategy(state_dict_type="sharded")


#: name -> (strategy flag, devices, parallelism); each saves its own kind of checkpoint
RESUMING: dict[str, tuple[Callable[[], Any], int, dict[str, int] | None]] = {
    "single_device": (lambda: "single_device", 1, None),
    "ddp_fork": (lambda: "ddp_fork", 2, None),
    "fsdp full file": (lambda: "fsdp", 2, None),
    "fsdp sharded": (_sharded_fsdp, 2, None),
    "model_parallel dp_shard=2": (
        lambda: ModelParallelStrategy(parallelize_fn=shard_stage), 2, {"dp_shard": 2}),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(RESUMING))
def test_a_resumed_run_with_dropout_equals_the_undisturbed_one(tmp_path: Path,
                                                                name: str) -> None:
    """The checkpoint carries every rank's random state (torch's, Python's, numpy's):
    after loading, dropout masks and random jitter continue exactly, though the
    resumed ranks were seeded otherwise."""
    flag, devices, degrees = RESUMING[name]

    def run(*args: Any) -> dict[str, torch.Tensor]:
        strategy = interlock.resolve(strategy=flag(), accelerator="cpu", devices=devices,
                                     machine=CPU, parallelism=degrees)
        if isinstance(strategy, ParallelStrategy):
            result: dict[str, torch.Tensor] = launch_forked(strategy, tw.train_with_dropout,
                                                            *args)
            return result
        return strategy.launch(tw.train_with_dropout, *args)

    path = str(tmp_path / "ckpt")
    undisturbed = run(path, 6, 3, False)
    resumed = run(path, 6, 3, True)
    for key, value in undisturbed.items():
        assert torch.equal(resumed[key], value), f"{name}: {key} differs after resuming"


@pytest.mark.timeout(120)
def test_random_state_from_another_world_size_is_not_restored_and_says_so(
        tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    ddp = interlock.resolve(strategy="ddp_fork", accelerator="cpu", devices=2, machine=CPU)
    assert isinstance(ddp, ParallelStrategy)
    launch_forked(ddp, tw.train_with_dropout, path, 2, 2, False)
    single = interlock.resolve(strategy="single_device", accelerator="cpu", machine=CPU)
    torch.manual_seed(3)
    expected = torch.get_rng_state()
    with pytest.warns(RuntimeWarning, match=r"random state is from 2 ranks and this run "
                      r"has 1: it is not restored"):
        single.launch(lambda s: s.load_checkpoint(path, {"step": 0}))
    assert torch.equal(torch.get_rng_state(), expected)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["fsdp full file", "fsdp sharded", "ddp_fork"])
def test_a_model_with_tied_weights_resumes_from_its_checkpoint(tmp_path: Path,
                                                              name: str) -> None:
    """Every language model with tied embeddings: the head's weight is the embedding's,
    before and after a load, and the resumed run equals one process."""
    flag, devices, degrees = RESUMING[name]
    path = str(tmp_path / "ckpt")
    strategy = interlock.resolve(strategy=flag(), accelerator="cpu", devices=devices,
                                 machine=CPU, parallelism=degrees)
    assert isinstance(strategy, ParallelStrategy)
    launch_forked(strategy, tw.train_tied, path, 4, 2, False)
    resumed = launch_forked(strategy, tw.train_tied, path, 4, 2, True)
    assert resumed["tied_live"], f"{name}: the load untied the head from the embedding"
    close(resumed["params"], tw.baseline_tied(4), f"{name}: resumed, after 4 steps")


def _optimizer_over_another_module(strategy: Any) -> str:
    other = torch.nn.Linear(2, 2)
    try:
        strategy.setup_module_and_optimizers(torch.nn.Linear(2, 2),
                                             [torch.optim.SGD(other.parameters(), lr=0.1)])
    except ValueError as error:
        return str(error)
    return "accepted"


def test_an_optimizer_over_another_module_is_still_refused_outside_pipelines() -> None:
    """Only a rank that holds part of the layers may leave parameters out of its
    optimizer; elsewhere a parameter the set-up module lacks is a mistake, refused."""
    single = interlock.resolve(strategy="single_device", accelerator="cpu", machine=CPU)
    assert single.holds_every_parameter
    said = single.launch(_optimizer_over_another_module)
    assert said == "SGD steps 2 tensor(s) that are not parameters of the module being set up"


@pytest.mark.parametrize("precision", ["32-true", "64-true"])
def test_moving_or_casting_a_model_keeps_its_tied_weights_tied(precision: str) -> None:
    """Where Module.to gives each module a new Parameter (CPU to an XLA device; here the
    same through torch's overwrite-on-conversion switch), the head and the embedding
    must still share one weight after setup, moved (32-true) or cast (64-true)."""
    from interlock.conformance import recipes

    single = interlock.resolve(strategy="single_device", accelerator="cpu", machine=CPU,
                               precision=precision)
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        plain = recipes.build(0.0).to("cpu")  # what the switch does to a plain .to()
        assert not _head_tied(plain)
        module = single.setup_module(recipes.build(0.0))
        moved = single.module_to_device(recipes.build(0.0))
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)
    user = module.module
    assert _head_tied(user), "setup untied the head from the embedding"
    assert user.get_parameter("head.weight").dtype == (
        torch.float64 if precision == "64-true" else torch.float32)
    assert [n for n, _ in user.named_parameters()] == [
        n for n, _ in recipes.build(0.0).named_parameters()]
    assert _head_tied(moved), "module_to_device untied the head from the embedding"


def _head_tied(model: torch.nn.Module) -> bool:
    return model.get_parameter("head.weight") is model.get_parameter("embed.weight")
