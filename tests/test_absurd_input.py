"""Absurd numbers are refused at once, by the bound they break, before anything is
enumerated; and 'auto' adapts to a one-device strategy instead of refusing."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from typeguard import suppress_type_checks

from interlock import Machine, ResolutionError, plan, resolve
from interlock.cli import main
from interlock.engine.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_DEVICES_TEXT,
    MAX_NUM_NODES,
    MAX_WORLD_SIZE,
    short_repr,
)
from machines import CPU, EIGHT_GPUS, EIGHT_GPUS_NOTEBOOK, TPU, torchelastic
from plugins import StandInStrategy

MAX = MAX_DEVICES_PER_NODE
MACHINES = {"cpu": CPU, "cuda-8": EIGHT_GPUS, "tpu-8": TPU}

#: devices values beyond the bound on devices per node: name -> value
ABSURD_DEVICES: dict[str, Any] = {
    "2**62": 2**62,
    "10**100": 10**100,
    "10**5000": 10**5000,
    "bound+1": MAX + 1,
    "str bound+1": str(MAX + 1),
    "5000 digits": "1" * 5000,
    "padded 5000 digits": "  " + "9" * 5000 + " ",
    "100000000": "100000000",
    "id 10**100": [10**100],
    "id bound": [MAX],
    "id string bound": f"0,{MAX}",
    "id of 5000 digits": "0," + "1" * 5000,
    "10**6 ids": list(range(10**6)),
    "10**6 zeros": [0] * 10**6,
    "bound+1 ids": tuple(range(MAX + 1)),
    "10**6 ids as text": ",".join(map(str, range(10**6))),
    "bound+1 ids as text": ",".join(map(str, range(MAX + 1))) + ",",
    "text longer than any value": " " * (MAX_DEVICES_TEXT + 1) + "1",
}


def _refusal(**flags: Any) -> ResolutionError:
    with pytest.raises(ResolutionError) as info:
        plan(**flags)
    return info.value


def _assert_short(error: ResolutionError) -> None:
    assert len(str(error)) < 1000, f"message of {len(str(error))} characters"
    json.dumps(error.to_dict())  # an absurd value still makes valid JSON


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("name", sorted(ABSURD_DEVICES))
def test_absurd_devices_are_refused_before_any_device_is_placed(name: str,
                                                                machine: str) -> None:
    error = _refusal(devices=ABSURD_DEVICES[name], machine=MACHINES[machine])
    assert (error.code, error.flag, error.rule) == (
        "invalid-devices", "devices", "flags/devices-beyond-limit"), str(error)
    # the refusal comes from parsing the flag: no stage that places devices ran
    assert {step.stage for step in error.trace} <= {"flags"}, error.trace
    assert str(MAX) in error.reason or str(MAX - 1) in error.reason \
        or str(MAX_DEVICES_TEXT) in error.reason, error.reason
    _assert_short(error)


@pytest.mark.parametrize("name", ["10**6 ids", "10**6 ids as text", "10**5000",
                                  "text longer than any value"])
def test_absurd_devices_cost_no_memory(name: str) -> None:
    value = ABSURD_DEVICES[name]
    plan(machine=CPU)  # the registry and entry points load on the first call
    tracemalloc.start()
    try:
        with pytest.raises(ResolutionError):
            plan(devices=value, machine=EIGHT_GPUS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"refusing {name} allocated {peak} bytes at the peak"


@pytest.mark.parametrize("value, said", [(0, "got 0."), (-3, "got -3."), (1.5, "got a float."),
                                         ("2", "got a str."), (True, "got a bool.")])
def test_an_invalid_num_nodes_is_named_by_its_value_or_its_type(value: object,
                                                                 said: str) -> None:
    with suppress_type_checks():  # the wrong types are the point
        error = _refusal(num_nodes=value, machine=CPU)
    assert (error.code, error.rule) == ("invalid-num-nodes", "flags/num-nodes-invalid")
    assert error.reason.endswith(said), error.reason


@pytest.mark.parametrize("value", [MAX_NUM_NODES + 1, 2**62, 10**100, 10**5000],
                         ids=["bound+1", "2**62", "10**100", "10**5000"])
def test_absurd_num_nodes_are_refused_when_parsed(value: int) -> None:
    error = _refusal(num_nodes=value, machine=CPU)
    assert (error.code, error.flag, error.rule) == (
        "invalid-num-nodes", "num_nodes", "flags/num-nodes-beyond-limit"), str(error)
    assert str(MAX_NUM_NODES) in error.reason
    assert {step.stage for step in error.trace} <= {"flags"}
    _assert_short(error)


def test_the_bounds_themselves_are_accepted() -> None:
    assert plan(accelerator="cpu", devices=MAX, machine=CPU).world_size == MAX
    big = Machine(cuda_devices=MAX)
    assert plan(devices=-1, machine=big).devices == MAX
    assert plan(devices=[MAX - 1], machine=big).parallel_devices == (f"cuda:{MAX - 1}",)
    assert plan(devices=",".join(map(str, range(MAX))), machine=big).devices == MAX
    assert plan(num_nodes=MAX_NUM_NODES, machine=CPU).world_size == MAX_NUM_NODES
    per_node = MAX_WORLD_SIZE // MAX_NUM_NODES
    assert plan(devices=per_node, num_nodes=MAX_NUM_NODES, machine=CPU).world_size \
        == MAX_WORLD_SIZE
    # leading zeros do not make a count absurd
    assert plan(accelerator="cpu", devices="0" * 5000 + "2", machine=CPU).devices == 2


def test_a_world_size_beyond_the_bound_is_refused() -> None:
    error = _refusal(devices=MAX, num_nodes=MAX, machine=CPU)
    assert (error.code, error.flag, error.rule) == (
        "invalid-num-nodes", "num_nodes", "devices/world-size-beyond-limit"), str(error)
    assert str(MAX_WORLD_SIZE) in error.reason
    assert error.choices == (str(MAX_WORLD_SIZE // MAX),)


def test_a_strategy_instance_cannot_bring_absurd_parts() -> None:
    error = _refusal(strategy=StandInStrategy("ddp", devices=("cpu",) * (MAX + 1)),
                     machine=CPU)
    assert (error.code, error.rule) == ("invalid-devices", "devices/per-node-beyond-limit")
    error = _refusal(strategy=StandInStrategy("ddp", num_nodes=10**100), machine=CPU)
    assert (error.code, error.rule) == ("invalid-num-nodes", "devices/world-size-beyond-limit")
    _assert_short(error)
    # an absurd device index is read without converting it, and is not on the machine
    error = _refusal(strategy=StandInStrategy("ddp", devices=("cuda:" + "1" * 5000,)),
                     machine=EIGHT_GPUS)
    assert error.code == "devices-unavailable", str(error)


@pytest.mark.parametrize("field", ["cuda_devices", "xla_devices"])
@pytest.mark.parametrize("value", [MAX + 1, 10**9, 10**5000],
                         ids=["bound+1", "10**9", "10**5000"])
def test_machine_refuses_absurd_device_counts(field: str, value: int) -> None:
    counts: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=f"Machine.{field} must be at most {MAX}") as info:
        Machine(**counts)
    assert len(str(info.value)) < 300
    counts[field] = MAX
    assert getattr(Machine(**counts), field) == MAX


def test_other_refusals_quote_absurd_values_briefly() -> None:
    error = _refusal(precision=10**5000, machine=CPU)
    assert error.code == "unknown-precision"
    _assert_short(error)
    assert short_repr(list(range(10**6))).endswith("(length 1000000)")
    assert short_repr("auto") == "'auto'" and short_repr([0, 1]) == "[0, 1]"


@pytest.mark.parametrize("bad", ["cuda", {}, {"cuda_devices": 8}, 8])
@pytest.mark.parametrize("function", [plan, resolve])
def test_machine_must_be_a_machine(function: Any, bad: object) -> None:
    name = function.__name__
    with suppress_type_checks(), pytest.raises(TypeError) as info:
        function(machine=bad)
    assert str(info.value).startswith(
        f"{name}(): `machine` must be an interlock.Machine or None, got {type(bad).__name__}"
    ), str(info.value)


@pytest.mark.parametrize("spec", ["cuda=99999999999999999999999", "xla=4097",
                                  "cuda=" + "9" * 6000], ids=["23 digits", "xla", "6000 digits"])
def test_cli_simulate_refuses_absurd_counts(spec: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--simulate", spec, "--devices", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --simulate "), err
    assert f"at most {MAX} devices" in err and len(err) < 500, err


def test_cli_refuses_absurd_devices_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--simulate", "cpu", "--accelerator", "cpu", "--devices",
                 "100000000"])
    assert code == 2
    assert "[invalid-devices]" in capsys.readouterr().err


# --------------------------------------------------------------------------- auto


def test_auto_devices_fit_a_one_device_strategy() -> None:
    result = plan(strategy="single_device", machine=EIGHT_GPUS)
    assert (result.strategy, result.parallel_devices, result.world_size) == (
        "single_device", ("cuda:0",), 1)
    assert any("devices='auto' uses cuda:0 of the 8" in note for note in result.notes), \
        result.notes
    assert "strategy/auto-devices-capped" in [step.rule for step in result.trace]

    result = plan(strategy="single_xla", machine=TPU)
    assert (result.strategy, result.parallel_devices) == ("single_xla", ("xla:0",))
    assert any("single_xla" in note for note in result.notes), result.notes


@pytest.mark.parametrize("devices", [8, -1, "-1", [0, 1]])
def test_devices_written_by_the_user_are_never_cut(devices: Any) -> None:
    error = _refusal(strategy="single_device", devices=devices, machine=EIGHT_GPUS)
    assert (error.code, error.rule) == ("invalid-devices", "strategy/too-many-devices")


def test_auto_devices_fitted_still_pass_the_other_checks() -> None:
    error = _refusal(strategy="single_device", num_nodes=2, machine=EIGHT_GPUS)
    assert error.code == "unsupported-multi-node", str(error)


def test_processes_a_cluster_created_are_not_cut() -> None:
    # torchrun started 8 processes on this node: one-device strategies cannot use them
    error = _refusal(strategy="single_device", machine=torchelastic(8, 8, 1))
    assert (error.code, error.rule) == ("invalid-devices", "strategy/too-many-devices")


def test_auto_devices_in_a_notebook_are_unchanged() -> None:
    result = plan(strategy="single_device", machine=EIGHT_GPUS_NOTEBOOK)
    assert result.parallel_devices == ("cuda:0",)
    assert "strategy/devices-as-placed" in [step.rule for step in result.trace]


@pytest.mark.parametrize("value", ["x" * 10**6, "spawn" * 200_000, 10**5000, b"fork"],
                         ids=["10**6 chars", "a name 200,000 times", "10**5000", "bytes"])
def test_an_absurd_launcher_is_refused_briefly(value: object) -> None:
    with suppress_type_checks():
        error = _refusal(strategy="ddp", devices=2, accelerator="cpu", launcher=value,
                         machine=CPU)
    assert (error.code, error.flag) == ("unknown-launcher", "launcher")
    _assert_short(error)
