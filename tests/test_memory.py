"""Memory as a plan-time fact: the arithmetic against numbers everyone knows, each
layout's share, the refusal and its choices, and bad input in one line."""

from __future__ import annotations

import gc
import pickle
import re
import weakref
from typing import Any

import pytest
import torch
from torch import nn
from typeguard import suppress_type_checks

import interlock
from interlock import (
    Machine,
    MemoryTraits,
    ModelShape,
    OptimizerRow,
    ResolutionError,
    StrategySpec,
    plan,
)
from interlock.engine.memory import format_bytes, parse_bytes, pipeline_stages
from machines import CPU, FULL

GiB = 1 << 30
SEVEN_B = ModelShape(parameters=7 * 10**9)
#: 8 x 80 GiB, the commonest training node, and a host of 2 TiB
H100S = Machine(cuda_devices=8, device_memory=80 * GiB, host_memory=2048 * GiB)


def _memory(**flags: Any) -> interlock.MemoryEstimate:
    found = plan(**flags).memory
    assert found is not None, "a plan with model= has an estimate"
    return found


# ------------------------------------------------------------------ numbers everyone knows


def test_adamw_in_float32_holds_16_bytes_per_parameter() -> None:
    """Parameters 4, gradients 4, two moments 8; plus Adam's 4-byte step per tensor."""
    shape = ModelShape(parameters=10**6, tensors=10)
    memory = _memory(model=shape, optimizer="adamw", machine=CPU)
    assert memory.parameter_bytes == 4 * 10**6
    assert memory.gradient_bytes == 4 * 10**6
    assert memory.optimizer_state_bytes == 8 * 10**6 + 10 * 4
    assert memory.model_state_bytes == 16 * 10**6 + 40


def test_seven_billion_under_ddp_on_eight_80gib_gpus_is_refused() -> None:
    with pytest.raises(ResolutionError) as info:
        plan(strategy="ddp", devices=8, model=SEVEN_B, optimizer="adamw", machine=H100S)
    error = info.value
    assert (error.code, error.flag, error.rule) == ("insufficient-memory", "model",
                                                    "memory/device-exceeded")
    # 112 GB of model state and the gradient buckets again: the message says so
    assert "130.4 GiB" in error.reason and "79.0 GiB usable" in error.reason, error.reason
    assert any(choice.startswith("strategy='fsdp'") for choice in error.choices), error


def test_seven_billion_under_fsdp_over_eight_ranks_holds_about_14_gb() -> None:
    memory = _memory(strategy="fsdp", devices=8, model=SEVEN_B, optimizer="adamw",
                     machine=H100S)
    assert memory.model_state_bytes == 14 * 10**9 + 4  # 16 bytes x 7e9 / 8, one step count
    assert memory.fits() and memory.device_limit == 79 * GiB


@pytest.mark.parametrize(("optimizer", "per_parameter"), [
    ("sgd", 8), ("sgd_momentum", 12), ("adam", 16), ("adamw", 16), ("adagrad", 12),
    ("rmsprop", 12), ("rmsprop_momentum", 16)])
def test_each_optimizer_row_counts_its_state(optimizer: str, per_parameter: int) -> None:
    row = interlock.registered(interlock.OptimizerRow)[optimizer]
    memory = _memory(model=ModelShape(parameters=1000, tensors=2), optimizer=optimizer,
                     machine=CPU)
    assert memory.model_state_bytes == per_parameter * 1000 + 2 * row.scalar_bytes


@pytest.mark.parametrize(("precision", "per_parameter"), [
    ("32-true", 16), ("bf16-mixed", 16), ("16-mixed", 16), ("bf16-true", 8),
    ("16-true", 8), ("64-true", 32)])
def test_the_precision_row_sets_the_dtypes(precision: str, per_parameter: int) -> None:
    """Half precisions cast parameters, gradients and (torch's) optimizer state; mixed
    precisions keep float32 parameters; 64-true doubles everything."""
    memory = _memory(model=ModelShape(parameters=1000), optimizer="adamw",
                     precision=precision, machine=CPU)
    assert memory.model_state_bytes - 4 == per_parameter * 1000


def test_a_model_created_in_bfloat16_stays_so_under_32_true() -> None:
    shape = ModelShape(parameters=1000, dtype="bfloat16")
    assert _memory(model=shape, optimizer="sgd", machine=CPU).model_state_bytes == 4000


# ------------------------------------------------------------------ layouts


def test_fsdp_pads_each_tensor_by_rows_when_the_shape_says_them() -> None:
    """3 rows of 4 over 2 ranks: each rank stores 2 rows (the second padded)."""
    shape = ModelShape(parameters=12 + 5, tensor_rows=((3, 12), (5, 5)))
    memory = _memory(strategy="fsdp", devices=2, model=shape, optimizer="sgd", machine=CPU)
    assert memory.parameter_bytes == (2 * 4 + 3) * 4
    # without the rows: an equal share of the elements
    flat = _memory(strategy="fsdp", devices=2, model=ModelShape(parameters=17),
                   optimizer="sgd", machine=CPU)
    assert flat.parameter_bytes == 9 * 4


def test_hsdp_shards_over_dp_shard_only() -> None:
    memory = _memory(strategy="fsdp", devices=8, model=SEVEN_B, optimizer="sgd",
                     parallelism={"dp_replicate": 2, "dp_shard": 4}, machine=H100S)
    assert memory.parameter_bytes == 7 * 10**9 * 4 // 4


def test_the_largest_pipeline_stage_is_the_ranks_share() -> None:
    """The default split gives runs of layers: [10, 20] and [30, 40]."""
    shape = ModelShape(parameters=100, layers=(10, 20, 30, 40))
    assert pipeline_stages(shape, 2) == (30, 70)
    assert pipeline_stages(shape, 3) == (30, 30, 40)
    memory = _memory(strategy="model_parallel", devices=2, model=shape, optimizer="sgd",
                     parallelism={"pp": 2}, machine=CPU)
    assert memory.parameter_bytes == 70 * 4 and memory.rank == "pipeline stage 1 (the largest)"


def test_tensor_parallel_splits_only_the_weights_the_shape_names() -> None:
    shape = ModelShape(parameters=1000, tensor_parallel=800)
    memory = _memory(strategy="model_parallel", devices=4, model=shape, optimizer="sgd",
                     parallelism={"tp": 4}, machine=CPU)
    assert memory.parameter_bytes == (200 + 200) * 4


@pytest.mark.parametrize(("stage", "sharded"), [(1, 1), (2, 2), (3, 3)])
def test_each_zero_stage_shards_one_more_state(stage: int, sharded: int) -> None:
    """bf16-true under DeepSpeed: 2-byte parameters and gradients, float32 master weights
    and moments (12 bytes) in the optimizer state."""
    p, world = 8 * 10**9, 8
    memory = _memory(strategy=f"deepspeed_stage_{stage}", devices=world, model=ModelShape(
        parameters=p), optimizer="adamw", precision="bf16-true", machine=FULL)
    assert memory.optimizer_state_bytes == 12 * p // world + 4
    assert memory.gradient_bytes == (2 * p // world if sharded >= 2 else 2 * p)
    assert memory.parameter_bytes == (2 * p // world if sharded >= 3 else 2 * p)


def test_offloaded_state_lives_in_host_memory() -> None:
    memory = _memory(strategy="fsdp_cpu_offload", devices=8, model=SEVEN_B,
                     optimizer="adamw", machine=H100S)
    assert memory.offloaded == ("parameters", "gradients", "optimizer")
    assert memory.host_bytes == memory.model_state_bytes
    assert memory.device_bytes == 0  # the gathered units are not sized by this shape
    small_host = Machine(cuda_devices=8, device_memory=80 * GiB, host_memory=64 * GiB)
    with pytest.raises(ResolutionError) as info:
        plan(strategy="fsdp_cpu_offload", devices=8, model=SEVEN_B, machine=small_host)
    assert info.value.rule == "memory/host-exceeded", info.value


def test_the_gathered_unit_and_the_ddp_buckets_are_counted() -> None:
    unit = ModelShape(parameters=10**9, largest_unit=10**8)
    fsdp = _memory(strategy="fsdp", devices=8, model=unit, optimizer="sgd", machine=H100S)
    # the unit gathered, the next prefetched, its unsharded gradients and their copy
    assert fsdp.buffer_bytes == 10**8 * 4 * 2 + 10**8 * 8 and not fsdp.unknown
    ddp = _memory(strategy="ddp", devices=2, model=unit, optimizer="sgd", machine=CPU)
    assert ddp.buffer_bytes == ddp.gradient_bytes


def test_activations_from_bytes_per_sample_and_the_micro_batch() -> None:
    shape = ModelShape(parameters=1000, activation_bytes_per_sample=10**6)
    assert _memory(model=shape, machine=CPU).activation_bytes is None
    assert _memory(model=shape, micro_batch_size=8, machine=CPU).activation_bytes == 8 * 10**6
    split = _memory(strategy="model_parallel", devices=4, model=shape, micro_batch_size=8,
                    parallelism={"tp": 4}, machine=CPU)
    assert split.activation_bytes == 2 * 10**6


def test_cpu_ranks_share_the_hosts_memory() -> None:
    host = Machine(host_memory=8 * GiB)
    memory = _memory(strategy="ddp", devices=2, model=ModelShape(parameters=10**6),
                     machine=host)
    assert memory.device_limit == 4 * GiB - (512 << 20)
    with pytest.raises(ResolutionError) as info:
        plan(strategy="ddp", devices=2, model=ModelShape(parameters=2 * 10**8), machine=host)
    assert "shared by 2 ranks" in info.value.reason, info.value


def test_unknown_memory_refuses_nothing() -> None:
    memory = _memory(strategy="ddp", devices=8, model=ModelShape(parameters=10**12),
                     machine=Machine(cuda_devices=8))
    assert memory.device_limit is None and memory.fits()


# ------------------------------------------------------------------ the refusal's choices


def _flag_of(choice: str) -> dict[str, object]:
    found = re.match(r"^(strategy|parallelism|num_nodes)=(\S+) \(", choice)
    assert found, choice
    name, value = found.groups()
    return {name: int(value) if name == "num_nodes" else value.strip("'")}


@pytest.mark.parametrize("flags", [
    {"strategy": "ddp", "devices": 8},
    {"strategy": "model_parallel", "devices": 8, "parallelism": {"dp_replicate": 8}},
    {"strategy": "fsdp", "devices": 8, "parallelism": {"dp_replicate": 8, "dp_shard": 1}},
])
def test_every_choice_offered_plans_and_fits(flags: dict[str, object]) -> None:
    shape = ModelShape(parameters=7 * 10**9, tensor_parallel=6 * 10**9,
                       layers=(10**9,) * 7, largest_unit=10**9)
    with pytest.raises(ResolutionError) as info:
        plan(model=shape, machine=FULL_MEMORY, **flags)  # type: ignore[arg-type]
    assert info.value.choices, info.value
    for choice in info.value.choices:
        change = _flag_of(choice)
        tried = {**flags, **change}
        if "strategy" in change:
            tried.pop("parallelism", None)
        found = plan(model=shape, machine=FULL_MEMORY, **tried)  # type: ignore[arg-type]
        assert found.memory is not None and found.memory.fits(), choice
        assert format_bytes(found.memory.device_bytes) in choice, (choice, found.memory)


FULL_MEMORY = Machine(cuda_devices=8, packages=FULL.packages, device_memory=80 * GiB,
                      host_memory=2048 * GiB)


def test_a_model_too_large_for_anything_says_so() -> None:
    with pytest.raises(ResolutionError) as info:
        plan(strategy="ddp", devices=8, model=ModelShape(parameters=10**14),
             machine=H100S)
    assert not info.value.choices
    assert "a smaller model" in info.value.reason


# ------------------------------------------------------------------ the plan, the trace


def test_a_plan_without_model_has_no_memory_and_no_memory_steps() -> None:
    found = plan(strategy="ddp", devices=2, machine=CPU)
    assert found.memory is None and found.model is None
    assert not [s for s in found.trace if s.stage in ("sizing", "memory")]


def test_the_trace_explain_and_json_say_it() -> None:
    found = plan(strategy="fsdp", devices=8, model=SEVEN_B, machine=H100S)
    rules = [s.rule for s in found.trace if s.stage == "memory"]
    assert rules == ["memory/optimizer-assumed", "memory/sharded",
                     "memory/buffers-gathered-units", "memory/activations-unknown",
                     "memory/on-device", "memory/fits"]
    assert any("assumes 'adamw'" in note for note in found.notes)
    text = found.explain()
    assert "Memory per rank (every rank)" in text and "model state      13.0 GiB" in text
    data = found.to_dict()
    assert data["memory"]["model_state_bytes"] == 14 * 10**9 + 4  # type: ignore[index]
    assert data["optimizer"] == "adamw"


def test_the_same_flags_give_the_same_plan_object() -> None:
    shape = ModelShape(parameters=1000)
    assert plan(model=shape, machine=CPU) is plan(model=ModelShape(parameters=1000),
                                                    machine=CPU)


# ------------------------------------------------------------------ bad input, one line


@pytest.mark.parametrize(("fields", "says"), [
    ({"parameters": 0}, "parameters must be from 1"),
    ({"parameters": -5}, "parameters must be from 1"),
    ({"parameters": 10**20}, "parameters must be from 1"),
    ({"parameters": "7B"}, "must be the number of trainable parameter elements"),
    ({"parameters": 7.5}, "must be the number of trainable parameter elements"),
    ({"parameters": True}, "must be the number of trainable parameter elements"),
    ({"parameters": 10, "dtype": "float13"}, "dtype must be a dtype name"),
    ({"parameters": 10, "layers": (4, 4)}, "layers add up to 8 elements"),
    ({"parameters": 10, "tensor_parallel": 11}, "tensor_parallel must be from 0"),
    ({"parameters": 10, "tensor_rows": ((3, 10),)}, "do not make 3 equal rows"),
    ({"parameters": 10, "largest_unit": 0}, "largest_unit must be from 1"),
    ({"parameters": 10, "buffer_bytes": -1}, "buffer_bytes must be from 0"),
    ({"parameters": 10, "activation_bytes_per_sample": 10**19},
     "activation_bytes_per_sample must be from 0"),
])
def test_a_bad_shape_is_one_clear_line(fields: dict[str, Any], says: str) -> None:
    with suppress_type_checks(), pytest.raises(ValueError) as info:
        ModelShape(**fields)
    assert says in str(info.value) and "\n" not in str(info.value), info.value


def test_parameters_written_7e9_are_taken() -> None:
    assert ModelShape(parameters=7e9).parameters == 7 * 10**9  # type: ignore[arg-type]


@pytest.mark.parametrize(("flags", "code", "says"), [
    ({"model": 7 * 10**9}, "invalid-model", "expected an interlock.ModelShape, got int"),
    ({"model": SEVEN_B, "optimizer": "adamx"}, "unknown-optimizer", "Did you mean 'adam'?"),
    ({"model": SEVEN_B, "optimizer": torch.optim.AdamW}, "unknown-optimizer",
     "the optimizer flag is a name"),
    ({"model": SEVEN_B, "micro_batch_size": 0}, "invalid-model", "an int from 1"),
    ({"model": SEVEN_B, "micro_batch_size": True}, "invalid-model", "an int from 1"),
    ({"optimizer": "lion"}, "unknown-optimizer", "not an optimizer interlock knows"),
])
def test_bad_flags_are_refused_with_a_code(flags: dict[str, Any], code: str,
                                           says: str) -> None:
    with suppress_type_checks(), pytest.raises(ResolutionError) as info:
        plan(machine=CPU, **flags)
    assert info.value.code == code and says in str(info.value), info.value


@pytest.mark.parametrize("text", ["80", "80GiB", "141 GB", "24g", "1.5TiB", "512MiB"])
def test_sizes_read_as_people_write_them(text: str) -> None:
    assert parse_bytes(text) > 0


@pytest.mark.parametrize("text", ["", "80zz", "-5GiB", "1e30", "GiB", "x" * 1000])
def test_a_bad_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_bytes(text)


@pytest.mark.parametrize(("field", "value"), [("device_memory", 0), ("host_memory", -1),
                                              ("device_memory", 10**19),
                                              ("host_memory", "80GiB")])
def test_a_machines_memory_is_checked(field: str, value: object) -> None:
    with suppress_type_checks(), pytest.raises(ValueError, match=field):
        Machine(**{field: value})  # type: ignore[arg-type]


def test_a_machine_with_memory_round_trips_and_says_it() -> None:
    machine = Machine(cuda_devices=2, device_memory=24 * GiB, host_memory=64 * GiB)
    assert pickle.loads(pickle.dumps(machine)) == machine
    assert Machine(**machine.to_dict()) == machine  # type: ignore[arg-type]
    assert "device memory 24.0 GiB; host memory 64.0 GiB" in machine.describe()
    assert Machine(cuda_devices=2) != machine


def test_probe_reads_the_hosts_memory() -> None:
    assert (Machine.probe().host_memory or 0) > 1 << 28


# ------------------------------------------------------------------ rows


def test_a_registered_optimizer_is_planned_for() -> None:
    row = OptimizerRow(name="ilk_lion", state_tensors=1, description="Lion: one momentum",
                       factory="lion_pytorch:Lion")
    interlock.register(row)
    try:
        memory = _memory(model=ModelShape(parameters=100), optimizer="ilk_lion", machine=CPU)
        assert memory.optimizer_state_bytes == 400
    finally:
        interlock.unregister(interlock.OptimizerRow, "ilk_lion")
    with pytest.raises(interlock.RegistrationError, match="state_tensors must be an int"):
        interlock.register(OptimizerRow(name="ilk_bad", state_tensors=-1,
                                                  description="x", factory="a.b:C"))


def test_a_precision_that_keeps_state_says_so_in_its_row() -> None:
    """A Kahan-compensated precision keeps a buffer per parameter in the optimizer's
    state: its row's state_tensors counts it, in the parameters' dtype."""
    row = interlock.PrecisionRow(
        name="ilk-bf16-compensated", param_dtype="bfloat16", compute_dtype="bfloat16",
        scaler=False, plugin="ilk_kahan", factory="interlock.strategies.precision.half:"
        "HalfPrecision", description="x", accelerators=frozenset({"cpu"}),
        strategies=frozenset({"single_device"}), state_tensors=1)
    interlock.register(row)
    try:
        memory = _memory(model=ModelShape(parameters=100), optimizer="sgd_momentum",
                         precision="ilk-bf16-compensated", machine=CPU)
        assert memory.optimizer_state_bytes == 100 * 2 * 2  # momentum and compensation
    finally:
        interlock.unregister(interlock.PrecisionRow, "ilk-bf16-compensated")
    with pytest.raises(interlock.RegistrationError, match="state_tensors must be an int"):
        interlock.register(interlock.PrecisionRow(
            name="ilk-bad", param_dtype="bfloat16", compute_dtype="bfloat16", scaler=False,
            plugin="ilk_kahan", factory="a.b:C", description="x", state_tensors=99))


def test_a_strategy_declares_its_memory_traits_or_takes_its_familys() -> None:
    spec = StrategySpec(name="ilk_zero", factory="interlock.strategies.ddp:DDPStrategy",
                        description="x", family="other", accelerators=frozenset({"cpu"}),
                        precisions=frozenset({"32-true"}), launcher="fork",
                        memory=MemoryTraits(sharded=frozenset({"optimizer", "nope"})))
    with pytest.raises(interlock.RegistrationError, match=r"memory.sharded has \['nope'\]"):
        interlock.register(spec)
    stage_2 = interlock.registered(interlock.StrategySpec)["deepspeed_stage_2"]
    assert pickle.loads(pickle.dumps(stage_2)) == stage_2
    ddp_like = StrategySpec(name="x", factory="a.b:C", description="x", family="ddp",
                            accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
                            launcher="fork")
    assert ddp_like.memory_traits.buffers == "gradient_buckets"


# ------------------------------------------------------------------ measuring a module


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)


def test_model_shape_counts_tied_weights_once_and_frozen_apart() -> None:
    shape = interlock.model_shape(_Tied())
    assert shape.parameters == 50 * 8 + 16  # embedding (= head) and the norm's two
    assert shape.frozen_parameters == 72
    assert shape.buffer_bytes == (8 + 8) * 4 + 8  # running mean, var, batch count
    assert shape.tensors == 3 and shape.largest_unit is None


def test_model_shape_reads_a_meta_model_and_its_units() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 8))
    shape = interlock.model_shape(model, units=(nn.Linear,),
                                  tensor_parallel={"0": "colwise", "2": "rowwise"})
    assert shape.layers == (1024 * 1025, 8 * 1025)
    assert shape.largest_unit == 1024 * 1025
    assert shape.tensor_parallel == 1024 * 1025 + 8 * 1024  # row-wise bias stays whole
    assert interlock.model_shape(model, units=()).largest_unit == shape.parameters


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_model_shape_measures_activations_from_a_sample(device: str) -> None:
    with torch.device(device):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        batch = torch.ones(4, 16)
    shape = interlock.model_shape(model, sample=batch)
    # per sample: the first layer's input (16 floats), the ReLU's output that the second
    # layer saves too (32, counted once), the output (8); the weights are not counted
    assert shape.activation_bytes_per_sample == (16 + 32 + 8) * 4
    assert shape.largest_activation_bytes_per_sample == 32 * 4


def test_model_shape_measures_an_autocast_forward() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = interlock.model_shape(model, sample=torch.ones(4, 16))
    # under autocast the layers save bfloat16 copies: the input's copy, the ReLU's output
    # and the bfloat16 output, and the second layer its weight's bfloat16 copy, which
    # only autocast holds (the first layer's is not needed: its input takes no gradient)
    assert half.activation_bytes_per_sample == (16 + 32 + 8) * 2 + 32 * 8 * 2 // 4


def test_the_backward_passs_gradients_in_flight_are_added_for_the_largest_tensor() -> None:
    shape = ModelShape(parameters=1000, activation_bytes_per_sample=100,
                       largest_activation_bytes_per_sample=30)
    memory = interlock.plan(accelerator="cpu", devices=1, model=shape, optimizer="sgd",
                            micro_batch_size=4).memory
    assert memory is not None and memory.activation_bytes == (100 + 2 * 30) * 4
    with pytest.raises(ValueError, match="at most activation_bytes_per_sample"):
        ModelShape(parameters=1000, activation_bytes_per_sample=10,
                   largest_activation_bytes_per_sample=30)
    with pytest.raises(ValueError, match="give activation_bytes_per_sample too"):
        ModelShape(parameters=1000, largest_activation_bytes_per_sample=30)


def test_measuring_activations_leaves_no_graph_alive() -> None:
    class Keeps(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 8)
            self.seen: list[weakref.ref[torch.Tensor]] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hidden = torch.relu(self.layer(x))
            self.seen.append(weakref.ref(hidden))
            out: torch.Tensor = self.layer(hidden)
            return out

    model = Keeps()
    gc.disable()  # freed by reference counts alone, not by a collection that may not come
    try:
        interlock.model_shape(model, sample=torch.ones(2, 8))
        assert model.seen[0]() is None, "the measured forward's graph outlived it"
    finally:
        gc.enable()


def test_model_shape_leaves_the_parameters_out_of_the_activations() -> None:
    model = nn.Linear(64, 64, bias=False)
    # the backward saves the input and the weight; the weight is the model's own
    assert interlock.model_shape(model, sample=torch.ones(2, 64)
                                 ).activation_bytes_per_sample == (64 + 64) * 4


def test_model_shape_refuses_what_it_cannot_measure() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        interlock.model_shape(nn.ReLU())
    with pytest.raises(ValueError, match="has no submodule 'nope'"):
        interlock.model_shape(nn.Linear(2, 2), tensor_parallel={"nope": "colwise"})
    with pytest.raises(ValueError, match="style 'diagonal'"):
        interlock.model_shape(nn.Linear(2, 2), tensor_parallel={"": "diagonal"})
    with pytest.raises(ValueError, match="expected a batch"):
        interlock.model_shape(nn.Linear(2, 2), sample=torch.tensor(1.0))
    with pytest.raises(ValueError, match="not both"):
        interlock.model_shape(nn.Linear(2, 2), sample=torch.ones(1, 2),
                              activation_bytes_per_sample=8)

