"""One worked example per rule: every rule fires (or refuses) where it should.

A meta-test checks that every rule id of every stage has an example here, so a new
rule cannot land untested.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from interlock import Machine, ModelShape, ResolutionError, plan, register, unregister
from interlock.engine.planner import STAGES, clear_cache
from interlock.engine.rules import audited
from machines import (
    CPU,
    EIGHT_GPUS,
    EIGHT_GPUS_NOTEBOOK,
    FULL,
    MPS,
    NO_FORK,
    NOTEBOOK,
    ONE_GPU,
    TPU,
    TPU_NO_PACKAGE,
    slurm,
    torchelastic,
)
from plugins import (
    BF16Plugin,
    GridCluster,
    LocalCluster,
    MyCheckpointIO,
    NotAPlugin,
    StandInAccelerator,
    StandInModelParallel,
    StandInStrategy,
)

Flags = dict[str, Any]

#: a 7B model, and machines whose memory is known
SEVEN_B = ModelShape(parameters=7 * 10**9)
H100S = Machine(cuda_devices=8, device_memory=80 << 30, host_memory=2 << 40)
SMALL_HOST = Machine(cuda_devices=8, device_memory=80 << 30, host_memory=64 << 30)

KUBEFLOW = Machine(
    cuda_devices=1,
    environ={"KUBERNETES_PORT": "tcp://10.0.0.1:443", "MASTER_ADDR": "m", "MASTER_PORT": "1234",
             "WORLD_SIZE": "4", "RANK": "0"},
)
LSF = Machine(
    cuda_devices=4,
    environ={"LSB_JOBID": "7", "LSB_DJOB_RANKFILE": "/tmp/rankfile",
             "JSM_NAMESPACE_LOCAL_RANK": "0", "JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_RANK": "0"},
)
MPI = Machine(environ={"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
                       "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
#: what the deepspeed launcher (and many in-house ones) export to rank 0 of 2
EXTERNAL_LAUNCHER = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}

#: rule id -> (flags, machine, refusal code or None)
EXAMPLES: dict[str, tuple[Flags, Machine, str | None]] = {
    "flags/accelerator-instance": ({"accelerator": StandInAccelerator("cpu")}, CPU, None),
    "flags/strategy-instance": ({"strategy": StandInStrategy("ddp"), "devices": 2}, CPU, None),
    "flags/strategy-instance-unregistered": ({"strategy": StandInStrategy("nope")}, CPU,
                                             "unknown-strategy"),
    "flags/strategy-instance-conflict": (
        {"strategy": StandInStrategy("ddp", precision=BF16Plugin()), "precision": "16-mixed"},
        CPU, "conflicting-flags"),
    "flags/strategy-instance-device-type": (
        {"strategy": StandInStrategy("ddp", devices=("cpu", "cpu")), "accelerator": "cuda"},
        ONE_GPU, "conflicting-flags"),
    "flags/adopt-instance-parts": (
        {"strategy": StandInStrategy("ddp", devices=("cpu", "cpu"))}, CPU, None),
    "flags/no-instance": ({}, CPU, None),
    "flags/accelerator-name": ({"accelerator": "CPU"}, CPU, None),
    "flags/accelerator-alias": ({"accelerator": "tpu"}, TPU, None),
    "flags/accelerator-broken-entry-point": ({"accelerator": "ilk_broken_npu"}, CPU,
                                             "broken-entry-point"),
    "flags/accelerator-unknown": ({"accelerator": "cdua"}, CPU, "unknown-accelerator"),
    "flags/devices-auto": ({"devices": "AUTO"}, CPU, None),
    "flags/devices-all": ({"devices": "-1"}, EIGHT_GPUS, None),
    "flags/devices-count": ({"devices": "2"}, EIGHT_GPUS, None),
    "flags/devices-ids": ({"devices": "1,"}, EIGHT_GPUS, None),
    "flags/devices-invalid": ({"devices": 0}, CPU, "invalid-devices"),
    "flags/devices-beyond-limit": ({"devices": 10**100}, CPU, "invalid-devices"),
    "flags/strategy-auto": ({"strategy": "Auto"}, CPU, None),
    "flags/strategy-name": ({"strategy": "DDP", "devices": 2}, CPU, None),
    "flags/strategy-withdrawn": ({"strategy": "dp"}, EIGHT_GPUS, "unknown-strategy"),
    "flags/strategy-broken-entry-point": ({"strategy": "ilk_broken_example"}, CPU,
                                          "broken-entry-point"),
    "flags/strategy-unknown": ({"strategy": "ddp_spwan"}, CPU, "unknown-strategy"),
    "flags/precision-name": ({"precision": "BF16-Mixed"}, CPU, None),
    "flags/precision-legacy": ({"precision": 16}, CPU, None),
    "flags/precision-broken-entry-point": ({"precision": "ilk-broken-fp4"}, CPU,
                                           "broken-entry-point"),
    "flags/precision-unknown": ({"precision": "fp16"}, CPU, "unknown-precision"),
    "flags/num-nodes-int": ({"num_nodes": 2}, CPU, None),
    "flags/num-nodes-invalid": ({"num_nodes": 0}, CPU, "invalid-num-nodes"),
    "flags/num-nodes-beyond-limit": ({"num_nodes": 2**62}, CPU, "invalid-num-nodes"),
    "flags/plugins-sorted": ({"plugins": [MyCheckpointIO()]}, CPU, None),
    "flags/plugins-invalid": ({"plugins": [NotAPlugin()]}, CPU, "invalid-plugin"),
    "flags/precision-and-plugin": (
        {"plugins": BF16Plugin(), "precision": "16-mixed"}, CPU, "conflicting-flags"),
    "flags/no-conflict": ({}, CPU, None),
    "accelerator/explicit-missing-package": ({"accelerator": "xla"}, TPU_NO_PACKAGE,
                                             "missing-package"),
    "accelerator/explicit-unavailable": ({"accelerator": "cuda"}, CPU, "accelerator-unavailable"),
    "accelerator/explicit": ({"accelerator": "cuda"}, ONE_GPU, None),
    "accelerator/auto-xla": ({}, TPU, None),
    "accelerator/auto-mps": ({}, MPS, None),
    "accelerator/auto-cuda": ({}, ONE_GPU, None),
    "accelerator/auto-cpu": ({}, TPU_NO_PACKAGE, None),
    "accelerator/gpu-mps": ({"accelerator": "gpu"}, MPS, None),
    "accelerator/gpu-cuda": ({"accelerator": "gpu"}, ONE_GPU, None),
    "accelerator/none-available": ({"accelerator": "gpu"}, CPU, "accelerator-unavailable"),
    "devices/cpu-processes": ({"devices": 3}, CPU, None),
    "devices/cpu-refused": ({"devices": -1, "accelerator": "cpu"}, CPU, "invalid-devices"),
    "devices/cuda-auto-interactive": ({}, EIGHT_GPUS_NOTEBOOK, None),
    "devices/cuda-unavailable": ({"devices": [0, 8]}, EIGHT_GPUS, "devices-unavailable"),
    "devices/cuda-all": ({}, EIGHT_GPUS, None),
    "devices/cuda-count": ({"devices": 4}, EIGHT_GPUS, None),
    "devices/cuda-ids": ({"devices": [2, 5]}, EIGHT_GPUS, None),
    "devices/mps-one": ({"devices": -1}, MPS, None),
    "devices/mps-unavailable": ({"devices": 2}, MPS, "devices-unavailable"),
    "devices/xla-one": ({"devices": 1}, TPU, None),
    "devices/xla-all": ({"devices": 8}, TPU, None),
    "devices/xla-index": ({"devices": [3]}, TPU, None),
    "devices/xla-unavailable": ({"devices": 16}, TPU, "devices-unavailable"),
    "devices/xla-refused": ({"devices": 4}, TPU, "invalid-devices"),
    "devices/per-node-beyond-limit": (
        {"strategy": StandInStrategy("ddp", devices=("cpu",) * 5000)}, CPU, "invalid-devices"),
    "devices/world-size-beyond-limit": ({"devices": 4096, "num_nodes": 4096}, CPU,
                                        "invalid-num-nodes"),
    "devices/within-limits": ({}, CPU, None),
    "cluster/plugin": ({"plugins": LocalCluster()}, CPU, None),
    "cluster/xla": ({}, TPU, None),
    "cluster/torchelastic": ({"devices": 8, "num_nodes": 2}, torchelastic(16, 8, 2), None),
    "cluster/detection-invalid": ({}, Machine(environ={"INTERLOCK_CLUSTER_DETECTION": "of"}),
                                  "invalid-environment"),
    "cluster/detection-off": ({"devices": 2}, Machine(environ={
        "INTERLOCK_CLUSTER_DETECTION": "off", **EXTERNAL_LAUNCHER}), None),
    "cluster/torchelastic-in-slurm": ({"devices": 8, "num_nodes": 2}, Machine(
        cuda_devices=8, environ={**slurm(2, "1", 2).environ, **torchelastic(16, 8, 2).environ}),
        None),
    "cluster/external-in-slurm": ({"devices": 2}, Machine(environ={
        **slurm(1, "1", 1).environ, **EXTERNAL_LAUNCHER}), None),
    "cluster/external": ({"devices": 2}, Machine(environ=EXTERNAL_LAUNCHER), None),
    "cluster/slurm-interactive": ({"devices": 2},
                                  slurm(1, "1", 1, job_name="bash", step=False), None),
    "cluster/slurm-without-step": ({"devices": 4}, slurm(4, "4", 1, step=False), None),
    "cluster/slurm-without-step-multinode": ({"devices": 4, "num_nodes": 2},
                                             slurm(8, "4", 2, step=False), "cluster-mismatch"),
    "cluster/slurm-single-task": ({"devices": 2}, slurm(1, "1", 1), None),
    "cluster/slurm": ({"devices": 4, "num_nodes": 2}, slurm(8, "4", 2), None),
    "cluster/kubeflow": ({"devices": 1, "num_nodes": 4}, KUBEFLOW, None),
    "cluster/lsf": ({"devices": 4, "num_nodes": 2}, LSF, None),
    "cluster/mpi": ({"devices": 2}, MPI, None),
    "cluster/local": ({}, CPU, None),
    "cluster/unreadable-variable": ({"devices": 2}, slurm(3, "2,1", 2), "invalid-environment"),
    "cluster/auto-devices-follow-cluster": ({"num_nodes": 2}, torchelastic(4, 2, 2), None),
    "cluster/processes-per-node-mismatch": ({"devices": 4, "num_nodes": 2},
                                            torchelastic(4, 2, 2), "cluster-mismatch"),
    "cluster/nodes-mismatch": ({"devices": 4, "num_nodes": 1}, slurm(8, "4", 2),
                               "cluster-mismatch"),
    "cluster/world-size-mismatch": ({"devices": 4, "num_nodes": 1}, LSF, "cluster-mismatch"),
    "cluster/local-rank-out-of-range": (
        {"devices": 1, "num_nodes": 2},
        Machine(environ={**EXTERNAL_LAUNCHER, "LOCAL_RANK": "1", "RANK": "1"}),
        "cluster-mismatch"),
    "cluster/consistent": ({}, CPU, None),
    "cluster/devices-as-placed": ({}, CPU, None),
    "strategy/explicit": ({"strategy": "single_device"}, CPU, None),
    "strategy/auto-xla": ({}, TPU, None),
    "strategy/auto-single-xla": ({"devices": 1}, TPU, None),
    "strategy/auto-multi-node": ({"num_nodes": 2}, CPU, None),
    "strategy/auto-single-device": ({}, CPU, None),
    "strategy/auto-notebook": ({"devices": 2}, NOTEBOOK, None),
    "strategy/auto-ddp": ({"devices": 2}, CPU, None),
    "strategy/auto-devices-capped": ({"strategy": "single_device"}, EIGHT_GPUS, None),
    "strategy/devices-as-placed": ({}, CPU, None),
    "strategy/unsupported-accelerator": ({"strategy": "fsdp_cpu_offload",
                                          "accelerator": "cpu"}, CPU,
                                         "unsupported-accelerator"),
    "strategy/missing-package": ({"strategy": "deepspeed"}, ONE_GPU, "missing-package"),
    "strategy/too-many-devices": ({"strategy": "single_device", "devices": 2}, CPU,
                                  "invalid-devices"),
    "strategy/unsupported-multi-node": ({"strategy": "single_device", "num_nodes": 2}, CPU,
                                        "unsupported-multi-node"),
    "strategy/supported": ({}, CPU, None),
    "launcher-flag/auto": ({"devices": 2}, CPU, None),
    "launcher-flag/unknown": ({"devices": 2, "launcher": "sapwn"}, CPU, "unknown-launcher"),
    "launcher-flag/unsupported": ({"strategy": "ddp_spawn", "devices": 2, "launcher": "fork"},
                                  CPU, "unsupported-launcher"),
    "launcher-flag/take": ({"strategy": "ddp", "devices": 2, "launcher": "fork"}, CPU, None),
    "launcher/none": ({}, CPU, None),
    "launcher/external": ({"devices": 2}, MPI, None),
    "launcher/interactive-incompatible": ({"strategy": "ddp", "devices": 2}, NOTEBOOK,
                                          "interactive-incompatible"),
    "launcher/start-method-unavailable": ({"strategy": "ddp_fork", "devices": 2}, NO_FORK,
                                          "start-method-unavailable"),
    "launcher/own": ({"devices": 2}, CPU, None),
    "launcher/own-environment": ({"strategy": "ilk_grid_ddp", "devices": 2}, CPU, None),
    "launcher/foreign-environment": (
        {"strategy": "ddp_fork", "devices": 2, "plugins": [GridCluster()]}, CPU,
        "conflicting-flags"),
    "launcher/environment-conflict": (
        {"strategy": "ilk_grid_ddp", "devices": 2, "plugins": [LocalCluster()]}, CPU,
        "conflicting-flags"),
    "precision/plugin": ({"plugins": [BF16Plugin()]}, CPU, None),
    "precision/flag": ({}, CPU, None),
    "precision/unsupported-by-strategy": ({"strategy": "fsdp", "precision": "64-true"}, CPU,
                                          "unsupported-precision"),
    "precision/refused-by-strategy-on-accelerator": (
        {"strategy": "deepspeed", "precision": "16-mixed"},
        Machine(packages=frozenset({"deepspeed"})), "unsupported-precision"),
    "precision/unsupported-by-accelerator": ({"precision": "64-true"}, MPS,
                                             "unsupported-precision"),
    "precision/missing-package": ({"precision": "transformer-engine"}, ONE_GPU,
                                  "missing-package"),
    "precision/supported": ({}, CPU, None),
    "parallelism/conflict": (
        {"strategy": StandInModelParallel(data_parallel_size=2, tensor_parallel_size=2),
         "devices": 4, "parallelism": {"tp": 4, "dp_shard": 1}}, CPU, "conflicting-flags"),
    "parallelism/flag-unreadable": ({"strategy": "fsdp", "devices": 2,
                                     "parallelism": {"tpp": 2}}, CPU, "invalid-parallelism"),
    "parallelism/flag": ({"strategy": "fsdp", "devices": 4,
                          "parallelism": {"dp_replicate": 2}}, CPU, None),
    "parallelism/legacy-options-unreadable": (
        {"strategy": StandInModelParallel(data_parallel_size=0), "devices": 2}, CPU,
        "invalid-parallelism"),
    "parallelism/legacy-options": (
        {"strategy": StandInModelParallel(data_parallel_size=1, tensor_parallel_size=2),
         "devices": 2}, CPU, None),
    "parallelism/row-default": ({}, CPU, None),
    "parallelism/unsupported-dimension": ({"strategy": "ddp", "devices": 2,
                                           "parallelism": {"tp": 2}}, CPU,
                                          "unsupported-parallelism"),
    "parallelism/dimensions-accepted": ({}, CPU, None),
    "parallelism/does-not-fit": ({"strategy": "fsdp", "devices": 4,
                                  "parallelism": {"dp_replicate": 3}}, CPU,
                                 "invalid-parallelism"),
    "parallelism/fits": ({}, CPU, None),
    "parallelism/auto-unsupported-dimension": ({"strategy": "ddp", "devices": 2,
                                                "parallelism": {}}, CPU,
                                               "unsupported-parallelism"),
    "parallelism/tp-split-across-nodes": (
        {"strategy": "model_parallel", "devices": 6, "num_nodes": 2,
         "parallelism": {"tp": 4}}, CPU, "invalid-parallelism"),
    "parallelism/cp-accelerator": ({"strategy": "model_parallel", "devices": 2,
                                    "parallelism": {"cp": 2}}, CPU,
                                   "unsupported-parallelism"),
    "parallelism/pp-precision": ({"strategy": "ilk_pipeline_fp16", "devices": 2,
                                  "precision": "16-mixed", "parallelism": {"pp": 2}}, CPU,
                                 "unsupported-precision"),
    "parallelism/tp-across-nodes": ({"strategy": "model_parallel", "devices": 2,
                                     "num_nodes": 2, "parallelism": {"tp": 4}}, CPU, None),
    "parallelism/layout": ({}, CPU, None),
    "plugins/checkpoint-io-plugin": ({"plugins": MyCheckpointIO()}, CPU, None),
    "plugins/checkpoint-io-xla": ({}, TPU, None),
    "plugins/checkpoint-io-torch": ({}, CPU, None),
    "sizing/model-shape": ({"model": SEVEN_B}, CPU, None),
    "sizing/no-model": ({"optimizer": "sgd"}, CPU, None),
    "sizing/model-invalid": ({"model": 7_000_000_000}, CPU, "invalid-model"),
    "sizing/optimizer-invalid": ({"model": SEVEN_B, "optimizer": 3}, CPU,
                                 "unknown-optimizer"),
    "sizing/optimizer-unknown": ({"optimizer": "adamx"}, CPU, "unknown-optimizer"),
    "sizing/optimizer-name": ({"model": SEVEN_B, "optimizer": "adam"}, CPU, None),
    "sizing/micro-batch-invalid": ({"model": SEVEN_B, "micro_batch_size": 0}, CPU,
                                   "invalid-model"),
    "sizing/unused": ({"micro_batch_size": 4}, CPU, None),
    "sizing/micro-batch-size": ({"model": SEVEN_B, "micro_batch_size": 4}, CPU, None),
    "memory/optimizer-given": ({"model": SEVEN_B, "optimizer": "sgd"}, CPU, None),
    "memory/optimizer-assumed": ({"model": SEVEN_B}, CPU, None),
    "memory/replicated": ({"model": SEVEN_B, "strategy": "ddp", "devices": 8}, EIGHT_GPUS,
                          None),
    "memory/sharded": ({"model": SEVEN_B, "strategy": "fsdp", "devices": 8}, EIGHT_GPUS,
                       None),
    "memory/buffers-gradient-buckets": ({"model": SEVEN_B, "strategy": "ddp", "devices": 2},
                                        CPU, None),
    "memory/buffers-gathered-units": ({"model": SEVEN_B, "strategy": "fsdp", "devices": 2},
                                      CPU, None),
    "memory/buffers-zero-buckets": ({"model": SEVEN_B, "strategy": "deepspeed_stage_3",
                                     "devices": 8, "precision": "bf16-true"}, FULL, None),
    "memory/buffers-none": ({"model": SEVEN_B}, CPU, None),
    "memory/activations-estimated": (
        {"model": ModelShape(parameters=10**6, activation_bytes_per_sample=4096),
         "micro_batch_size": 8}, CPU, None),
    "memory/activations-unknown": ({"model": SEVEN_B}, CPU, None),
    "memory/offloaded": ({"model": SEVEN_B, "strategy": "fsdp_cpu_offload", "devices": 8},
                         EIGHT_GPUS, None),
    "memory/on-device": ({"model": SEVEN_B}, CPU, None),
    "memory/device-exceeded": ({"model": SEVEN_B, "strategy": "ddp", "devices": 8},
                               H100S, "insufficient-memory"),
    "memory/host-exceeded": ({"model": SEVEN_B, "strategy": "fsdp_cpu_offload",
                              "devices": 8}, SMALL_HOST, "insufficient-memory"),
    "memory/limit-unknown": ({"model": SEVEN_B}, CPU, None),
    "memory/fits": ({"model": SEVEN_B, "strategy": "fsdp", "devices": 8}, H100S, None),
}


def _all_rule_ids() -> list[str]:
    return [rule.id for stage in STAGES for decision in stage.decisions for rule in decision.rules]


def test_every_rule_has_an_example() -> None:
    missing = [rule for rule in _all_rule_ids() if rule not in EXAMPLES]
    stale = [rule for rule in EXAMPLES if rule not in _all_rule_ids()]
    assert not missing, f"rules without a worked example in EXAMPLES: {missing}"
    assert not stale, f"EXAMPLES names rules that no longer exist: {stale}"


def _broken_entry_points(monkeypatch: pytest.MonkeyPatch,
                         *entries: tuple[str, str]) -> Iterator[None]:
    """The installed entry points and, in each ``(group, name)`` given, one more whose
    module is missing; loaded afresh (with their warnings), then as they were."""
    from importlib import metadata

    from interlock.engine import registry

    installed = metadata.EntryPoints((
        *(ep for kind in registry.KINDS.values()
          for ep in metadata.entry_points(group=kind.group)),
        *(metadata.EntryPoint(name=name, value="ilk_no_such_module:ROWS", group=group)
          for group, name in entries)))

    def entry_points(**params: Any) -> metadata.EntryPoints:
        return installed.select(**params) if params else installed

    with registry.isolated():
        monkeypatch.setattr(metadata, "entry_points", entry_points)
        registry.forget_entry_points()
        with pytest.warns(RuntimeWarning, match="ilk_no_such_module"):
            registry.current_parts()
        yield


@pytest.fixture
def broken_entry_point(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed entry point named ``ilk_broken_example`` whose module is missing."""
    yield from _broken_entry_points(monkeypatch, ("interlock.strategies", "ilk_broken_example"))


@pytest.fixture
def broken_part_entry_points(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A broken ``interlock.precisions`` entry point standing for ``ilk-broken-fp4`` and
    a broken ``interlock.accelerators`` one standing for ``ilk_broken_npu``."""
    yield from _broken_entry_points(monkeypatch, ("interlock.precisions", "ilk-broken-fp4"),
                                    ("interlock.accelerators", "ilk_broken_npu"))


@pytest.fixture
def pipeline_with_16_mixed() -> Iterator[None]:
    """A registered strategy that declares pipeline parallel and 16-mixed (no built-in
    row does: the engine refuses the pair for every row that would)."""
    from interlock import StrategySpec

    register(StrategySpec(
        name="ilk_pipeline_fp16",
        factory="interlock.strategies.model_parallel:ModelParallelStrategy",
        description="a pipeline that claims 16-mixed",
        family="model_parallel", accelerators=frozenset({"cpu"}),
        precisions=frozenset({"32-true", "16-mixed"}), launcher="subprocess",
        parallel_dims=frozenset({"pp", "dp_shard"})))
    yield
    unregister(StrategySpec, "ilk_pipeline_fp16")


@pytest.fixture
def grid_launcher() -> Iterator[None]:
    """A registered launcher that places its ranks on a cluster of its own (its row names
    the ``ilk_grid`` environment), and a strategy that uses it."""
    from interlock import (
        ClusterRow,
        LauncherRow,
        StrategySpec,
    )

    register(ClusterRow(
        name="ilk_grid", detect=None, detect_doc="never detected", external=False,
        description="a grid", factory="interlock.strategies.environments.local:LocalEnvironment"))
    register(LauncherRow(
        name="ilk_grid", start_method=None, interactive=True, launches_single=True,
        description="places ranks on the grid", environment="ilk_grid",
        factory="interlock.strategies.launchers.external:ExternalLauncher",
        placement=lambda *, accelerator, devices_per_node, num_nodes:
            f"{devices_per_node * num_nodes} grid slots"))
    register(StrategySpec(
        name="ilk_grid_ddp", factory="interlock.strategies.ddp:DDPStrategy",
        description="DDP on the grid", family="ddp", accelerators=frozenset({"cpu"}),
        precisions=frozenset({"32-true"}), launcher="ilk_grid"))
    yield
    unregister(StrategySpec, "ilk_grid_ddp")
    unregister(LauncherRow, "ilk_grid")
    unregister(ClusterRow, "ilk_grid")


@pytest.fixture
def untyped_caller() -> Iterator[None]:
    """A caller without type checks (plan()'s own annotations refuse the value under
    typeguard first): the engine's refusal is what such a caller gets."""
    from typeguard import suppress_type_checks

    with suppress_type_checks():
        yield


#: rules whose example needs more than flags and a machine: rule id -> fixture
SETUPS = {"sizing/model-invalid": "untyped_caller",
          "sizing/optimizer-invalid": "untyped_caller","launcher/own-environment": "grid_launcher",
          "launcher/foreign-environment": "grid_launcher",
          "launcher/environment-conflict": "grid_launcher",
          "parallelism/pp-precision": "pipeline_with_16_mixed",
          "flags/strategy-broken-entry-point": "broken_entry_point",
          "flags/precision-broken-entry-point": "broken_part_entry_points",
          "flags/accelerator-broken-entry-point": "broken_part_entry_points"}


@pytest.mark.parametrize("rule_id", sorted(EXAMPLES))
def test_rule_example(rule_id: str, request: pytest.FixtureRequest) -> None:
    """Each example also runs under `audited`: every predicate tried on the way and the
    rule's own action are checked against their drafts (see tests/test_stages.py)."""
    if rule_id in SETUPS:
        request.getfixturevalue(SETUPS[rule_id])
    flags, machine, code = EXAMPLES[rule_id]
    clear_cache()  # a memoised plan would skip the rules
    if code is None:
        with audited():
            result = plan(machine=machine, **flags)
        fired = [step.rule for step in result.trace]
        assert rule_id in fired, (
            f"plan({flags}) on [{machine.describe()}] did not apply {rule_id}; applied: {fired}"
        )
    else:
        with audited(), pytest.raises(ResolutionError) as info:
            plan(machine=machine, **flags)
        error = info.value
        assert (error.rule, error.code) == (rule_id, code), (
            f"plan({flags}) on [{machine.describe()}] was refused by {error.rule} with "
            f"{error.code}, expected {rule_id} with {code}: {error}"
        )

