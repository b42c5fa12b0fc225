"""Ordinary usage gives the same numbers as one plain PyTorch process.

Each test here reproduces a way in which a strategy once trained silently wrong (or
hung) and compares with a single-process run that uses no interlock at all.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import default_workloads as dw
import pytest
import sharded_workloads as sw
import torch
import workloads
from harness import close, launch_forked
from torch import nn

import interlock
from interlock.strategies.fsdp import FSDPStrategy
from interlock.strategies.launchers import RankFailedError
from interlock.strategies.model_parallel import ModelParallelStrategy
from interlock.strategies.parallel import ParallelStrategy
from interlock.strategies.precision.mixed import MixedPrecision


def sharded(kind: str, devices: int = 2, **options: Any) -> ParallelStrategy:
    strategy: ParallelStrategy
    if kind == "fsdp":
        strategy = FSDPStrategy(**options)
    else:
        strategy = ModelParallelStrategy(parallelize_fn=sw.tensor_parallel,
                                         data_parallel_size=1, tensor_parallel_size=2)
    built = interlock.resolve(strategy=strategy, accelerator="cpu", devices=devices,
                              machine=interlock.Machine())
    assert isinstance(built, ParallelStrategy)
    return built


# ------------------------------------------------------------------ a model passed to launch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["ddp_spawn", "ddp_forkserver", "ddp_fork"])
def test_a_model_passed_to_launch_trains_privately_in_every_rank(name: str) -> None:
    net = workloads.model()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy=name)
    result = strategy.launch(dw.train_given, net, 3)
    assert result["shared_on_arrival"] == [], (
        f"{name}: parameters {result['shared_on_arrival']} arrived in shared memory, so "
        "every rank would step the same storage")
    expected = dw.plain_sgd(3)
    close(result["params"], expected,
          f"{name}: a model passed through launch, 2 ranks vs one plain process")
    close(net.state_dict(), before, f"{name}: the caller's model after launch", rtol=0, atol=0)
    assert not any(p.is_shared() for p in net.parameters()), (  # type: ignore[no-untyped-call]
        f"{name}: launch left the caller's model in shared memory")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["ddp_spawn", "ddp_forkserver"])
def test_queues_still_reach_spawned_ranks_while_tensors_are_copied(name: str) -> None:
    import multiprocessing

    start_method = name.removeprefix("ddp_")
    queue = multiprocessing.get_context(start_method).SimpleQueue()
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy=name)
    strategy.launch(dw.put_rank, queue, torch.ones(3))
    got = sorted(queue.get() for _ in range(2))
    assert got == [(0, False), (1, False)], (
        f"{name}: ranks sent {got}; expected both ranks, each with a private copy")


def test_a_call_that_cannot_pickle_is_refused_before_any_rank_starts() -> None:
    from interlock.strategies.launchers import LaunchError

    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_spawn")
    with pytest.raises(LaunchError, match="the function given to launch"):
        strategy.launch(lambda s: 1)


@pytest.mark.timeout(120)
def test_a_module_in_shared_memory_is_made_private_by_setup_module() -> None:
    net = workloads.model()
    net.share_memory()  # what a torch.multiprocessing queue or spawn would hand over
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_fork")
    result = strategy.launch(dw.train_given, net, 3)
    assert result["shared_on_arrival"], "the test's module should arrive shared under fork"
    close(result["params"], dw.plain_sgd(3),
          "a shared-memory module under ddp_fork, 2 ranks vs one plain process")


# ------------------------------------------------------------------ schedulers


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fsdp", "model_parallel"])
def test_an_lr_scheduler_created_before_setup_keeps_driving_the_optimizer(kind: str) -> None:
    result = launch_forked(sharded(kind), dw.train_with_scheduler, 4)
    expected = dw.plain_with_scheduler(4)
    assert result["same_object"], (
        f"{kind}: setup_module_and_optimizers returned another optimizer object, so a "
        "scheduler created over the original one steps nothing")
    assert result["lr"] == pytest.approx(expected["lr"]), (
        f"{kind}: the optimizer's lr is {result['lr']} after 4 scheduler steps, plain torch "
        f"has {expected['lr']}")
    close(result["params"], expected["params"], f"{kind} with StepLR vs plain torch")


def test_rebinding_keeps_the_lists_optimizers_hold_on_to() -> None:
    from interlock.strategies.base import _rebind

    old = nn.Linear(3, 2)
    new = nn.Linear(3, 2)
    opt = torch.optim.LBFGS(old.parameters())  # keeps a reference to group 0's list
    names = {id(p): n for n, p in old.named_parameters()}
    assert _rebind(opt, names, dict(new.named_parameters())) is opt
    assert opt._params is opt.param_groups[0]["params"], "LBFGS's list was replaced"
    assert [id(p) for p in opt._params] == [id(new.weight), id(new.bias)], (
        "LBFGS still steps the parameters sharding replaced")


def test_an_lr_scheduler_works_on_a_single_device() -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=1, strategy="single_device")
    result = strategy.launch(dw.train_with_scheduler, 4)
    expected = dw.plain_with_scheduler(4)
    assert result["same_object"] and result["lr"] == pytest.approx(expected["lr"])
    close(result["params"], expected["params"], "single device with StepLR vs plain torch")


# ------------------------------------------------------------------ buffers under empty init


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fsdp", "model_parallel"])
def test_empty_init_keeps_buffers_the_module_computes_in_init(kind: str,
                                                                tmp_path: Path) -> None:
    torch.manual_seed(3)
    reference = dw.Rotary()
    path = tmp_path / "weights.pt"
    dw.save_plain(path, reference)
    if kind == "model_parallel":
        strategy = interlock.resolve(
            strategy=ModelParallelStrategy(parallelize_fn=_rotary_tp, data_parallel_size=1,
                                           tensor_parallel_size=2),
            accelerator="cpu", devices=2, machine=interlock.Machine())
    else:
        strategy = sharded(kind)
    assert isinstance(strategy, ParallelStrategy)
    result = launch_forked(strategy, dw.empty_init_then_load, str(path))
    x, _ = workloads.batch(0)
    close(result["freq"], reference.freq, f"{kind}: the non-persistent buffer after empty init",
          rtol=0, atol=0)
    close(result["out"], reference(x).detach(),
          f"{kind}: outputs after empty init + load vs the plain module")


def _rotary_tp(module: nn.Module, mesh: Any) -> nn.Module:
    # proj column-wise keeps its output sharded; the buffer multiplies the full output,
    # so gather it again (use_local_output=False keeps a DTensor; Replicate output)
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    parallelize_module(module, mesh["tensor_parallel"],
                       {"proj": ColwiseParallel(output_layouts=Replicate()),
                        "head": RowwiseParallel(input_layouts=Replicate())})
    return module


# ------------------------------------------------------------------ 64-true


def test_64_true_hands_outputs_back_in_float64_and_trains_at_double_accuracy() -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=1, precision="64-true")
    module = strategy.setup_module(workloads.model())
    opt = strategy.setup_optimizer(torch.optim.SGD(module.parameters(), lr=dw.LR))
    plain = workloads.model().double()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=dw.LR)
    for step in range(5):
        x, y = workloads.batch(step)
        out = module(x)
        assert out.dtype == torch.float64, f"64-true handed the output back as {out.dtype}"
        strategy.backward(nn.functional.mse_loss(out, y), module)
        strategy.optimizer_step(opt)
        opt.zero_grad()
        nn.functional.mse_loss(plain(x.double()), y.double()).backward()  # type: ignore[no-untyped-call]
        plain_opt.step()
        plain_opt.zero_grad()
    close(module.state_dict(), plain.state_dict(),
          "64-true vs plain float64 training after 5 steps", rtol=1e-15, atol=1e-15)


# ------------------------------------------------------------------ clipping per optimizer


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_clipping_once_per_optimizer_clips_only_that_optimizers_gradients(
        precision: str) -> None:
    if precision == "16-mixed":
        # a scale whose scaled float16 gradients stay finite, so the first step is taken
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        strategy = interlock.resolve(accelerator="cpu", devices=1, plugins=[
            MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    else:
        strategy = interlock.resolve(accelerator="cpu", devices=1, precision=precision)
    net = workloads.model()
    first, _, last = net.children()
    given: list[torch.optim.Optimizer] = [torch.optim.SGD(first.parameters(), lr=dw.LR),
                                          torch.optim.SGD(last.parameters(), lr=dw.LR)]
    module, opts = strategy.setup_module_and_optimizers(net, given)
    plain = workloads.model()
    plain_layers = list(plain.children())
    x, y = workloads.batch(0)
    nn.functional.mse_loss(plain(x), y).backward()  # type: ignore[no-untyped-call]
    want = [torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in layer.parameters()
                                                if p.grad is not None]))
            for layer in (plain_layers[0], plain_layers[2])]
    strategy.backward(nn.functional.mse_loss(module(x).float(), y), module)
    norms = [strategy.clip_gradients_norm(module, opt, max_norm=1e6) for opt in opts]
    tol = {"rtol": 1e-2, "atol": 1e-3} if precision == "16-mixed" else {}
    for i, (got, expected) in enumerate(zip(norms, want, strict=True)):
        close(got.float(), expected, f"{precision}: norm returned for optimizer {i}", **tol)
    before = [p.detach().clone() for p in last.parameters()]
    for opt in opts:
        strategy.optimizer_step(opt)
    moved = max(float((p.detach() - b).abs().max())
                for p, b in zip(last.parameters(), before, strict=True))
    assert moved > 1e-3, (
        f"{precision}: the second optimizer's layer moved only {moved:.2e} after clipping")


@pytest.mark.parametrize("bound", [-1.0, 0.0, float("nan"), float("inf"), True])
def test_clipping_bounds_that_would_corrupt_gradients_are_refused(bound: Any) -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=1)
    module = strategy.setup_module(workloads.model())
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    x, y = workloads.batch(0)
    strategy.backward(nn.functional.mse_loss(module(x), y), module)
    before = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    with pytest.raises(ValueError, match="expected a positive finite number"):
        strategy.clip_gradients_norm(module, opt, bound)
    with pytest.raises(ValueError, match="expected a positive finite number"):
        strategy.clip_gradients_value(module, opt, bound)
    after = [p.grad for p in module.parameters() if p.grad is not None]
    close(after, before, "gradients after a refused clip", rtol=0, atol=0)


def test_clipping_with_an_optimizer_over_another_module_is_refused() -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=1)
    module = strategy.setup_module(workloads.model())
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="steps none of the parameters"):
        strategy.clip_gradients_norm(module, other, 1.0)


# ------------------------------------------------------------------ one starting point


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fsdp", "model_parallel"])
def test_every_rank_starts_from_rank_zeros_weights(kind: str) -> None:
    result = launch_forked(sharded(kind), dw.per_rank_seed_start)
    for rank, params in enumerate(result["everyone"]):
        close(params, result["params"], f"{kind}: rank {rank}'s gathered weights vs rank 0's")
    close(result["params"], dw.rank0_seed_model(),
          f"{kind}: weights after setup vs what rank 0 built (per-rank seeds)", rtol=0, atol=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fsdp", "model_parallel"])
def test_empty_init_gives_the_weights_one_process_would_initialise(kind: str) -> None:
    result = launch_forked(sharded(kind), dw.empty_init_values)
    expected = dw.empty_init_reference()
    close(result["params"], expected["params"],
          f"{kind}: weights initialised after sharding vs reset_parameters in one process "
          "(shards must not repeat each other)", rtol=0, atol=0)
    close(result["after"], expected["after"],
          f"{kind}: the caller's random stream after setup", rtol=0, atol=0)


# ------------------------------------------------------------------ uneven inputs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["ddp_spawn", "fsdp"])
def test_ranks_with_uneven_step_counts_fail_promptly_by_name(kind: str) -> None:
    if kind == "fsdp":
        strategy: Any = sharded("fsdp")
        strategy.timeout = datetime.timedelta(minutes=10)
        launch = launch_forked
    else:
        strategy = interlock.resolve(accelerator="cpu", devices=2, strategy=kind)
        strategy.timeout = datetime.timedelta(minutes=10)
        launch = _launch
    with pytest.raises(RankFailedError) as caught:
        launch(strategy, dw.uneven_steps)
    text = str(caught.value)
    assert "rank 0 was left in a collective that rank 1 will never join" in text, text[-2000:]
    assert "setup_dataloader" in text


def _launch(strategy: Any, fn: Any, *args: Any) -> Any:
    return strategy.launch(fn, *args)


# ------------------------------------------------------------------ unused parameters


@pytest.mark.timeout(150)
@pytest.mark.parametrize("layout", ["full", "sharded"])
def test_optimizer_state_without_an_unused_parameter_loads_into_fsdp(
        layout: str, tmp_path: Path) -> None:
    path = str(tmp_path / ("ckpt" if layout == "sharded" else "ckpt.pt"))
    saved = launch_forked(sharded("fsdp", state_dict_type=layout), dw.save_with_unused, path)
    assert {0, 1, 4, 5} <= set(saved["optimizer"]["state"]) and 2 not in saved["optimizer"][
        "state"], "the saved Adam state should hold no entry for the unused layer"
    loaded = launch_forked(sharded("fsdp"), dw.load_with_unused, path)
    close(loaded["params"], saved["params"], f"{layout}: parameters after loading", rtol=0,
          atol=0)
    for index in (0, 1, 4, 5):
        close(loaded["optimizer"]["state"][index], saved["optimizer"]["state"][index],
              f"{layout}: Adam state of parameter {index} after loading", rtol=0, atol=0)
    # what is allowed to be missing is only a parameter's whole state: another
    # optimizer's checkpoint is still refused
    refused = launch_forked(sharded("fsdp"), dw.load_into_sgd, path)
    assert refused.startswith("CheckpointLoadError"), (
        f"{layout}: an Adam checkpoint loaded into SGD: {refused[:500]}")


# ------------------------------------------------------------------ several launchers


SEVERAL_LAUNCHERS = """
import interlock

