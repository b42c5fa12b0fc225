"""The precision plugins, with real torch on the CPU: dtypes, scaler, contexts, factory."""

from __future__ import annotations

import importlib.util
import io
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import interlock
from interlock.engine.tables import NUMERIC_PRECISIONS, PRECISION_NAMES, PRECISION_ROWS
from interlock.strategies.precision import (
    DoublePrecision,
    HalfPrecision,
    MissingPackageError,
    MixedPrecision,
    Precision,
    TransformerEnginePrecision,
    apply_to_tensors,
    precision_for,
)

NUMERIC = sorted(NUMERIC_PRECISIONS)
HAS_TE = importlib.util.find_spec("transformer_engine") is not None


def dtype_of(name: str) -> torch.dtype:
    """A dtype spelled as in the tables (``"bfloat16"``) as a torch dtype."""
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), f"{name!r} is not a torch dtype"
    return dtype


def expect_dtype(what: str, actual: torch.dtype, expected: torch.dtype) -> None:
    assert actual == expected, f"{what}: got {actual}, expected {expected}"


def params_of(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def mixed16(init_scale: float = 256.0) -> MixedPrecision:
    """16-mixed on the CPU with a small power-of-two scale, so fp16 grads cannot overflow."""
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return MixedPrecision("16-mixed", "cpu", scaler=scaler)


@pytest.fixture(autouse=True)
def default_dtype_is_float32() -> Iterator[None]:
    """Every test starts and must end with float32 as torch's default dtype."""
    assert torch.get_default_dtype() == torch.float32, "a previous test leaked a default dtype"
    yield
    leaked = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    assert leaked == torch.float32, f"the test left torch's default dtype at {leaked}"


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("name", NUMERIC)
def test_dtypes_through_a_training_step(name: str) -> None:
    """Parameter, activation, gradient and output dtypes follow the precision's table row."""
    row = PRECISION_ROWS[name]
    plugin = precision_for(name, "cpu")
    torch.manual_seed(0)
    module = plugin.convert_module(nn.Linear(8, 4))
    for pname, param in module.named_parameters():
        expect_dtype(f"{name}: {pname} after convert_module", param.dtype,
                     dtype_of(row.param_dtype))

    batch = plugin.convert_input(torch.randn(3, 8))
    with plugin.forward_context():
        activation = module(batch)
    expect_dtype(f"{name}: Linear output inside forward_context", activation.dtype,
                 dtype_of(row.compute_dtype))

    output = plugin.convert_output(activation)
    expect_dtype(f"{name}: output after convert_output", output.dtype,
                 torch.float32 if row.output_dtype == "default" else dtype_of(row.output_dtype))

    plugin.backward(output.sum(), module)
    for pname, param in module.named_parameters():
        assert param.grad is not None, f"{name}: {pname} has no gradient after backward"
        expect_dtype(f"{name}: {pname}.grad after backward", param.grad.dtype,
                     dtype_of(row.param_dtype))


def test_16_mixed_on_cpu_really_computes_in_float16() -> None:
    """16-mixed on the CPU is float16 autocast with a CPU scaler, not bfloat16 in disguise."""
    plugin = precision_for("16-mixed", "cpu")
    assert isinstance(plugin, MixedPrecision)
    assert plugin.scaler is not None, "16-mixed on cpu has no gradient scaler"
    assert plugin.scaler.is_enabled(), "16-mixed on cpu built a disabled gradient scaler"
    with plugin.forward_context():
        out = nn.Linear(4, 4)(torch.randn(2, 4))
        product = torch.randn(3, 3) @ torch.randn(3, 3)
    expect_dtype("16-mixed Linear output on cpu", out.dtype, torch.float16)
    expect_dtype("16-mixed matmul output on cpu", product.dtype, torch.float16)


def test_bf16_mixed_has_no_scaler() -> None:
    plugin = precision_for("bf16-mixed", "cpu")
    assert isinstance(plugin, MixedPrecision)
    assert plugin.scaler is None, "bf16-mixed got a gradient scaler"
    assert plugin.state_dict() == {}, f"bf16-mixed state_dict is {plugin.state_dict()}"


class Pair(NamedTuple):
    x: torch.Tensor
    label: str


def test_convert_input_casts_nested_floating_tensors_only() -> None:
    plugin = HalfPrecision("bf16-true")
    batch: dict[str, Any] = {
        "images": [torch.zeros(2), (torch.ones(1), torch.arange(3))],
        "pair": Pair(torch.zeros(1, dtype=torch.float64), "cat"),
        "ordered": OrderedDict(a=torch.zeros(1)),
        "count": 7,
    }
    out = plugin.convert_input(batch)
    expect_dtype("list item", out["images"][0].dtype, torch.bfloat16)
    expect_dtype("tuple item", out["images"][1][0].dtype, torch.bfloat16)
    expect_dtype("integer tensor (left alone)", out["images"][1][1].dtype, torch.int64)
    assert isinstance(out["images"][1], tuple), "a tuple came back as another container"
    assert isinstance(out["pair"], Pair), "a named tuple came back as another container"
    expect_dtype("named tuple field", out["pair"].x.dtype, torch.bfloat16)
    assert out["pair"].label == "cat" and out["count"] == 7, "non-tensors were changed"
    assert isinstance(out["ordered"], OrderedDict), "an OrderedDict came back as a dict"
    expect_dtype("OrderedDict value", out["ordered"]["a"].dtype, torch.bfloat16)
    expect_dtype("the caller's original tensor", batch["images"][0].dtype, torch.float32)


def test_apply_to_tensors_leaves_non_tensors_alone() -> None:
    assert apply_to_tensors("text", torch.neg) == "text"
    assert apply_to_tensors(None, torch.neg) is None
    result = apply_to_tensors([torch.tensor(1.0), 2.0], torch.neg)
    assert result[0].item() == -1.0 and result[1] == 2.0, f"got {result}"


# --------------------------------------------------------------------------- scaler


def test_16_mixed_skips_a_step_with_an_inf_gradient_then_takes_the_next() -> None:
    plugin = mixed16()
    assert plugin.scaler is not None
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)

    def backward(poison: bool) -> None:
        optimizer.zero_grad()
        with plugin.forward_context():
            out = module(torch.randn(3, 4))
        plugin.backward(plugin.convert_output(out).sum(), module)
        if poison:
            assert module.weight.grad is not None
            module.weight.grad[0, 0] = float("inf")

    before, scale = params_of(module), plugin.scaler.get_scale()
    backward(poison=True)
    plugin.optimizer_step(optimizer)
    assert same(before, params_of(module)), "a step with an inf gradient changed the parameters"
    plugin.update_scale()  # the scale moves once per iteration (also done by backward)
    assert plugin.scaler.get_scale() < scale, (
        f"the scale stayed at {plugin.scaler.get_scale()} after an inf gradient (was {scale})"
    )

    backward(poison=False)
    plugin.optimizer_step(optimizer)
    assert not same(before, params_of(module)), "a finite step left the parameters unchanged"


