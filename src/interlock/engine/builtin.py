"""The built-in strategy rows."""

from __future__ import annotations

from functools import partial

from interlock.engine.memory import REPLICATED, MemoryTraits
from interlock.engine.parallelism import DIMS
from interlock.engine.specs import StrategyPreset, StrategySpec, expand_preset
from interlock.engine.tables import (
    PRECISION_NAMES,
    SHARDED_PRECISIONS,
    TENSOR_PARALLEL_PRECISIONS,
    XLA_PRECISIONS,
)

_ALL = frozenset(PRECISION_NAMES)
_SHARDED = frozenset(SHARDED_PRECISIONS)
_TENSOR_PARALLEL = frozenset(TENSOR_PARALLEL_PRECISIONS)
_XLA = frozenset(XLA_PRECISIONS)

_DDP = "interlock.strategies.ddp:DDPStrategy"
#: what the conformance suite checks beyond the basics (see specs.CAPABILITIES)
#: ("elastic": their launchers restart every rank, see LauncherRow.restarts)
_PARALLEL = frozenset(("accumulation", "clipping", "resharding", "timeout", "elastic"))

#: which dimensions of parallelism (`interlock.Parallelism`) a row lets users set, and
#: the degrees it runs with by default (docs/parallelism.md gives the reasons)
_REPLICATE = frozenset(("dp_replicate",))
_FSDP_DIMS = frozenset(("dp_replicate", "dp_shard"))
_MODEL_PARALLEL_DIMS = frozenset(DIMS)  # every dimension: the parallelize_fn applies them
_SHARD_ALL = {"dp_shard": "auto"}

#: how each row holds a model (`MemoryTraits`, read by the memory estimate)
_WHOLE = MemoryTraits(sharded=frozenset(), buffers="none")
#: every state sharded by rows; units gathered (FSDPStrategy even on one rank)
_FSDP_MEMORY = MemoryTraits(gathers_alone=True)
#: a parallelize_fn applies FSDP only where there is data parallelism
_MODEL_PARALLEL_MEMORY = MemoryTraits()
_ALL_STATES = frozenset(("parameters", "gradients", "optimizer"))
#: the elements of each of DeepSpeed's reduce and all-gather buckets, as the strategy
#: configures them (`interlock.strategies.deepspeed_config`)
ZERO_BUCKET_ELEMENTS = 200_000_000
#: what each ZeRO stage shards over the ranks
_ZERO_SHARDS: dict[int, frozenset[str]] = {
    1: frozenset(("optimizer",)),
    2: frozenset(("optimizer", "gradients")),
    3: _ALL_STATES,
}


def _zero_memory(options: dict[str, object]) -> MemoryTraits:
    """A DeepSpeed row's memory traits from its options."""
    stage = int(options.get("stage", 2))  # type: ignore[call-overload]
    offloaded = ({"optimizer"} if options.get("offload_optimizer") else set()) | (
        {"parameters"} if options.get("offload_parameters") else set())
    return MemoryTraits(sharded=_ZERO_SHARDS[stage], split="flat",
                        offloaded=frozenset(offloaded),
                        offload_to="nvme" if options.get("remote_device") == "nvme"
                        else "host",
                        master_weights=True, buffers="zero_buckets",
                        bucket_elements=ZERO_BUCKET_ELEMENTS)


#: DDP's launch styles: (name, launcher, what it is). ``ddp`` takes every launcher
#: (``launcher=``); the others are presets that pin one.
_DDP_STYLES = (
    ("ddp", "subprocess", "re-runs the script once per extra rank"),
    ("ddp_spawn", "spawn", "spawns processes (functions must be picklable)"),
    ("ddp_fork", "fork", "forks processes; works in notebooks"),
    ("ddp_notebook", "fork", "forks processes; meant for notebooks"),
    ("ddp_forkserver", "forkserver", "starts processes via a fork server"),
)