def where(strategy, tag):
    return [tag, strategy.world_size, strategy.collective.all_gather_object(strategy.global_rank)]

def fail(strategy):
    raise ValueError("planned")

if __name__ == "__main__":
    results = []
    for name in ("ddp_spawn", "ddp", "single_device", "ddp_fork", "ddp"):
        devices = 1 if name == "single_device" else 2
        strategy = interlock.resolve(accelerator="cpu", devices=devices, strategy=name)
        if name == "single_device":
            results.append(strategy.launch(lambda s: ["single", s.world_size, [0]]))
        else:
            results.append(strategy.launch(where, name))
    try:
        interlock.resolve(accelerator="cpu", devices=2, strategy="ddp").launch(fail)
    except Exception as error:
        results.append(type(error).__name__)
    results.append(interlock.resolve(accelerator="cpu", devices=2, strategy="ddp").launch(
        where, "after-failure"))
    print(results)
"""


@pytest.mark.timeout(240)
def test_launches_with_different_launchers_in_one_script(tmp_path: Path) -> None:
    script = tmp_path / "several.py"
    script.write_text(textwrap.dedent(SEVERAL_LAUNCHERS))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=220, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"only rank 0 should print, got:\n{proc.stdout}"
    assert lines[0] == str([
        ["ddp_spawn", 2, [0, 1]], ["ddp", 2, [0, 1]], ["single", 1, [0]],
        ["ddp_fork", 2, [0, 1]], ["ddp", 2, [0, 1]], "RankFailedError",
        ["after-failure", 2, [0, 1]],
    ])
