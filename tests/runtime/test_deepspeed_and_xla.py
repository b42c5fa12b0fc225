"""DeepSpeed and XLA strategies: configuration, resolution and wiring everywhere; real
training where deepspeed (on its CPU accelerator, or with CUDA) or torch_xla is
installed (``nox -s deepspeed``, ``nox -s xla``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

import interlock
from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.strategies.deepspeed import DeepSpeedStrategy
from interlock.strategies.deepspeed_config import deepspeed_config, merge
from interlock.strategies.io.xla_io import XLACheckpointIO
from interlock.strategies.precision.deepspeed import DeepSpeedPrecision
from interlock.strategies.precision.xla import XLAPrecision
from interlock.strategies.xla import SingleDeviceXLAStrategy, XLAFSDPStrategy, XLAStrategy

GPUS = interlock.Machine(cuda_devices=2, packages=frozenset({"deepspeed"}))
TPU = interlock.Machine(xla_devices=8, packages=frozenset({"torch_xla"}))
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
DEEPSPEED_ROWS = [s for s in BUILTIN_STRATEGIES if s.family == "deepspeed"]


@pytest.mark.parametrize("spec", DEEPSPEED_ROWS, ids=lambda s: s.name)
def test_every_deepspeed_row_builds_the_config_its_name_promises(spec: Any) -> None:
    strategy = interlock.resolve(strategy=spec.name, devices=2, precision="bf16-mixed",
                                 machine=GPUS)
    assert isinstance(strategy, DeepSpeedStrategy)
    assert isinstance(strategy.precision, DeepSpeedPrecision)
    if strategy.zero_options["remote_device"] == "nvme":
        strategy.zero_options["nvme_path"] = "/mnt/nvme"  # the one option a name cannot give
    config = strategy.config
    zero = config["zero_optimization"]
    assert zero["stage"] == spec.options.get("stage", 2), spec.name
    offload = "offload" in spec.name
    assert ("offload_optimizer" in zero) == offload, f"{spec.name}: {zero}"
    assert ("offload_param" in zero) == (offload and zero["stage"] == 3), f"{spec.name}: {zero}"
    # mixed: float32 parameters, the forward pass under torch's autocast
    assert config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}, config
    assert "bf16" not in config and "fp16" not in config
    assert config["gradient_clipping"] == 0.0, "DeepSpeed's default would clip at 1.0"


def test_precision_sections_and_overrides_merge_key_by_key(tmp_path: Path) -> None:
    fp16 = deepspeed_config(precision="16-true")
    # 16-true has no scaler: a static scale of 1, never a skipped step
    assert fp16["fp16"] == {"enabled": True, "loss_scale": 1.0}, fp16
    # ZeRO-3's process-wide replacement of torch.nn.functional.linear stays off
    assert deepspeed_config(stage=3)["zero_optimization"]["memory_efficient_linear"] is False
    assert deepspeed_config(precision="bf16-true")["bf16"] == {"enabled": True}
    assert deepspeed_config(precision="16-mixed")["torch_autocast"]["dtype"] == "float16"
    plain = deepspeed_config()
    assert not {"fp16", "bf16", "torch_autocast"} & set(plain)
    assert plain["gradient_clipping"] == 0.0
    merged = deepspeed_config(stage=3, overrides={
        "zero_optimization": {"stage3_max_live_parameters": 1}, "gradient_clipping": 1.0,
    })
    assert merged["zero_optimization"]["stage"] == 3, "an override replaced a whole section"
    assert merged["zero_optimization"]["stage3_max_live_parameters"] == 1
    assert merged["gradient_clipping"] == 1.0
    file = tmp_path / "ds.json"
    file.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4}))
    assert deepspeed_config(overrides=file)["train_micro_batch_size_per_gpu"] == 4
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}


@pytest.mark.parametrize(
    ("options", "match"),
    [({"stage": 4}, "ZeRO stages are"),
     ({"stage": 2, "offload_parameters": True}, "needs ZeRO stage 3"),
     ({"stage": 3, "offload_parameters": True, "remote_device": "nvme", "nvme_path": ""},
      "needs nvme_path"),
     ({"remote_device": "disk"}, "remote_device='disk'"),
     ({"overrides": "/nonexistent/ds.json"}, "could not be read")],
)
def test_bad_deepspeed_options_are_refused_with_the_reason(options: dict[str, Any],
                                                           match: str) -> None:
    with pytest.raises(ValueError, match=match):
        deepspeed_config(**options)
    if "nvme_path" in options:
        return  # the strategy defers this one to setup (see the nvme row test)
    with pytest.raises(ValueError, match=match):
        DeepSpeedStrategy(**{("config" if k == "overrides" else k): v
                             for k, v in options.items()})


def test_the_engine_states_the_measured_cpu_facts_and_needs_the_package() -> None:
    cpu = interlock.Machine(packages=frozenset({"deepspeed"}))
    for precision in ("32-true", "bf16-mixed", "bf16-true"):
        interlock.plan(strategy="deepspeed", accelerator="cpu", devices=2,
                       precision=precision, machine=cpu)
    for precision in ("16-mixed", "16-true"):
        with pytest.raises(interlock.ResolutionError) as info:
            interlock.plan(strategy="deepspeed_stage_3", accelerator="cpu", devices=2,
                           precision=precision, machine=cpu)
        assert info.value.code == "unsupported-precision"
        assert "CPU accelerator does not support float16" in str(info.value)
        assert set(info.value.choices) == {"32-true", "bf16-mixed", "bf16-true"}
    interlock.plan(strategy="deepspeed", accelerator="cuda", devices=2,
                   precision="16-mixed", machine=GPUS)
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(strategy="deepspeed", accelerator="cpu", devices=2,
                       machine=interlock.Machine())
    assert info.value.code == "missing-package" and "pip install deepspeed" in str(info.value)
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(strategy="deepspeed", devices=2,
                       machine=interlock.Machine(cuda_devices=2))
    assert info.value.code == "missing-package" and "pip install deepspeed" in str(info.value)


def test_deepspeed_explains_what_it_does_differently() -> None:
    strategy = interlock.resolve(strategy="deepspeed", devices=2, machine=GPUS)
    assert isinstance(strategy, DeepSpeedStrategy)
    with pytest.raises(RuntimeError, match="setup_module_and_optimizers"):
        strategy.setup_optimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1))
    with pytest.raises(RuntimeError, match="gradient_accumulation_steps"), \
            strategy.no_backward_sync(torch.nn.Linear(1, 1)):
        pass
    layer = torch.nn.Linear(1, 1)
    with pytest.raises(RuntimeError, match="gradient_clipping"):
        strategy.clip_gradients_norm(layer, torch.optim.SGD(layer.parameters(), lr=1), 1.0)
    nvme = interlock.resolve(strategy="deepspeed_stage_3_offload_nvme", devices=2, machine=GPUS)
    assert isinstance(nvme, DeepSpeedStrategy)
    with pytest.raises(ValueError, match="needs nvme_path"):
        nvme.config  # noqa: B018 - the property builds the config
    if not HAS_DEEPSPEED:
        with pytest.raises(ImportError, match="pip install deepspeed"):
            strategy.setup_environment()


def test_xla_rows_resolve_and_wire_without_importing_torch_xla() -> None:
    before = "torch_xla" in sys.modules
    strategy = interlock.resolve(accelerator="tpu", devices=8, strategy="xla",
                                 precision="bf16-true", machine=TPU)
    assert isinstance(strategy, XLAStrategy) and strategy.backend == "xla"
    assert isinstance(strategy.precision, XLAPrecision)
    assert strategy.precision.dtype == torch.bfloat16
    assert isinstance(strategy.checkpoint_io, XLACheckpointIO)
    assert type(strategy.launcher).__name__ == "XLALauncher"
    single = interlock.resolve(accelerator="tpu", devices=1, strategy="single_xla", machine=TPU)
    assert isinstance(single, SingleDeviceXLAStrategy)
    debug = interlock.resolve(accelerator="tpu", devices=8, strategy="xla_debug", machine=TPU)
    assert isinstance(debug, XLAStrategy) and debug.debug
    fsdp = interlock.resolve(accelerator="tpu", devices=8, strategy="xla_fsdp", machine=TPU)
    assert isinstance(fsdp, XLAFSDPStrategy)
    assert ("torch_xla" in sys.modules) == before, "resolving imported torch_xla"


@pytest.mark.parametrize("strategy_class", [SingleDeviceXLAStrategy, XLAStrategy])
def test_debug_turns_on_torch_xla_debug_checks_in_both_xla_strategies(
        strategy_class: type[SingleDeviceXLAStrategy | XLAStrategy],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # single_xla took `debug` and ignored it; the device binding is stubbed so that the
    # variable is checked without torch_xla
    monkeypatch.delenv("PT_XLA_DEBUG_LEVEL", raising=False)
    for debug in (False, True):
        devices = 1 if strategy_class is SingleDeviceXLAStrategy else 8
        strategy = interlock.resolve(strategy=strategy_class(debug=debug), devices=devices,
                                     machine=TPU)
        assert isinstance(strategy, strategy_class)
        strategy._device = torch.device("cpu")
        monkeypatch.setattr(strategy.accelerator, "setup_device", lambda device: None)
        monkeypatch.setattr(strategy, "_collective", mock.Mock(owns_group=True))
        strategy.setup_environment()
        assert os.environ.get("PT_XLA_DEBUG_LEVEL") == ("2" if debug else None)


@pytest.mark.skipif(HAS_TORCH_XLA, reason="checks the message shown without torch_xla")
def test_without_torch_xla_setup_names_the_install_command() -> None:
    strategy = interlock.resolve(accelerator="tpu", devices=1, strategy="single_xla",
                                 machine=TPU)
    with pytest.raises(ImportError, match=r"pip install 'torch_xla\[tpu\]'"):
        strategy.setup_environment()
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="tpu", strategy="xla",
                       machine=interlock.Machine(xla_devices=8))
    assert info.value.code == "missing-package"


def test_xla_precision_refuses_what_xla_does_not_run() -> None:
    with pytest.raises(ValueError, match="expected one of '32-true', '16-true', 'bf16-true'"):
        XLAPrecision("16-mixed")
    assert XLAPrecision("16-true").dtype == torch.float16
    assert XLAPrecision("32-true").dtype == torch.float32


XLA_SCRIPT = """
import torch, interlock
from interlock.strategies.checkpointing import RUNTIME_KEYS
from interlock.strategies.xla import SingleDeviceXLAStrategy
torch.manual_seed(0)
def train(strategy):
    net = strategy.setup_module(torch.nn.Linear(4, 1))
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = strategy.batch_to_device(torch.randn(8, 4, generator=g))
        loss = net(x).pow(2).mean()
        strategy.backward(loss, net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    strategy.save_checkpoint(PATH, {"model": net, "optimizer": opt})
    return {k: v.cpu() for k, v in net.state_dict().items()}
strategy = interlock.resolve(accelerator="xla", devices=1, strategy="single_xla")
assert isinstance(strategy, SingleDeviceXLAStrategy)
result = strategy.launch(train)
torch.manual_seed(0)
ref = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(3):
    g = torch.Generator().manual_seed(step)
    ref(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
for k, v in ref.state_dict().items():
    torch.testing.assert_close(result[k], v, rtol=1e-4, atol=1e-5)
# a plain torch file: the entries asked for, beside the runtime's own (the random state)
saved = torch.load(PATH, weights_only=True)
assert {"model", "optimizer"} <= set(saved) <= {"model", "optimizer"} | RUNTIME_KEYS, set(saved)
torch.testing.assert_close(saved["model"], ref.state_dict(), rtol=1e-4, atol=1e-5)
print("xla ok", strategy.root_device)
"""


NEEDS_TORCH_XLA = pytest.mark.skipif(not HAS_TORCH_XLA, reason="torch_xla is not installed "
                                     "(nox -s xla runs this on its CPU PJRT device)")


def run_on_the_cpu_device(script: str, path: Path, done_line: str) -> None:
    """Run ``script`` (PATH replaced by ``path``) in a fresh interpreter on torch_xla's
    CPU PJRT device; it must exit 0 having printed ``done_line``."""
    done = subprocess.run([sys.executable, "-c", script.replace("PATH", repr(str(path)))],
                          capture_output=True, text=True, timeout=280,
                          env={**__import__("os").environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done_line in done.stdout


@pytest.mark.timeout(300)
@NEEDS_TORCH_XLA
def test_single_xla_trains_with_parity_on_a_real_xla_device(tmp_path: Path) -> None:
    run_on_the_cpu_device(XLA_SCRIPT, tmp_path / "xla.pt", "xla ok")


XLA_FSDP_SCRIPT = """
import torch, interlock
from interlock.strategies.io import CheckpointLoadError
from interlock.strategies.xla import XLAFSDPStrategy

def layers(width):
    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 1))

