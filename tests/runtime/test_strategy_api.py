"""The Strategy API in one process: init contexts, clipping, batches, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import interlock
from interlock import Machine
from interlock.strategies.base import Strategy
from interlock.strategies.io import CheckpointLoadError

CPU = Machine()


def single(precision: str = "32-true") -> Strategy:
    return interlock.resolve(accelerator="cpu", precision=precision, machine=CPU)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("32-true", torch.float32), ("64-true", torch.float64), ("bf16-true", torch.bfloat16),
     ("16-true", torch.float16), ("bf16-mixed", torch.float32)],
)
def test_init_contexts_give_the_device_and_dtype(precision: str, dtype: torch.dtype) -> None:
    strategy = single(precision)
    with strategy.module_init_context():
        module = nn.Linear(3, 3)
    with strategy.tensor_init_context():
        tensor = torch.empty(2)
    for what, t in (("parameter", module.weight), ("tensor", tensor)):
        assert t.dtype == dtype, f"{precision}: {what} dtype {t.dtype}"
        assert t.device == strategy.root_device, f"{precision}: {what} on {t.device}"
    assert torch.get_default_dtype() == torch.float32, "the default dtype was not restored"


def test_empty_init_skips_initialisation() -> None:
    strategy = single()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with strategy.module_init_context(empty_init=True):
        nn.Linear(64, 64)
    assert torch.equal(before, torch.get_rng_state()), "empty_init still drew random numbers"
    torch.manual_seed(0)
    with strategy.module_init_context(empty_init=False):
        nn.Linear(64, 64)
    assert not torch.equal(before, torch.get_rng_state())


def test_clipping_by_norm_and_value() -> None:
    strategy = single()
    model = strategy.setup_module(nn.Linear(4, 1, bias=False))
    optimizer = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    strategy.backward(model(torch.full((1, 4), 10.0)).sum(), model)
    norm = strategy.clip_gradients_norm(model, optimizer, max_norm=1.0)
    assert float(norm) == pytest.approx(20.0)
    weight = next(model.parameters())
    assert weight.grad is not None
    assert float(weight.grad.norm()) == pytest.approx(1.0, rel=1e-5)
    strategy.clip_gradients_value(model, optimizer, clip_value=0.1)
    assert float(weight.grad.abs().max()) <= 0.1 + 1e-7


def test_batch_to_device_keeps_the_structure() -> None:
    strategy = single()
    batch: Any = {"x": [torch.ones(1), (torch.zeros(1), 3)], "y": "label"}
    moved = strategy.batch_to_device(batch)
    assert moved["y"] == "label" and moved["x"][1][1] == 3
    assert moved["x"][0].device == strategy.root_device


def test_forward_runs_under_the_precision(tmp_path: Path) -> None:
    strategy = single("bf16-mixed")
    model = strategy.setup_module(nn.Linear(4, 2))
    out = model(torch.randn(3, 4))
    assert out.dtype == torch.float32, "bf16-mixed output was not converted back"
    inner: list[torch.dtype] = []
    model.module.register_forward_hook(lambda m, i, o: inner.append(o.dtype))
    model(torch.randn(3, 4))
    assert inner == [torch.bfloat16], "the forward did not run under bf16 autocast"


def test_checkpoint_state_and_a_malicious_file(tmp_path: Path) -> None:
    strategy = single()
    model = strategy.setup_module(nn.Linear(2, 2))
    strategy.save_checkpoint(tmp_path / "c.pt", {"model": model, "note": "hi"})
    state: dict[str, Any] = {"model": strategy.setup_module(nn.Linear(2, 2))}
    rest = strategy.load_checkpoint(tmp_path / "c.pt", state)
    assert rest == {"note": "hi"}
    assert torch.equal(state["model"].state_dict()["weight"], model.state_dict()["weight"])
    with pytest.raises(CheckpointLoadError, match="has no entry 'optimizer'; it has 'model'"):
        strategy.load_checkpoint(tmp_path / "c.pt", {"optimizer": None, "model": model})
    torch.save({"model": _Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointLoadError):
        strategy.load_checkpoint(tmp_path / "evil.pt", {})


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this must never run",))


class _LooksLikeAnOptimizer:
    """Not a torch Optimizer, but works like one (a wrapper some libraries ship)."""

    def __init__(self, params: Any) -> None:
        self.param_groups = [{"params": list(params)}]
        self.state: dict[Any, Any] = {}

    def step(self) -> None:
        pass


@pytest.mark.parametrize(("call", "message"), [
    (lambda s, m, o: s.setup_module_and_optimizers(m, o),
     r"setup_module_and_optimizers\(\) takes a list of optimizers: pass \[optimizer\]"),
    (lambda s, m, o: s.setup_module_and_optimizers(m, None),
     r"takes a list of torch.optim.Optimizer, got NoneType"),
    (lambda s, m, o: s.setup_module_and_optimizers(m, [o, m]),
     r"optimizer 1 is a Linear, not a torch.optim.Optimizer"),
    (lambda s, m, o: s.setup_module_and_optimizers("model.pt", [o]),
     r"setup_module_and_optimizers\(\) sets up a torch.nn.Module, got str"),
    (lambda s, m, o: s.setup_module(None), r"setup_module\(\) sets up a torch.nn.Module, "
     r"got NoneType"),
    (lambda s, m, o: s.setup_optimizer(m.parameters()),
     r"setup_optimizer\(\) prepares a torch.optim.Optimizer, got generator"),
])
def test_what_is_not_a_module_or_an_optimizer_is_refused_by_name(call: Any,
                                                                 message: str) -> None:
    """A caller without static types (a config, a notebook): the usual slips get a
    TypeError that names the call and the fix, not an AttributeError from inside, and
    nothing is set up."""
    from typeguard import suppress_type_checks

    strategy = single()
    module = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    weight = module.weight
    with suppress_type_checks(), pytest.raises(TypeError, match=message):
        call(strategy, module, optimizer)
    assert module.weight is weight and optimizer.param_groups[0]["params"][0] is weight


def test_an_optimizer_that_only_works_like_torchs_is_still_taken() -> None:
    """The checks above refuse what cannot be an optimizer, not what works like one
    (outside the annotations, so for callers without static types)."""
    from typeguard import suppress_type_checks

    module = nn.Linear(2, 2)
    optimizer = _LooksLikeAnOptimizer(module.parameters())
    with suppress_type_checks():
        wrapped, (same,) = single().setup_module_and_optimizers(
            module, [optimizer])  # type: ignore[list-item]
    assert same is optimizer  # type: ignore[comparison-overlap]
    assert next(iter(wrapped.parameters())) is module.weight