def _ddp_rows() -> tuple[StrategySpec, ...]:
    """``ddp`` and its presets: a launch style, and the find_unused_parameters
    variants of each (listed in the docs, left out of the alternatives refusals
    list)."""
    ddp = StrategySpec(
        name="ddp",
        factory=_DDP,
        description=f"DistributedDataParallel; {_DDP_STYLES[0][2]}",
        family="ddp",
        accelerators=frozenset(("cpu", "cuda")),
        precisions=_ALL,
        launcher="subprocess",
        launchers=frozenset(launcher for _, launcher, _ in _DDP_STYLES[1:]),
        substitutes={"xla": "xla"},
        capabilities=_PARALLEL,
        parallel_dims=_REPLICATE,
        memory=REPLICATED,
    )
    rows: list[StrategySpec] = []
    for name, launcher, what in _DDP_STYLES:
        presets = [] if name == "ddp" else [StrategyPreset(
            name=name, strategy="ddp", launcher=launcher,
            description=f"DistributedDataParallel; {what}")]
        if name != "ddp_forkserver":
            presets.extend(
                StrategyPreset(
                    name=f"{name}_find_unused_parameters_{str(flag).lower()}",
                    strategy="ddp", launcher=None if name == "ddp" else launcher,
                    options={"find_unused_parameters": flag}, variant_of=name,
                    description=f"DistributedDataParallel; {what}, "
                    f"find_unused_parameters={flag}",
                )
                for flag in (True, False)
            )
        rows.extend((ddp,) if name == "ddp" else ())
        rows.extend(expand_preset(preset, ddp) for preset in presets)
    return tuple(rows)


#: measured with deepspeed 0.19.8 on its CPU accelerator (gloo): float16 is refused by
#: DeepSpeed itself ("Type fp16 is not supported on your device")
_NO_FP16_ON_CPU = ("DeepSpeed's CPU accelerator does not support float16 (it refuses "
                   "fp16 with 'Type fp16 is not supported on your device'); use "
                   "bf16-mixed, bf16-true or 32-true")
_DEEPSPEED_CPU_REFUSALS = {"16-true": _NO_FP16_ON_CPU, "16-mixed": _NO_FP16_ON_CPU}