def test_16_mixed_scaler_state_round_trips_through_a_checkpoint() -> None:
    plugin = mixed16(init_scale=1024.0)
    assert plugin.scaler is not None
    module = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    plugin.backward(module(torch.ones(1, 2)).sum(), module)
    assert module.weight.grad is not None
    module.weight.grad.fill_(float("nan"))
    plugin.optimizer_step(optimizer)  # skipped; the scale backs off to 512
    saved = plugin.state_dict()

    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)

    fresh = precision_for("16-mixed", "cpu")
    assert isinstance(fresh, MixedPrecision) and fresh.scaler is not None
    fresh.load_state_dict(loaded)
    assert fresh.scaler.get_scale() == 512.0, (
        f"scale after load_state_dict is {fresh.scaler.get_scale()}, expected 512.0"
    )
    assert fresh.state_dict() == saved, f"{fresh.state_dict()} != saved {saved}"


def test_16_mixed_trains_on_after_a_state_is_loaded_mid_iteration() -> None:
    """A checkpoint loaded right after an optimizer step (a rollback, a resume in the
    same process): the next iteration steps and clips that optimizer again, where
    torch's scaler, still remembering the step, would refuse."""
    plugin = mixed16(init_scale=1024.0)
    module = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    plugin.backward(module(torch.ones(1, 2)).sum(), module)
    plugin.optimizer_step(optimizer)
    saved = plugin.state_dict()
    plugin.backward(module(torch.ones(1, 2)).sum(), module)
    plugin.optimizer_step(optimizer)
    plugin.load_state_dict(saved)  # mid-iteration: the step's update is pending
    plugin.backward(module(torch.ones(1, 2)).sum(), module)
    plugin.unscale_gradients(optimizer)
    plugin.optimizer_step(optimizer)
    assert plugin.scaler is not None and plugin.scaler.get_scale() == 1024.0


