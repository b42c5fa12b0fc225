"""The DeepSpeed configuration a strategy row's options and a precision stand for.

Pure data: nothing here imports deepspeed, so configurations are built and checked
on any machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interlock.engine.builtin import ZERO_BUCKET_ELEMENTS

#: ZeRO stages DeepSpeed offers: 0 (plain data parallel), 1 (optimizer state
#: sharded), 2 (+ gradients), 3 (+ parameters)
ZERO_STAGES = (0, 1, 2, 3)
#: where offloaded state can live
OFFLOAD_DEVICES = ("cpu", "nvme")


def deepspeed_config(
    *,
    stage: int = 2,
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    remote_device: str = "cpu",
    nvme_path: str | None = None,
    precision: str = "32-true",
    overrides: Mapping[str, Any] | str | Path | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config dict for a ZeRO stage, offloading and precision.

    Args:
        stage: ZeRO stage (``ZERO_STAGES``).
        offload_optimizer: keep optimizer state (and its step) on ``remote_device``.
        offload_parameters: keep parameters on ``remote_device`` (stage 3 only).
        remote_device: ``"cpu"``, or ``"nvme"`` (ZeRO-Infinity; needs ``nvme_path``).
        nvme_path: a directory on a fast local disk, for ``remote_device="nvme"``.
        precision: the canonical precision: ``16-true`` enables DeepSpeed's fp16 with
            a static loss scale of 1 (the precision table's ``16-true`` has no scaler:
            dynamic scaling would skip steps plain float16 training takes; ask for it
            with ``overrides={"fp16": {"loss_scale": 0}}``), ``bf16-true`` its bf16
            (half-precision parameters, float32 master weights in the optimizer);
            ``16-mixed`` and ``bf16-mixed`` keep float32 parameters and run the forward
            pass under torch's autocast (``torch_autocast``). ``16-mixed``'s loss scale
            is the strategy's (:class:`~interlock.strategies.precision.deepspeed.\
LossScale`), not the GradScaler DeepSpeed would make for it.
        overrides: a dict (or a JSON file) merged over the result, key by key at
            every level, for anything else DeepSpeed accepts.

    Raises:
        ValueError: for an unknown stage or device, offloading parameters below stage
            3, nvme without a path, or an overrides file that is not a JSON object.
    """
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage={stage!r}: DeepSpeed's ZeRO stages are {ZERO_STAGES}")
    if remote_device not in OFFLOAD_DEVICES:
        raise ValueError(f"remote_device={remote_device!r}: expected one of {OFFLOAD_DEVICES}")
    if offload_parameters and stage != 3:
        raise ValueError(
            f"offload_parameters=True needs ZeRO stage 3 (parameters are partitioned only "
            f"there); stage is {stage}"
        )
    if remote_device == "nvme" and not nvme_path:
        raise ValueError("remote_device='nvme' needs nvme_path: a directory on a local NVMe disk")
    if remote_device == "nvme" and not (offload_optimizer or offload_parameters):
        raise ValueError("remote_device='nvme' without offload_optimizer or "
                         "offload_parameters offloads nothing")

    zero: dict[str, Any] = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
        # the memory estimate reads the same size (ZERO_BUCKET_ELEMENTS)
        "allgather_bucket_size": ZERO_BUCKET_ELEMENTS,
        "reduce_bucket_size": ZERO_BUCKET_ELEMENTS,
    }
    if stage == 3:
        zero["sub_group_size"] = 1_000_000_000
        # ZeRO-3's default swaps torch.nn.functional.linear for its own, process-wide and
        # for good; that one's backward re-enters autocast for DeepSpeed's accelerator
        # only, so a module trained under CPU autocast in the same CUDA process (plain
        # torch, another strategy) breaks ("expected m1 and m2 to have the same dtype")
        zero["memory_efficient_linear"] = False
    if offload_optimizer:
        zero["offload_optimizer"] = _offload(remote_device, nvme_path)
    if offload_parameters:
        zero["offload_param"] = _offload(remote_device, nvme_path)
    config: dict[str, Any] = {
        "zero_optimization": zero,
        # interlock's loop steps once per call: accumulation is the caller's business
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,
        # DeepSpeed clips at norm 1.0 unless told otherwise; plain PyTorch does not
        # clip, and neither does any other strategy unless asked
        "gradient_clipping": 0.0,
    }
    if offload_optimizer:
        # the strategy steps the caller's torch optimizer; DeepSpeed would otherwise
        # insist on its own CPU Adam (faster: pass it, or an optimizer section, yourself)
        config["zero_force_ds_cpu_optimizer"] = False
    if precision == "16-true":
        # 16-true is float16 parameters and compute with no loss scaler (the precision
        # table): a static scale of 1, so DeepSpeed never skips a step plain float16
        # training takes (its float32 master weights only round less)
        config["fp16"] = {"enabled": True, "loss_scale": 1.0}
    elif precision == "bf16-true":
        config["bf16"] = {"enabled": True}
    elif precision in ("16-mixed", "bf16-mixed"):
        dtype = "float16" if precision == "16-mixed" else "bfloat16"
        config["torch_autocast"] = {"enabled": True, "dtype": dtype}
    return merge(config, _read_overrides(overrides))


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    offload: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        offload["nvme_path"] = nvme_path
    return offload


def _read_overrides(overrides: Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    path = Path(overrides)
    try:
        loaded = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"DeepSpeed config {str(path)!r} could not be read: {error}") from error
    if not isinstance(loaded, dict):
        raise ValueError(f"DeepSpeed config {str(path)!r} holds {type(loaded).__name__}, "
                         "not a JSON object")
    return loaded


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied: nested dicts merge, anything else replaces."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged
