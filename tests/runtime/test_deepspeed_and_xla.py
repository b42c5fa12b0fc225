"""DeepSpeed and XLA strategies: configuration, resolution and wiring everywhere; real
training where deepspeed with CUDA, or torch_xla, is installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import interlock
from interlock.connector.builtin import BUILTIN_STRATEGIES
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
    assert config["bf16"] == {"enabled": True} and "fp16" not in config


def test_precision_sections_and_overrides_merge_key_by_key(tmp_path: Path) -> None:
    fp16 = deepspeed_config(precision="16-mixed")
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0, "dynamic scaling"
    assert "fp16" not in deepspeed_config() and "bf16" not in deepspeed_config()
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


def test_the_engine_refuses_deepspeed_off_cuda_and_without_the_package() -> None:
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(strategy="deepspeed", accelerator="cpu", devices=2, machine=GPUS)
    assert info.value.code == "unsupported-accelerator"
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
assert set(torch.load(PATH, weights_only=True)) == {"model", "optimizer"}
print("xla ok", strategy.root_device)
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAS_TORCH_XLA, reason="torch_xla is not installed (nox -s xla runs "
                    "this on its CPU PJRT device)")
def test_single_xla_trains_with_parity_on_a_real_xla_device(tmp_path: Path) -> None:
    script = XLA_SCRIPT.replace("PATH", repr(str(tmp_path / "xla.pt")))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=280, env={**__import__("os").environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "xla ok" in done.stdout


@pytest.mark.timeout(300)
@pytest.mark.skipif(not (HAS_DEEPSPEED and torch.cuda.is_available()),
                    reason="needs deepspeed and CUDA devices")
def test_deepspeed_stage_2_trains_on_cuda(tmp_path: Path) -> None:
    import workloads

    strategy = interlock.resolve(strategy="deepspeed_stage_2", devices=1,
                                 precision="bf16-mixed")
    assert isinstance(strategy, DeepSpeedStrategy)
    result = strategy.launch(_deepspeed_train, str(tmp_path / "ds"))
    assert result["loss_went_down"], result
    assert (tmp_path / "ds").is_dir()
    del workloads


def _deepspeed_train(strategy: Any, path: str) -> dict[str, Any]:
    import workloads

    net, (opt,) = strategy.setup_module_and_optimizers(
        workloads.model(), [torch.optim.Adam(workloads.model().parameters(), lr=1e-2)]
    )
    losses = []
    for step in range(5):
        x, y = strategy.batch_to_device(workloads.batch(step))
        loss = torch.nn.functional.mse_loss(net(x).float(), y)
        strategy.backward(loss, net)
        strategy.optimizer_step(opt)
        losses.append(float(loss))
    strategy.save_checkpoint(path, {"model": net, "step": 5})
    return {"loss_went_down": losses[-1] < losses[0], "losses": losses}