def test_16_mixed_unscale_then_clip_unscales_exactly_once() -> None:
    scale = 256.0
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    batch = torch.randn(3, 4)

    # reference: the same autocast forward, no scaler
    with torch.autocast("cpu", dtype=torch.float16):
        out = module(batch)
    out.float().sum().backward()
    true_grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    module.zero_grad()

    plugin = mixed16(init_scale=scale)
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    with plugin.forward_context():
        out = module(batch)
    plugin.backward(plugin.convert_output(out).sum(), module)
    scaled = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    torch.testing.assert_close(scaled, [g * scale for g in true_grads],
                               msg=lambda m: f"gradients are not the loss scale times the "
                                             f"unscaled ones:\n{m}")

    plugin.unscale_gradients(optimizer)
    plugin.unscale_gradients(optimizer)  # a second call before the step does nothing
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    torch.testing.assert_close(grads, true_grads,
                               msg=lambda m: f"gradients after unscale_gradients:\n{m}")

    max_norm = 0.5
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    assert norm > max_norm, f"the test needs a gradient norm above {max_norm}, got {norm}"
    clipped = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    before = params_of(module)
    plugin.optimizer_step(optimizer)
    after = params_of(module)
    # SGD with lr=1: the update is exactly the clipped gradient, not clipped / scale
    torch.testing.assert_close([b - a for b, a in zip(before, after, strict=True)], clipped,
                               msg=lambda m: f"the step did not use the clipped, once-unscaled "
                                             f"gradients:\n{m}")
    assert plugin.scaler is not None
    assert plugin.scaler.get_scale() == scale, (
        f"a finite step changed the scale from {scale} to {plugin.scaler.get_scale()}"
    )


def test_16_mixed_two_optimizers_are_each_unscaled_once() -> None:
    """Clipping both optimizers, then stepping both, must not unscale the second twice."""
    scale = 256.0
    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 1)
    batch = torch.randn(3, 4)
    second(first(batch)).sum().backward()
    true_grads = [p.grad.clone() for p in second.parameters() if p.grad is not None]
    first.zero_grad()
    second.zero_grad()

    plugin = mixed16(init_scale=scale)
    opt1 = torch.optim.SGD(first.parameters(), lr=1.0)
    opt2 = torch.optim.SGD(second.parameters(), lr=1.0)
    plugin.backward(second(first(batch)).sum(), None)
    plugin.unscale_gradients(opt1)
    plugin.unscale_gradients(opt2)
    plugin.optimizer_step(opt1)
    before = params_of(second)
    plugin.optimizer_step(opt2)
    steps = [b - a for b, a in zip(before, params_of(second), strict=True)]
    torch.testing.assert_close(steps, true_grads, msg=lambda m: f"the second optimizer's "
                               f"step was not its once-unscaled gradient:\n{m}")


def test_optimizer_step_returns_the_step_result() -> None:
    module = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        return torch.tensor(3.0)

    for plugin in (Precision(), DoublePrecision(), MixedPrecision("bf16-mixed", "cpu")):
        module.weight.grad = torch.zeros_like(module.weight)
        result = plugin.optimizer_step(optimizer, closure=closure)
        assert isinstance(result, torch.Tensor) and result.item() == 3.0, (
            f"{plugin.precision}: optimizer_step returned {result!r}, not the closure's loss"
        )


# --------------------------------------------------------------------------- init contexts


@pytest.mark.parametrize("name", NUMERIC)
def test_init_contexts_give_the_parameter_dtype_and_restore_the_default(name: str) -> None:
    expected = dtype_of(PRECISION_ROWS[name].param_dtype)
    plugin = precision_for(name, "cpu")
    with plugin.tensor_init_context():
        expect_dtype(f"{name}: torch.empty inside tensor_init_context", torch.empty(1).dtype,
                     expected)
    expect_dtype(f"{name}: default dtype after tensor_init_context",
                 torch.get_default_dtype(), torch.float32)
    with plugin.module_init_context():
        layer = nn.Linear(2, 2)
    expect_dtype(f"{name}: Linear weight built in module_init_context", layer.weight.dtype,
                 expected)
    expect_dtype(f"{name}: default dtype after module_init_context",
                 torch.get_default_dtype(), torch.float32)


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("context", ["tensor_init_context", "module_init_context",
                                     "forward_context"])
def test_contexts_restore_the_default_dtype_when_the_body_raises(name: str, context: str) -> None:
    plugin = precision_for(name, "cpu")
    with pytest.raises(RuntimeError, match="boom"), getattr(plugin, context)():
        raise RuntimeError("boom")
    expect_dtype(f"{name}: default dtype after {context} raised", torch.get_default_dtype(),
                 torch.float32)