def batches():
    return [torch.randn(8, 4, generator=torch.Generator().manual_seed(s)) for s in range(3)]

def train(strategy):
    torch.manual_seed(0)
    model = layers(3)
    # created before setup: re-pointed at the shards in place, like every strategy's
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    net, optimizers = strategy.setup_module_and_optimizers(model, [opt])
    assert optimizers == [opt]
    for x in batches():
        strategy.backward(net(strategy.batch_to_device(x)).pow(2).mean(), net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    strategy.save_checkpoint(PATH, {"model": net, "optimizer": opt, "step": 3})
    after_save = torch.rand(3)
    shards = {k: v.cpu() for k, v in net.forward_module.state_dict().items()}
    probe = strategy.batch_to_device(torch.ones(2, 4))
    out = net(probe).cpu()

    torch.manual_seed(1)  # another model of the same shape loads them back, all of it
    fresh = strategy.setup_module(layers(3))
    fresh_opt = strategy.setup_optimizer(torch.optim.SGD(fresh.parameters(), lr=0.1))
    state = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    strategy.load_checkpoint(PATH, state)
    assert state["step"] == 3, state
    assert torch.equal(torch.rand(3), after_save), "the random state was not restored"
    for k, v in fresh.forward_module.state_dict().items():
        torch.testing.assert_close(v.cpu(), shards[k])
    torch.testing.assert_close(fresh(probe).cpu(), out)
    assert fresh_opt.param_groups[0]["momentum"] == 0.9

    # the state dict: full tensors keyed like the user's module, and back
    full = {k: v.cpu() for k, v in net.state_dict().items()}
    torch.manual_seed(2)
    again = strategy.setup_module(layers(3))
    again.load_state_dict(full)
    torch.testing.assert_close(again(probe).cpu(), out)
    try:
        again.load_state_dict({**full, "0.weight": torch.zeros(5, 4)})
    except RuntimeError as error:
        assert "size mismatch for 0.weight" in str(error), error
    else:
        raise AssertionError("a tensor of another shape loaded")

    # padded shards of another shape: refused from the shard metadata, nothing changes
    other = strategy.setup_module(layers(5))
    before = {k: v.cpu().clone() for k, v in other.forward_module.state_dict().items()}
    try:
        strategy.load_checkpoint(PATH, {"model": other})
    except CheckpointLoadError as error:
        refused = str(error)
    else:
        raise AssertionError("shards of another shape loaded")
    for k, v in other.forward_module.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k
    return out, refused, full

strategy = interlock.resolve(accelerator="xla", devices=1, strategy="xla_fsdp")
assert isinstance(strategy, XLAFSDPStrategy)
out, refused, full = strategy.launch(train)
assert "0.weight: saved shape (3, 4), this model has (5, 4)" in refused, refused
assert "nothing was restored" in refused, refused
torch.manual_seed(0)
ref = layers(3)
opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for x in batches():
    ref(x).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
torch.testing.assert_close(out, ref(torch.ones(2, 4)).detach(), rtol=1e-4, atol=1e-5)

def one_step(strategy):  # what the bf16-true refusal suggests runs
    net = strategy.setup_module(layers(3))
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    strategy.backward(net(strategy.batch_to_device(torch.ones(2, 4))).sum(), net)
    strategy.optimizer_step(opt)
    return str(net.forward_module.compute_dtype)

compute = XLAFSDPStrategy(compute_dtype=torch.bfloat16)
assert interlock.resolve(accelerator="xla", devices=1, strategy=compute) is compute
assert compute.launch(one_step) == "torch.bfloat16"
print("xla_fsdp ok", strategy.root_device)
"""


@pytest.mark.timeout(300)
@NEEDS_TORCH_XLA
def test_xla_fsdp_trains_saves_and_loads_its_shards_all_or_nothing(tmp_path: Path) -> None:
    run_on_the_cpu_device(XLA_FSDP_SCRIPT, tmp_path / "shards", "xla_fsdp ok")


def test_the_xla_launcher_refuses_several_ranks_on_the_cpu_pjrt_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.strategies.launchers import LaunchError
    from interlock.strategies.launchers import xla as xla_launcher

    class Runtime:
        device = "CPU"

        def device_type(self) -> str:
            return self.device

    runtime = Runtime()
    monkeypatch.setattr(xla_launcher, "import_torch_xla", lambda: runtime)
    monkeypatch.setattr(xla_launcher, "_IMPORT_ENVIRONMENT", None)
    with pytest.raises(LaunchError, match=r"no collective.*pytorch/xla#9089"):
        xla_launcher.XLALauncher(num_processes=2).launch(print)
    xla_launcher.refuse_cpu_collectives("TPU", 8)  # TPU launches go on to xmp.spawn
    xla_launcher.refuse_cpu_collectives("CPU", 1)


XLA_CPU_TWO_RANKS = """
import interlock
from interlock.strategies.launchers import LaunchError
strategy = interlock.resolve(accelerator="xla", devices=2, strategy="xla")
try:
    strategy.launch(print)
except LaunchError as error:
    print("refused:", error)
"""


@pytest.mark.timeout(200)
@pytest.mark.skipif(not HAS_TORCH_XLA, reason="torch_xla is not installed (nox -s xla runs "
                    "this on its CPU PJRT device)")
def test_two_xla_ranks_on_the_cpu_pjrt_device_are_refused_before_any_worker_starts() -> None:
    env = {**__import__("os").environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    done = subprocess.run([sys.executable, "-c", XLA_CPU_TWO_RANKS], capture_output=True,
                          text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused:" in done.stdout and "pytorch/xla#9089" in done.stdout, done.stdout


@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_DEEPSPEED and torch.cuda.is_available()),
                    reason="needs deepspeed and CUDA devices")
def test_deepspeed_stage_2_trains_on_cuda(tmp_path: Path) -> None:
    import workloads

    strategy = interlock.resolve(strategy="deepspeed_stage_2", devices=1,
                                 precision="bf16-mixed")
    assert isinstance(strategy, DeepSpeedStrategy)
    # the row's script launcher re-runs the main script for the other ranks, and a
    # pytest(-xdist) worker has none: spawn the rank instead (fork is unsafe once
    # CUDA is initialised in this process)
    result = _launch_spawned(strategy, _deepspeed_train, str(tmp_path / "ds"))
    assert result["loss_went_down"], result
    assert (tmp_path / "ds").is_dir()
    del workloads


def _launch_spawned(strategy: DeepSpeedStrategy, fn: Any, *args: Any) -> Any:
    """``strategy.launch(fn, *args)`` with spawned worker processes."""
    from interlock.strategies.base import _run_worker
    from interlock.strategies.launchers import MultiProcessingLauncher

    launcher = MultiProcessingLauncher(start_method="spawn",
                                       num_processes=strategy.num_processes)
    return launcher.launch(_run_worker, strategy, fn, args, {})


def _deepspeed_train(strategy: Any, path: str) -> dict[str, Any]:
    import workloads

    # the optimizer over the module's own parameters (DeepSpeed maps each to its name)
    model = workloads.model()
    net, (opt,) = strategy.setup_module_and_optimizers(
        model, [torch.optim.Adam(model.parameters(), lr=1e-2)]
    )
    losses = []
    # one batch throughout: its loss must fall (fresh batches each step need not)
    x, y = strategy.batch_to_device(workloads.batch(0))
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(net(x).float(), y)
        strategy.backward(loss, net)
        strategy.optimizer_step(opt)
        losses.append(float(loss))
    strategy.save_checkpoint(path, {"model": net, "step": 5})
    return {"loss_went_down": losses[-1] < losses[0], "losses": losses}


# ------------------------------------------------- DeepSpeed for real on its CPU accelerator

NEEDS_DEEPSPEED = pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed "
                                     "(nox -s deepspeed installs it and runs these)")


def _plain_steps(steps: int, clip: float | None = None,
                 micro: int = 1) -> dict[str, torch.Tensor]:
    """One plain process: SGD with momentum on the full batches, optionally clipped."""
    from interlock.conformance import reference

    net = reference.model()
    opt = torch.optim.SGD(net.parameters(), lr=reference.LR, momentum=0.9)
    for step in range(steps):
        for m in range(micro):
            x, y = reference.batch(step * micro + m)
            (torch.nn.functional.mse_loss(net(x), y) / micro).backward()  # type: ignore[no-untyped-call]
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _deepspeed_steps(strategy: Any, steps: int, micro: int) -> dict[str, torch.Tensor]:
    """The same training through the strategy: each rank its share of every batch;
    DeepSpeed accumulates ``micro`` micro-batches (its config) and steps at the end."""
    from interlock.conformance import reference
    from interlock.conformance.checks import full, share

    net = reference.model()
    opt = torch.optim.SGD(net.parameters(), lr=reference.LR, momentum=0.9)
    module, (opt,) = strategy.setup_module_and_optimizers(net, [opt])
    for step in range(steps):
        for m in range(micro):
            x, y = reference.batch(step * micro + m)
            x, y = strategy.batch_to_device((share(x, strategy), share(y, strategy)))
            strategy.backward(torch.nn.functional.mse_loss(module(x).float(), y), module)
            strategy.optimizer_step(opt)  # DeepSpeed steps only at the boundary
    got: dict[str, torch.Tensor] = full(module.state_dict())
    return got


@NEEDS_DEEPSPEED
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["deepspeed_stage_1", "deepspeed_stage_3"])
def test_deepspeed_on_cpu_clips_and_accumulates_through_its_config_like_plain_torch(
        name: str) -> None:
    """DeepSpeed's own accumulation and clipping (config entries, the declared way)
    over 2 gloo ranks equal one plain process; without them nothing is clipped."""
    from harness import close, launch_forked

    for overrides, clip, micro in (({}, None, 1),
                                   ({"gradient_clipping": 0.05}, 0.05, 1),
                                   ({"gradient_accumulation_steps": 2}, None, 2)):
        strategy = interlock.resolve(strategy=name, accelerator="cpu", devices=2)
        assert isinstance(strategy, DeepSpeedStrategy)
        strategy._overrides = overrides
        got = launch_forked(strategy, _deepspeed_steps, 3, micro)
        want = _plain_steps(3, clip=clip, micro=micro)
        for key, value in want.items():
            close(got[key], value, f"{name} {overrides} {key}", rtol=1.3e-6, atol=1e-5)


def _async_io_unavailable() -> str | None:
    if not HAS_DEEPSPEED:
        return "deepspeed is not installed"
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder
    except ImportError as error:
        return f"deepspeed has no async_io op builder: {error}"
    if not AsyncIOBuilder().is_compatible(verbose=False):
        return "DeepSpeed's async_io op cannot build here (it needs libaio: libaio-dev)"
    return None


# the first use JIT-builds DeepSpeed's async_io op (minutes on two cores)
@pytest.mark.timeout(1200)
@pytest.mark.skipif(_async_io_unavailable() is not None,
                    reason=str(_async_io_unavailable()))
def test_deepspeed_nvme_offload_trains_on_cpu_like_plain_torch(tmp_path: Path) -> None:
    """ZeRO-Infinity (stage 3, parameters and optimizer state on NVMe) on the CPU
    accelerator: the one row the suite cannot run, since it needs a directory on a fast
    disk; here a temporary directory stands in for it."""
    from harness import close, launch_forked

    strategy = interlock.resolve(strategy="deepspeed_stage_3_offload_nvme",
                                 accelerator="cpu", devices=1)
    assert isinstance(strategy, DeepSpeedStrategy)
    strategy.zero_options["nvme_path"] = str(tmp_path)
    got = launch_forked(strategy, _deepspeed_steps, 3, 1)
    for key, value in _plain_steps(3).items():
        close(got[key], value, f"nvme offload {key}", rtol=1.3e-6, atol=1e-5)


def _loss_scaled_steps(strategy: Any, steps: int) -> dict[str, Any]:
    """A step with an inf loss, then ``steps`` steps, under a dynamic loss scale handed
    to the engine as 16-mixed's is (16-mixed itself needs CUDA: DeepSpeed's CPU
    accelerator has no float16)."""
    from interlock.conformance import reference
    from interlock.conformance.checks import full, share
    from interlock.strategies.precision.deepspeed import LossScale

    strategy.precision.loss_scale = LossScale()
    net = reference.model()
    opt = torch.optim.SGD(net.parameters(), lr=reference.LR, momentum=0.9)
    module, (opt,) = strategy.setup_module_and_optimizers(net, [opt])
    before = {k: v.clone() for k, v in full(module.state_dict()).items()}
    scales = [strategy.precision.state_dict()["scaler"]["scale"]]
    for step in [-1, *range(steps)]:  # -1: the same batch as 0, with an inf loss
        x, y = reference.batch(max(step, 0))
        x, y = strategy.batch_to_device((share(x, strategy), share(y, strategy)))
        loss = torch.nn.functional.mse_loss(module(x).float(), y)
        strategy.backward(loss * float("inf") if step < 0 else loss, module)
        strategy.optimizer_step(opt)
        scales.append(strategy.precision.state_dict()["scaler"]["scale"])
        if step < 0:
            skipped = all(torch.equal(v, before[k])
                          for k, v in full(module.state_dict()).items())
    return {"params": full(module.state_dict()), "scales": scales, "skipped": skipped}


@NEEDS_DEEPSPEED
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["deepspeed_stage_2", "deepspeed_stage_2_offload",
                                  "deepspeed_stage_3", "deepspeed_stage_3_offload"])
def test_deepspeed_loss_scale_skips_an_overflow_backs_off_and_trains_like_plain_torch(
        name: str) -> None:
    """The engine scales by the strategy's loss scale, unscales exactly (a power of
    two), skips the step whose gradients are not finite, and the scale then halves."""
    from harness import close, launch_forked

    strategy = interlock.resolve(strategy=name, accelerator="cpu", devices=1)
    assert isinstance(strategy, DeepSpeedStrategy)
    got = launch_forked(strategy, _loss_scaled_steps, 3)
    assert got["skipped"], f"{name}: the step with an inf loss changed the parameters"
    assert got["scales"] == [2.0**16, 2.0**15, 2.0**15, 2.0**15, 2.0**15], got["scales"]
    for key, value in _plain_steps(3).items():
        close(got["params"][key], value, f"{name} loss-scaled {key}", rtol=1.3e-6, atol=1e-5)


def _engine_after_an_autocast_engine(strategy: Any) -> dict[str, Any]:
    """Train 3 steps through ``strategy`` after DeepSpeed has been told, process-wide,
    that float16 autocast is on (what any earlier 16-mixed engine in the process
    leaves behind), and report what the new engine's optimizer made of it."""
    import deepspeed.runtime.torch_autocast as autocast_state

    autocast_state.TORCH_AUTOCAST_INITIALIZED = True
    autocast_state.TORCH_AUTOCAST_DTYPE = torch.float16
    got = _deepspeed_steps(strategy, 3, 1)
    scaler = getattr(strategy.engine.optimizer, "torch_autocast_gradscaler", None)
    return {"params": got, "scaler": scaler is not None}


@NEEDS_DEEPSPEED
@pytest.mark.timeout(300)
def test_an_earlier_autocast_engine_does_not_leak_a_loss_scaler_into_the_next() -> None:
    """DeepSpeed never clears its process-wide autocast flag; on CUDA a 16-true engine
    built after a 16-mixed one got a float16 GradScaler and skipped its first step.
    The strategy clears the flag before each engine it builds."""
    from harness import close, launch_forked

    strategy = interlock.resolve(strategy="deepspeed_stage_2", accelerator="cpu", devices=1)
    assert isinstance(strategy, DeepSpeedStrategy)
    result = launch_forked(strategy, _engine_after_an_autocast_engine)
    assert result["scaler"] is False, "the 32-true engine was given autocast's GradScaler"
    for key, value in _plain_steps(3).items():
        close(result["params"][key], value, key, rtol=1.3e-6, atol=1e-5)


def _train_once(strategy: Any) -> dict[str, torch.Tensor]:
    return _deepspeed_steps(strategy, 2, 1)


@NEEDS_DEEPSPEED
@pytest.mark.timeout(300)
def test_two_deepspeed_launches_in_one_process_both_train() -> None:
    """The second launch builds a new process group; DeepSpeed's cached clone of the
    first one (a module global) must not survive teardown, or deepspeed.initialize
    fails with "Group ... is not registered"."""
    from harness import close

    want = _plain_steps(2)
    for attempt in range(2):
        strategy = interlock.resolve(strategy="deepspeed_stage_2", accelerator="cpu",
                                     devices=1)
        got = strategy.launch(_train_once)
        for key, value in want.items():
            close(got[key], value, f"launch {attempt + 1}: {key}", rtol=1.3e-6, atol=1e-5)