def _deepspeed_rows() -> tuple[StrategySpec, ...]:
    variants: tuple[tuple[str, dict[str, object], str], ...] = (
        ("deepspeed", {}, "ZeRO stage 2 (the default)"),
        ("deepspeed_stage_1", {"stage": 1}, "ZeRO stage 1: optimizer state sharded"),
        (
            "deepspeed_stage_1_offload",
            {"stage": 1, "offload_optimizer": True},
            "ZeRO stage 1 with optimizer state offloaded to CPU",
        ),
        ("deepspeed_stage_2", {"stage": 2}, "ZeRO stage 2: optimizer state and gradients sharded"),
        (
            "deepspeed_stage_2_offload",
            {"stage": 2, "offload_optimizer": True},
            "ZeRO stage 2 with optimizer state offloaded to CPU",
        ),
        ("deepspeed_stage_3", {"stage": 3}, "ZeRO stage 3: parameters sharded too"),
        (
            "deepspeed_stage_3_offload",
            {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
            "ZeRO stage 3 with parameters and optimizer state offloaded to CPU",
        ),
        (
            "deepspeed_stage_3_offload_nvme",
            {
                "stage": 3,
                "offload_optimizer": True,
                "offload_parameters": True,
                "remote_device": "nvme",
            },
            "ZeRO-Infinity: stage 3 offloaded to NVMe",
        ),
    )
    return tuple(
        StrategySpec(
            name=name,
            factory="interlock.strategies.deepspeed:DeepSpeedStrategy",
            description=f"DeepSpeed {what}",
            family="deepspeed",
            accelerators=frozenset(("cpu", "cuda")),
            precisions=_SHARDED,
            launcher="subprocess",
            requires=("deepspeed",),
            options=options,
            precision_plugin="deepspeed",
            precision_refusals={"cpu": _DEEPSPEED_CPU_REFUSALS},
            # accumulation and clipping are DeepSpeed config entries
            # (gradient_accumulation_steps, gradient_clipping), not the strategy calls
            capabilities=frozenset(("timeout", "engine_gradients")),
            # ZeRO shards over every rank: its one layout, which users cannot change
            default_parallelism=_SHARD_ALL,
            memory=_zero_memory(options),
        )
        for name, options, what in variants
    )


#: torch_xla's FSDP raises TypeError("only fp32 parameters are supported") for any other
#: parameter dtype, whatever its options (measured with torch_xla 2.9, CPU PJRT device)
_FP32_SHARDS_ONLY = ("torch_xla's FSDP shards float32 parameters only (it raises 'only fp32 "
                     "parameters are supported' for 16-bit ones); use 32-true, and for "
                     "16-bit compute over float32 shards, "
                     "XLAFSDPStrategy(compute_dtype=torch.bfloat16)")
_XLA_FSDP_REFUSALS = {"16-true": _FP32_SHARDS_ONLY, "bf16-true": _FP32_SHARDS_ONLY}


#: what the rows of one family share
_fsdp = partial(StrategySpec, factory="interlock.strategies.fsdp:FSDPStrategy",
                family="fsdp", precisions=_SHARDED, launcher="subprocess",
                precision_plugin="fsdp", parallel_dims=_FSDP_DIMS,
                default_parallelism=_SHARD_ALL)
_xla = partial(StrategySpec, family="xla", accelerators=frozenset(("xla",)),
               precisions=_XLA, launcher="xla", requires=("torch_xla",),
               precision_plugin="xla", memory=_WHOLE)


BUILTIN_STRATEGIES: tuple[StrategySpec, ...] = (
    StrategySpec(
        name="single_device",
        factory="interlock.strategies.single_device:SingleDeviceStrategy",
        description="one process on one device",
        family="single_device",
        accelerators=frozenset(("cpu", "cuda", "mps")),
        precisions=_ALL,
        launcher=None,
        multi_node=False,
        max_devices=1,
        substitutes={"xla": "single_xla"},
        capabilities=frozenset(("accumulation", "clipping")),
        memory=_WHOLE,
    ),
    *_ddp_rows(),
    _fsdp(
        name="fsdp",
        description="FSDP2 (fully_shard) over a device mesh",
        accelerators=frozenset(("cpu", "cuda")),
        substitutes={"xla": "xla_fsdp"},
        capabilities=_PARALLEL,
        memory=_FSDP_MEMORY,
    ),
    _fsdp(
        name="fsdp_cpu_offload",
        description="FSDP2 with parameters offloaded to CPU (needs an accelerator to "
        "offload from)",
        accelerators=frozenset(("cuda",)),
        options={"cpu_offload": True},
        substitutes={"cpu": "fsdp", "xla": "xla_fsdp"},
        capabilities=_PARALLEL | {"parameter_offload"},
        # CPUOffloadPolicy: shards, their gradients and the optimizer step live on the host
        memory=MemoryTraits(offloaded=_ALL_STATES, gathers_alone=True),
    ),
    StrategySpec(
        name="model_parallel",
        factory="interlock.strategies.model_parallel:ModelParallelStrategy",
        description="an N-D device mesh (pipeline, data, context and tensor parallel) "
        "that a user function parallelises the model over",
        family="model_parallel",
        accelerators=frozenset(("cpu", "cuda")),
        precisions=_TENSOR_PARALLEL,
        launcher="subprocess",
        capabilities=_PARALLEL,
        parallel_dims=_MODEL_PARALLEL_DIMS,
        # tensor parallel within a node, sharded data parallel across nodes
        default_parallelism={"tp": "node", "dp_shard": "auto"},
        # as its parallelize_fn contract says: FSDP2 over the sharding group
        memory=_MODEL_PARALLEL_MEMORY,
    ),
    *_deepspeed_rows(),
    _xla(
        name="xla",
        factory="interlock.strategies.xla:XLAStrategy",
        description="data parallel over XLA devices",
        substitutes={"cpu": "ddp", "cuda": "ddp"},
    ),
    _xla(
        name="xla_debug",
        factory="interlock.strategies.xla:XLAStrategy",
        description="data parallel over XLA devices with torch_xla's debug checks",
        options={"debug": True},
    ),
    _xla(
        name="xla_fsdp",
        factory="interlock.strategies.xla:XLAFSDPStrategy",
        description="torch_xla's fully sharded data parallel",
        default_parallelism=_SHARD_ALL,
        substitutes={"cpu": "fsdp", "cuda": "fsdp"},
        precision_refusals={"xla": _XLA_FSDP_REFUSALS},
        # torch_xla's FSDP flattens each unit's parameters before sharding them
        memory=MemoryTraits(split="flat", gathers_alone=True),
    ),
    _xla(
        name="single_xla",
        factory="interlock.strategies.xla:SingleDeviceXLAStrategy",
        description="one process on one XLA device",
        launcher=None,
        multi_node=False,
        max_devices=1,
        substitutes={"cpu": "single_device", "cuda": "single_device", "mps": "single_device"},
    ),
)