# --------------------------------------------------------------------------- factory


@pytest.mark.parametrize("name", PRECISION_NAMES)
def test_precision_for_covers_every_canonical_name(name: str) -> None:
    if PRECISION_ROWS[name].requires and not HAS_TE:
        with pytest.raises(MissingPackageError, match=r"pip install transformer_engine\[pytorch\]"):
            precision_for(name, "cuda")
        return
    device_type = "cpu" if name in NUMERIC_PRECISIONS else "cuda"
    plugin = precision_for(name, device_type)
    assert plugin.precision == name, f"precision_for({name!r}) built a {plugin.precision!r} plugin"


def test_transformer_engine_missing_is_an_import_error_with_the_hint() -> None:
    if HAS_TE:
        pytest.skip("transformer_engine is installed here")
    with pytest.raises(ImportError) as info:
        TransformerEnginePrecision("transformer-engine-float16")
    message = str(info.value)
    assert "transformer-engine-float16" in message, f"the precision is not named: {message}"
    assert "pip install transformer_engine[pytorch]" in message, f"no install hint: {message}"


@pytest.mark.parametrize(
    ("make", "accepted"),
    [
        (lambda: precision_for("fp8", "cpu"), "'bf16-mixed'"),
        (lambda: precision_for("16", "cpu"), "'16-mixed'"),
        (lambda: precision_for("32-true", "tpu"), "'xla'"),
        (lambda: HalfPrecision("16-mixed"), "'16-true', 'bf16-true'"),
        (lambda: MixedPrecision("16-true", "cpu"), "'16-mixed', 'bf16-mixed'"),
        (lambda: MixedPrecision("16-mixed", "xla"), "'cpu', 'cuda', 'mps'"),
        (lambda: TransformerEnginePrecision("fp8"), "'transformer-engine'"),
    ],
    ids=["unknown-name", "legacy-alias", "unknown-device", "half", "mixed", "mixed-device",
         "te"],
)
def test_unknown_values_are_refused_naming_the_accepted_ones(make: Any, accepted: str) -> None:
    with pytest.raises(ValueError) as info:
        make()
    assert accepted in str(info.value), f"{accepted} missing from the error: {info.value}"


def test_a_scaler_with_bf16_mixed_is_refused() -> None:
    with pytest.raises(ValueError, match="bf16-mixed"):
        MixedPrecision("bf16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))


@pytest.mark.parametrize("name", NUMERIC)
def test_the_engine_accepts_each_plugin(name: str) -> None:
    plugin = precision_for(name, "cpu")
    assert plugin.precision in PRECISION_NAMES, f"{plugin.precision!r} is not canonical"
    assert plugin.interlock_part_kind == "precision"
    chosen = interlock.plan(plugins=[plugin], machine=interlock.Machine())
    assert chosen.precision == name, (
        f"plan(plugins=[{type(plugin).__name__}({name!r})]) chose precision "
        f"{chosen.precision!r}"
    )


def test_the_fsdp_loss_scaler_unscales_and_flags_infinite_gradients_per_device() -> None:
    """FSDP's 16-mixed scaler unscales gradients itself (with a blocking copy of the
    inverse scale to another device, for CPU offload): finite gradients are multiplied
    by the inverse scale, and a non-finite one raises its device's flag."""
    from interlock.strategies.precision.fsdp import FSDPPrecision

    scaler = FSDPPrecision("16-mixed", "cpu").scaler
    assert scaler is not None
    a = nn.Parameter(torch.ones(3))
    b = nn.Parameter(torch.ones(2, dtype=torch.float16))
    a.grad = torch.tensor([2.0, 4.0, 8.0])
    b.grad = torch.tensor([6.0, 10.0], dtype=torch.float16)
    opt = torch.optim.SGD([a, b], lr=0.1)
    flags = scaler._unscale_grads_(opt, torch.tensor([0.5]), torch.zeros(1), True)
    assert a.grad.tolist() == [1.0, 2.0, 4.0] and b.grad.tolist() == [3.0, 5.0]
    assert list(flags) == [torch.device("cpu")] and flags[torch.device("cpu")].item() == 0.0
    a.grad = torch.tensor([1.0, float("inf"), 1.0])
    flags = scaler._unscale_grads_(opt, torch.tensor([0.5]), torch.zeros(1), True)
    assert flags[torch.device("cpu")].item() == 1.0
    none = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    assert list(scaler._unscale_grads_(none, torch.tensor([0.5]), torch.zeros(1), True)) == [
        torch.device("cpu")]
