"""What the engine decides, field by field, for the cases users hit most."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from typeguard import suppress_type_checks

from interlock import Machine, ResolutionError, StrategySpec, plan, register, registered, unregister
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
    slurm,
    torchelastic,
)
from plugins import (
    BadPrecisionPlugin,
    BF16Plugin,
    Fp16MixedPlugin,
    HalfDeclaredCluster,
    HalfTruePlugin,
    MyCheckpointIO,
    MyCluster,
    NotAPlugin,
)


def refusal(machine: Machine, **flags: Any) -> ResolutionError:
    with pytest.raises(ResolutionError) as info:
        plan(machine=machine, **flags)
    return info.value


def untyped_refusal(machine: Machine, **flags: Any) -> ResolutionError:
    """Like a caller without static types (a YAML config): values outside plan()'s
    annotations must still meet a ResolutionError, so typeguard steps aside."""
    with suppress_type_checks(), pytest.raises(ResolutionError) as info:
        plan(machine=machine, **flags)
    return info.value


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ("auto", tuple(f"cuda:{i}" for i in range(8))),
        (-1, tuple(f"cuda:{i}" for i in range(8))),
        ("-1", tuple(f"cuda:{i}" for i in range(8))),
        (2, ("cuda:0", "cuda:1")),
        ("2", ("cuda:0", "cuda:1")),
        (" 3 ", ("cuda:0", "cuda:1", "cuda:2")),
        ("0,1", ("cuda:0", "cuda:1")),
        ("1,", ("cuda:1",)),
        ("3, 5", ("cuda:3", "cuda:5")),
        ([1, 3], ("cuda:1", "cuda:3")),
        ((7,), ("cuda:7",)),
    ],
)
def test_cuda_devices_forms(devices: Any, expected: tuple[str, ...]) -> None:
    result = plan(devices=devices, machine=EIGHT_GPUS)
    assert result.parallel_devices == expected
    assert result.world_size == len(expected)


@pytest.mark.parametrize(
    "devices", [0, "0", [], "[]", "", False, True, 1.5, 2.0, -2, [0, 0], "0,0", "abc", None,
                {"a": 1}, [1, "2"], [-1], "1,,2"],
)
def test_invalid_devices(devices: Any) -> None:
    error = untyped_refusal(EIGHT_GPUS, devices=devices)
    assert error.code == "invalid-devices", str(error)
    assert error.flag == "devices"
    assert "Accepted forms" in str(error)


def test_cpu_devices_are_process_counts() -> None:
    assert plan(accelerator="cpu", devices=4, machine=CPU).parallel_devices == ("cpu",) * 4
    error = refusal(CPU, accelerator="cpu", devices="0,1")
    assert error.code == "invalid-devices" and "number of processes" in error.reason


def test_devices_beyond_the_machine_name_what_exists() -> None:
    error = refusal(Machine(cuda_devices=2), devices=[0, 3])
    assert error.code == "devices-unavailable"
    assert "this machine has 2 CUDA devices" in error.reason and "ids 0..1" in error.reason
    assert error.choices == ("auto", "-1", "1", "2")


def test_interactive_auto_uses_one_gpu_and_says_so() -> None:
    result = plan(machine=EIGHT_GPUS_NOTEBOOK)
    assert result.parallel_devices == ("cuda:0",) and result.strategy == "single_device"
    assert any("interactive session uses 1 of 8" in note for note in result.notes)
    explicit = plan(devices=-1, machine=EIGHT_GPUS_NOTEBOOK)
    assert explicit.strategy == "ddp_notebook" and explicit.launcher == "fork"


def test_mps_has_one_device_and_runs_single_device_only() -> None:
    assert plan(machine=MPS).parallel_devices == ("mps:0",)
    error = refusal(MPS, strategy="ddp")
    assert error.code == "unsupported-accelerator" and "single_device" in error.choices


def test_xla_devices() -> None:
    assert plan(machine=TPU).strategy == "xla"
    assert plan(machine=TPU).launcher == "xla"
    assert plan(devices=[5], machine=TPU).parallel_devices == ("xla:5",)
    assert plan(devices=1, machine=TPU).strategy == "single_xla"
    assert plan(devices=1, machine=TPU).launcher is None


# --------------------------------------------------------------------------- accelerator


def test_gpu_alias_prefers_mps_then_cuda_and_notes_it() -> None:
    both = Machine(cuda_devices=2, mps_available=True)
    assert plan(accelerator="gpu", machine=both).accelerator == "mps"
    result = plan(accelerator="GPU", machine=ONE_GPU)
    assert result.accelerator == "cuda"
    assert any("chose 'cuda'" in note for note in result.notes)


def test_auto_accelerator_order() -> None:
    everything = Machine(cuda_devices=2, mps_available=True, xla_devices=4,
                         packages=frozenset({"torch_xla"}))
    assert plan(machine=everything).accelerator == "xla"
    assert plan(machine=Machine(cuda_devices=2, mps_available=True)).accelerator == "mps"
    assert plan(machine=EIGHT_GPUS).accelerator == "cuda"
    assert plan(machine=CPU).accelerator == "cpu"


def test_explicit_accelerator_missing_lists_what_exists() -> None:
    error = refusal(MPS, accelerator="cuda")
    assert error.code == "accelerator-unavailable"
    assert "this machine has 0 CUDA devices" in error.reason
    assert error.choices == ("cpu", "mps")


def test_xla_without_torch_xla_is_a_missing_package() -> None:
    error = refusal(CPU, accelerator="tpu")
    assert error.code == "missing-package" and "pip install" in error.reason


# --------------------------------------------------------------------------- strategy


def test_auto_strategy() -> None:
    assert plan(machine=CPU).strategy == "single_device"
    assert plan(devices=2, machine=CPU).strategy == "ddp"
    assert plan(devices=2, machine=NOTEBOOK).strategy == "ddp_notebook"
    assert plan(num_nodes=2, machine=CPU).strategy == "ddp"
    assert plan(num_nodes=2, machine=CPU).world_size == 2


def test_withdrawn_and_typo_strategies() -> None:
    dp = refusal(EIGHT_GPUS, strategy="dp")
    assert dp.code == "unknown-strategy" and dp.choices == ("ddp",)
    typo = refusal(CPU, strategy="fsdb")
    assert typo.suggestion == "fsdp" and "Did you mean 'fsdp'?" in str(typo)


def test_a_misspelt_name_is_offered_only_names_that_get_past_its_flag() -> None:
    """The choices of an unknown name are the names that would work here with the
    other flags as written; a did-you-mean that would be refused too says why
    instead of being offered."""
    typo = refusal(CPU, strategy="deepsped")
    assert typo.suggestion is None and "deepspeed" not in typo.choices, typo
    assert "The closest name, 'deepspeed', is refused here too: [missing-package]" in str(
        typo)
    assert {"ddp", "fsdp", "single_device"} <= set(typo.choices)
    with_it = refusal(Machine(packages=frozenset({"deepspeed"})), strategy="deepsped")
    assert with_it.suggestion == "deepspeed" and "deepspeed" in with_it.choices
    accelerator = refusal(CPU, accelerator="cdua")
    assert accelerator.choices == ("auto", "cpu") and accelerator.suggestion is None
    seen = set()
    for code, flag, flags in (
            ("unknown-strategy", "strategy", {"strategy": "nope"}),
            ("unknown-accelerator", "accelerator", {"accelerator": "nope"}),
            ("unknown-precision", "precision", {"precision": "nope", "strategy": "fsdp"}),
            ("devices-unavailable", "devices", {"accelerator": "cuda", "devices": 99})):
        for machine in (CPU, EIGHT_GPUS, TPU):
            try:
                plan(machine=machine, **flags)
            except ResolutionError as error:
                if error.code != code:
                    continue
                assert error.choices, error
                seen.add(code)
                for choice in error.choices:
                    value: Any = int(choice) if choice.lstrip("-").isdigit() else choice
                    try:
                        plan(machine=machine, **{**flags, flag: value})
                    except ResolutionError as again:
                        assert again.flag != flag, (flags, machine, choice, again)
    assert len(seen) == 4, seen


def test_xla_fsdp_refuses_16_bit_parameters_with_what_runs_instead() -> None:
    """torch_xla's FSDP raises for any parameter dtype but float32: the plan refuses
    what could never be built, and names the compute-dtype option that runs."""
    for precision in ("16-true", "bf16-true"):
        error = refusal(TPU, strategy="xla_fsdp", precision=precision)
        assert error.code == "unsupported-precision" and error.flag == "precision"
        assert error.choices == ("32-true",), error.choices
        assert "only fp32 parameters are supported" in error.reason
        assert "compute_dtype=torch.bfloat16" in error.reason
    assert plan(strategy="xla_fsdp", machine=TPU).precision == "32-true"
    # a precision the row never declared: the reason lists what runs on this accelerator
    other = refusal(TPU, strategy="xla_fsdp", precision="bf16-mixed")
    assert other.reason.endswith("strategy 'xla_fsdp' supports 32-true on xla."), other.reason
    assert plan(strategy="xla", precision="bf16-true", machine=TPU).precision == "bf16-true"


def test_substitutes_are_the_only_choice() -> None:
    assert refusal(TPU, strategy="fsdp").choices == ("xla_fsdp",)
    assert refusal(CPU, strategy="fsdp_cpu_offload").choices == ("fsdp",)
    assert plan(strategy="fsdp_cpu_offload", machine=ONE_GPU).spec.options == {
        "cpu_offload": True
    }


def test_deepspeed_needs_the_package_and_refuses_float16_on_cpu() -> None:
    assert refusal(CPU, strategy="deepspeed_stage_3").code == "missing-package"
    cpu_with_deepspeed = Machine(packages=frozenset({"deepspeed"}))
    assert plan(strategy="deepspeed_stage_3", devices=2,
                machine=cpu_with_deepspeed).precision == "32-true"
    fp16 = refusal(cpu_with_deepspeed, strategy="deepspeed_stage_3", precision="16-mixed")
    assert fp16.code == "unsupported-precision" and "does not support float16" in fp16.reason
    missing = refusal(ONE_GPU, strategy="deepspeed_stage_3")
    assert missing.code == "missing-package" and "pip install deepspeed" in missing.reason
    result = plan(strategy="deepspeed_stage_3_offload", devices=8, machine=FULL)
    assert result.spec.options["stage"] == 3 and result.world_size == 8


def test_single_device_with_several_devices() -> None:
    error = refusal(EIGHT_GPUS, strategy="single_device", devices=2)
    assert error.code == "invalid-devices" and error.choices == ("1",)


def test_launchers_and_interactive_sessions() -> None:
    assert plan(strategy="ddp_spawn", devices=2, machine=CPU).launcher == "spawn"
    assert plan(strategy="ddp_forkserver", devices=2, machine=CPU).launcher == "forkserver"
    # the script launcher starts nothing for one device, so a notebook can use ddp there
    assert plan(strategy="ddp", devices=1, machine=NOTEBOOK).launcher == "subprocess"
    # spawn starts a process even for one device
    assert refusal(NOTEBOOK, strategy="ddp_spawn").code == "interactive-incompatible"
    error = refusal(NOTEBOOK, strategy="fsdp", devices=2)
    assert error.choices == ("ddp_fork", "ddp_notebook")


def test_no_fork_platform() -> None:
    error = refusal(NO_FORK, strategy="ddp_notebook", devices=2)
    assert error.code == "start-method-unavailable"
    assert "offers spawn" in error.reason and "ddp_spawn" in error.choices
    assert plan(strategy="ddp_spawn", devices=2, machine=NO_FORK).launcher == "spawn"


def test_find_unused_parameters_variants() -> None:
    result = plan(strategy="ddp_spawn_find_unused_parameters_true", devices=2, machine=CPU)
    assert result.launcher == "spawn"
    assert result.spec.options == {"find_unused_parameters": True}
    assert (result.spec.preset_of, result.spec.variant_of) == ("ddp", "ddp_spawn")


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [(16, "16-mixed"), ("16", "16-mixed"), ("bf16", "bf16-mixed"), (32, "32-true"),
     ("32", "32-true"), (64, "64-true"), ("64", "64-true")],
)
def test_legacy_precisions_are_translated_and_noted(alias: Any, canonical: str) -> None:
    result = plan(precision=alias, machine=CPU)
    assert result.precision == canonical
    assert any("legacy alias" in note for note in result.notes)


@pytest.mark.parametrize("junk", [16.0, True, "16-bit", "half", None, "fp32"])
def test_unknown_precisions(junk: Any) -> None:
    assert untyped_refusal(CPU, precision=junk).code == "unknown-precision"


def test_sixteen_mixed_on_cpu_is_kept() -> None:
    result = plan(precision="16-mixed", machine=CPU)
    assert result.precision == "16-mixed"
    assert not result.notes


@pytest.mark.parametrize(
    ("strategy", "machine", "supported"),
    [
        ("ddp", CPU, ("64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")),
        ("fsdp", CPU, ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")),
        ("model_parallel", CPU, ("32-true", "16-true", "bf16-true", "bf16-mixed")),
        ("xla", TPU, ("32-true", "16-true", "bf16-true")),
        ("single_device", MPS, ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")),
        ("deepspeed", FULL, ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")),
        ("ddp", FULL, ("64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed",
                       "transformer-engine", "transformer-engine-float16")),
    ],
)
def test_precision_support_by_family(
    strategy: str, machine: Machine, supported: tuple[str, ...]
) -> None:
    from interlock.engine.tables import PRECISION_NAMES

    devices: int | str = 2
    if strategy in ("single_device", "xla"):
        devices = 1 if strategy == "single_device" else "auto"
    for precision in PRECISION_NAMES:
        try:
            result = plan(strategy=strategy, precision=precision, devices=devices,
                          machine=machine)
        except ResolutionError as error:
            assert precision not in supported, f"{strategy}/{precision} refused: {error}"
            assert error.choices == tuple(p for p in supported), str(error)
        else:
            assert precision in supported, f"{strategy}/{precision} accepted"
            assert result.precision == precision


def test_transformer_engine_needs_cuda_and_the_package() -> None:
    assert refusal(CPU, precision="transformer-engine").code == "unsupported-precision"
    assert refusal(ONE_GPU, precision="transformer-engine").code == "missing-package"
    assert plan(precision="transformer-engine", machine=FULL).precision == "transformer-engine"


# --------------------------------------------------------------------------- plugins


def test_precision_plugin_sets_the_precision() -> None:
    result = plan(plugins=[BF16Plugin()], machine=CPU)
    assert result.precision == "bf16-mixed"
    assert [type(p) for p in result.plugins] == [BF16Plugin]


def test_precision_plugin_conflicts_with_a_precision_flag() -> None:
    error = refusal(CPU, plugins=BF16Plugin(), precision="bf16-mixed")
    assert error.code == "conflicting-flags" and error.flag == "precision"


def test_precision_plugin_is_checked_like_the_flag() -> None:
    error = refusal(CPU, plugins=Fp16MixedPlugin(), strategy="model_parallel", devices=2)
    assert (error.code, error.flag) == ("unsupported-precision", "plugins")
    assert "'16-mixed' is not supported" in error.reason
    # precision=32 is the default spelled as a legacy alias: the plugin decides
    result = plan(plugins=HalfTruePlugin(), precision=32, machine=MPS)
    assert result.precision == "16-true"


@pytest.mark.parametrize(
    ("plugins", "problem"),
    [
        ("bf16-mixed", "a string is not a plugin"),
        ([NotAPlugin()], "declares no interlock_part_kind"),
        ([BF16Plugin(), HalfTruePlugin()], "two precision plugins"),
        ([MyCheckpointIO(), MyCheckpointIO()], "two checkpoint io plugins"),
        ([BadPrecisionPlugin()], "not a canonical precision"),
        ([HalfDeclaredCluster()], "creates_processes_externally"),
    ],
)
def test_invalid_plugins(plugins: Any, problem: str) -> None:
    error = refusal(CPU, plugins=plugins)
    assert error.code == "invalid-plugin" and problem in error.reason, str(error)


def test_cluster_plugin_wins_over_detection() -> None:
    result = plan(devices=2, plugins=MyCluster(), machine=torchelastic(99, 99, 9))
    assert result.cluster_environment == "my-cluster" and result.launcher == "external"


def test_checkpoint_io_plugin() -> None:
    assert plan(plugins=(MyCheckpointIO(),), machine=CPU).checkpoint_io == "MyCheckpointIO"
    assert plan(machine=CPU).checkpoint_io == "torch"


# --------------------------------------------------------------------------- clusters


def test_torchelastic_uses_the_external_launcher() -> None:
    result = plan(devices=8, num_nodes=2, strategy="ddp", machine=torchelastic(16, 8, 2))
    assert (result.cluster_environment, result.launcher, result.world_size) == (
        "torchelastic", "external", 16)
    assert not result.notes


def test_a_spawn_strategy_under_torchrun_is_noted() -> None:
    result = plan(devices=2, strategy="ddp_spawn", machine=torchelastic(2, 2, 1))
    assert result.launcher == "external"
    assert any("normally starts its processes with the spawn launcher" in note
               for note in result.notes)


def test_torchrun_geometry_mismatch_names_both_numbers() -> None:
    error = refusal(torchelastic(4, 2, 2), devices=4, num_nodes=2)
    assert error.code == "cluster-mismatch"
    assert "LOCAL_WORLD_SIZE=2" in error.reason and "places 4 per node" in error.reason
    assert error.choices == ("2",)
    nodes = refusal(torchelastic(8, 4, 2), devices=4, num_nodes=1)
    assert nodes.flag == "num_nodes" and "GROUP_WORLD_SIZE=2" in nodes.reason


def test_torchelastic_world_size_only() -> None:
    env = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "6"}
    error = refusal(Machine(cuda_devices=4, environ=env), devices=4, num_nodes=2)
    assert "WORLD_SIZE=6" in error.reason and "makes 8" in error.reason
    assert error.choices == ("3",)


@pytest.mark.parametrize("per_node", ["4", "4(x2)", None])
def test_slurm(per_node: str | None) -> None:
    result = plan(devices=4, num_nodes=2, machine=slurm(8, per_node, 2))
    assert (result.cluster_environment, result.launcher) == ("slurm", "external")


def test_slurm_mismatch_names_both_numbers() -> None:
    error = refusal(slurm(8, "4", 2), devices=2, num_nodes=2)
    assert error.code == "cluster-mismatch"
    assert "SLURM_NTASKS_PER_NODE=4" in error.reason and "places 2" in error.reason


def test_slurm_single_task_and_interactive_are_local_with_a_note() -> None:
    # a one-task srun step, and salloc's shell (no srun step) in an interactive allocation
    for machine in (slurm(1, "1", 1), slurm(4, "4", 1, job_name="interactive", step=False)):
        result = plan(devices=2, machine=machine)
        assert (result.cluster_environment, result.launcher) == ("local", "subprocess")
        assert any("SLURM" in note for note in result.notes)


def test_kubeflow_runs_one_process_per_pod() -> None:
    env = {"KUBERNETES_PORT": "x", "MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "2",
           "RANK": "0"}
    error = refusal(Machine(cuda_devices=2, environ=env), devices=2)
    assert error.code == "cluster-mismatch" and "one process per node" in error.reason


def test_mpi_needs_more_than_one_process() -> None:
    single = Machine(environ={"PMI_SIZE": "1"})
    assert plan(machine=single).cluster_environment == "local"
    pmi = Machine(environ={"PMI_SIZE": "2"})
    assert plan(devices=2, machine=pmi).cluster_environment == "mpi"


# --------------------------------------------------------------------------- the Plan


def test_plan_is_deterministic_and_frozen() -> None:
    first = plan(devices=-1, strategy="fsdp", precision="bf16-mixed", machine=EIGHT_GPUS)
    second = plan(devices=-1, strategy="fsdp", precision="bf16-mixed", machine=EIGHT_GPUS)
    assert first == second
    with pytest.raises(AttributeError):
        first.strategy = "ddp"  # type: ignore[misc]


def test_explain_lists_every_rule_and_note() -> None:
    result = plan(precision=16, devices=2, machine=CPU)
    text = result.explain()
    for step in result.trace:
        assert step.rule in text
    assert "legacy alias" in text and "world size 2" in text


def test_to_dict_is_json_ready() -> None:
    import json

    data = plan(devices=2, machine=CPU).to_dict()
    assert json.loads(json.dumps(data))["parallel_devices"] == ["cpu", "cpu"]


# --------------------------------------------------------------------------- errors


def test_error_carries_fields_trace_and_survives_pickling() -> None:
    error = refusal(CPU, strategy="ddp_spwan")
    assert isinstance(error, ValueError)
    assert (error.code, error.flag, error.value) == ("unknown-strategy", "strategy", "ddp_spwan")
    assert error.rule == "flags/strategy-unknown"
    assert [s.rule for s in error.trace][:2] == ["flags/accelerator-name", "flags/devices-auto"]
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.choices == error.choices
    assert "[unknown-strategy] strategy='ddp_spwan'" in str(error)
    assert error.to_dict()["suggestion"] == "ddp_spawn"


def test_num_nodes_must_be_a_real_int() -> None:
    for junk in (True, 1.0, "2", 0, -1):
        assert untyped_refusal(CPU, num_nodes=junk).code == "invalid-num-nodes"


# --------------------------------------------------------------------------- memo


def test_memo_returns_the_same_plan_and_never_conflates_types() -> None:
    from interlock.engine.planner import clear_cache

    clear_cache()
    first = plan(devices=1, precision=16, machine=EIGHT_GPUS)
    assert plan(devices=1, precision=16, machine=EIGHT_GPUS) is first
    # equal in Python, different flags here
    assert untyped_refusal(EIGHT_GPUS, devices=True).code == "invalid-devices"
    assert untyped_refusal(EIGHT_GPUS, devices=1.0).code == "invalid-devices"
    assert untyped_refusal(EIGHT_GPUS, devices=1, precision=16.0).code == "unknown-precision"
    assert plan(devices=[1], machine=EIGHT_GPUS).parallel_devices == ("cuda:1",)
    assert plan(devices=(1,), machine=EIGHT_GPUS).parallel_devices == ("cuda:1",)
    # an equal machine built separately hits the memo too
    assert plan(devices=1, precision=16, machine=Machine(cuda_devices=8)) is first


def test_memo_follows_the_registry() -> None:
    import dataclasses


    spec = dataclasses.replace(registered(StrategySpec)["ddp"], name="ddp_memo_probe",
                               factory="x.y:Z", variant_of=None)
    register(spec)
    try:
        assert plan(strategy="ddp_memo_probe", devices=2, machine=CPU).strategy == (
            "ddp_memo_probe")
    finally:
        unregister(StrategySpec, "ddp_memo_probe")
    assert refusal(CPU, strategy="ddp_memo_probe", devices=2).code == "unknown-strategy"


def test_memo_is_bounded() -> None:
    from interlock.engine.planner import _MEMO, MEMO_SIZE, clear_cache

    clear_cache()
    for n in range(1, MEMO_SIZE + 50):
        plan(accelerator="cpu", devices=n, machine=CPU)
    assert len(_MEMO) == MEMO_SIZE
