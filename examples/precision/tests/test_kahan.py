"""On a long run of small updates the compensated precision tracks a float32 run far
better than ``bf16-true``, whose updates round away (numbers in the README)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from interlock_bf16_kahan import PRECISION
from interlock_bf16_kahan.precision import COMPENSATION, KahanBF16Precision
from torch import nn

import interlock
from interlock import Machine

STEPS = 1000
LR = 1e-3


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    """The row, registered by hand when the package is on the path but not installed
    (installed, its entry point has registered it already)."""
    added = PRECISION.name not in interlock.registered(interlock.PrecisionRow)
    if added:
        interlock.register(PRECISION)
    try:
        yield
    finally:
        if added:
            interlock.unregister(interlock.PrecisionRow, PRECISION.name)


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, 16, generator=g)
    return x, x @ torch.linspace(-1, 1, 16).unsqueeze(1) + 0.5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(16, 1)


def train(precision: str | None) -> dict[str, torch.Tensor]:
    """``STEPS`` SGD steps of a linear regression; ``None``: plain float32."""
    net = _model()
    opt: torch.optim.Optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    if precision is None:
        for step in range(STEPS):
            x, y = _data(step)
            nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
        return {k: v.detach().float() for k, v in net.state_dict().items()}
    strategy = interlock.resolve(accelerator="cpu", strategy="single_device",
                                 precision=precision, machine=Machine())
    strategy.setup_environment()
    module, [opt] = strategy.setup_module_and_optimizers(net, [opt])
    for step in range(STEPS):
        x, y = strategy.batch_to_device(_data(step))
        strategy.backward(nn.functional.mse_loss(module(x).float(), y), module)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    strategy.teardown()
    return {k: v.detach().float() for k, v in module.state_dict().items()}


def _error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k] - want[k]).abs().max()) for k in want)


def test_it_is_built_from_its_row() -> None:
    strategy = interlock.resolve(accelerator="cpu", strategy="single_device",
                                 precision=PRECISION.name, machine=Machine())
    assert type(strategy.precision) is KahanBF16Precision


def test_tiny_updates_accumulate_where_bf16_true_loses_them() -> None:
    """A constant update of 1e-4 on a weight of 1.0 is below bf16's half ulp (2**-8)."""
    for precision, want in (("bf16-true", 1.0), (PRECISION.name, 0.9)):
        weight = nn.Parameter(torch.ones(4))
        strategy = interlock.resolve(accelerator="cpu", strategy="single_device",
                                     precision=precision, machine=Machine())
        holder = nn.Module()
        holder.weight = weight
        module, [opt] = strategy.setup_module_and_optimizers(
            holder, [torch.optim.SGD(holder.parameters(), lr=1e-4)])
        param = next(module.parameters())
        for _ in range(1000):
            param.grad = torch.ones_like(param)
            strategy.optimizer_step(opt)
        assert param.dtype == torch.bfloat16
        stored = param.detach().float()
        # what the compensated parameter stands for: the bf16 weight plus what rounding
        # held back (bf16-true keeps no compensation)
        carried = opt.state[param].get(COMPENSATION, torch.zeros_like(param)).float()
        got = float((stored + carried).mean())
        print(f"{precision}: weight {float(stored.mean())}, with compensation {got}")
        assert abs(got - want) < 1e-3, f"{precision}: the weight is {got}, expected {want}"
        # the weight the model computes with is the bf16 value nearest to that
        # (bf16's ulp is 2**-8 just below 1.0)
        assert abs(float(stored.mean()) - got) <= 2**-9


def test_a_long_run_tracks_float32_far_better_than_bf16_true() -> None:
    want = train(None)
    plain = _error(train("bf16-true"), want)
    compensated = _error(train(PRECISION.name), want)
    print(f"max |w - w_float32| after {STEPS} steps: bf16-true {plain:.3e}, "
          f"{PRECISION.name} {compensated:.3e}")
    assert compensated * 10 < plain, (
        f"{PRECISION.name} is {compensated:.3e} from the float32 run and bf16-true "
        f"{plain:.3e}: the compensation should make it at least 10x closer")


def test_the_compensation_lives_in_the_optimizer_state_in_bfloat16() -> None:
    strategy = interlock.resolve(accelerator="cpu", strategy="single_device",
                                 precision=PRECISION.name, machine=Machine())
    net = _model()
    module, [opt] = strategy.setup_module_and_optimizers(
        net, [torch.optim.Adam(net.parameters(), lr=1e-3)])
    x, y = _data(0)
    strategy.backward(nn.functional.mse_loss(module(x).float(), y), module)
    strategy.optimizer_step(opt)
    for param in module.parameters():
        state = opt.state[param]
        assert param.dtype == torch.bfloat16
        assert param.grad is not None and param.grad.dtype == torch.bfloat16
        assert state[COMPENSATION].dtype == torch.bfloat16
        assert state["exp_avg"].dtype == torch.bfloat16, "Adam's state left in float32"
    restored = torch.optim.Adam(_model().parameters(), lr=1e-3)
    restored.load_state_dict(opt.state_dict())
    assert any(COMPENSATION in s for s in restored.state.values())


def test_a_closure_is_refused() -> None:
    precision = KahanBF16Precision()
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(ValueError, match="closure"):
        precision.optimizer_step(opt, closure=lambda: 0.0)