def _save_then_load_at(strategy: Any, path: str, load: bool) -> dict[str, Any]:
    """Train two steps and save (``load`` False), or load ``path`` into a fresh model
    and say what the load raised (``load`` True)."""
    from interlock.strategies.io import CheckpointLoadError

    net = reference_model()
    module, (opt,) = strategy.setup_module_and_optimizers(
        net, [torch.optim.Adam(net.parameters(), lr=1e-2)])
    if not load:
        for step in range(2):
            x, y = strategy.batch_to_device(_batch(step))
            strategy.backward(torch.nn.functional.mse_loss(module(x).float(), y), module)
            strategy.optimizer_step(opt)
        torch.manual_seed(77)
        expected = torch.rand(3)
        torch.manual_seed(77)
        strategy.save_checkpoint(path, {"model": module, "step": 2})
        return {"drawn": expected}
    torch.manual_seed(5)  # another stream: the load must bring the saved one back
    try:
        state: dict[str, Any] = {"model": module, "step": 0}
        strategy.load_checkpoint(path, state)
    except CheckpointLoadError as error:
        return {"error": str(error)}
    return {"step": state["step"], "drawn": torch.rand(3)}


def reference_model() -> torch.nn.Module:
    from interlock.conformance import reference

    return reference.model()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    from interlock.conformance import reference

    return reference.batch(step)


@NEEDS_DEEPSPEED
@pytest.mark.timeout(300)
def test_a_deepspeed_checkpoint_restores_the_random_state_and_refuses_another_stage(
        tmp_path: Path) -> None:
    """At the stage that saved it, the load brings back the saved random state (the
    next draws equal what the saving run would have drawn); at another ZeRO stage it is
    refused with both stages named, before DeepSpeed's own assertion."""
    from harness import launch_forked

    def stage(name: str) -> DeepSpeedStrategy:
        built = interlock.resolve(strategy=name, accelerator="cpu", devices=2)
        assert isinstance(built, DeepSpeedStrategy)
        return built

    path = str(tmp_path / "ckpt")
    saved = launch_forked(stage("deepspeed_stage_2"), _save_then_load_at, path, False)
    loaded = launch_forked(stage("deepspeed_stage_2"), _save_then_load_at, path, True)
    assert loaded.get("step") == 2, loaded
    assert torch.equal(loaded["drawn"], saved["drawn"]), (loaded, saved)
    refused = launch_forked(stage("deepspeed_stage_3"), _save_then_load_at, path, True)
    assert "saved at ZeRO stage 2 and this strategy runs stage 3" in refused.get(
        "error", ""), refused


def _schedule_on_the_returned_optimizer(strategy: Any) -> list[str]:
    """Steps with a scheduler over the optimizer DeepSpeed hands back; the warnings
    they gave."""
    import warnings

    net = reference_model()
    module, (opt,) = strategy.setup_module_and_optimizers(
        net, [torch.optim.SGD(net.parameters(), lr=0.1)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for step in range(2):
            x, y = strategy.batch_to_device(_batch(step))
            strategy.backward(torch.nn.functional.mse_loss(module(x).float(), y), module)
            strategy.optimizer_step(opt)
            schedule.step()
    return [str(w.message) for w in caught]


@NEEDS_DEEPSPEED
@pytest.mark.timeout(300)
def test_a_scheduler_on_deepspeeds_optimizer_steps_without_torchs_order_warning() -> None:
    from harness import launch_forked

    strategy = interlock.resolve(strategy="deepspeed_stage_1", accelerator="cpu", devices=2)
    assert isinstance(strategy, DeepSpeedStrategy)
    said = launch_forked(strategy, _schedule_on_the_returned_optimizer)
    assert not [m for m in said if "lr_scheduler.step()" in m], said
