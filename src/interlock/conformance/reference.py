"""The suite's fixed model, data and single-process reference computations.

Everything here is deterministic: every rank (and every world size) computes the same
reference, and each rank trains on its share of the same global batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from interlock.engine.registry import current_parts
from interlock.engine.tables import PrecisionRow

FEATURES = 6
HIDDEN = 8
LR = 0.1
#: global batch size: divisible by every world size the suite uses (1, 2, 4, 8)
BATCH = 16


#: how `tensor_parallel_plan` splits the suite's MLPs (a model may carry its own plan as
#: a ``tensor_parallel`` attribute): the first layer column-wise, the last row-wise
MLP_TENSOR_PARALLEL: dict[str, str] = {"0": "colwise", "2": "rowwise"}


def model() -> nn.Module:
    """A small MLP, always initialised the same way."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def other_model() -> nn.Module:
    """The same architecture with different weights (a "fresh" model to load into)."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def buffer_values() -> torch.Tensor:
    """The value :func:`model_with_buffer` computes for its buffer in ``__init__``."""
    return torch.tensor(0.75)


class _ScaledTanh(nn.Module):
    """Tanh of the input times a non-persistent buffer (a scalar, so tensor-parallel
    splits of the activations still multiply by it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freq", buffer_values().to(torch.get_default_dtype()),
                             persistent=False)

    freq: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.freq)


def model_with_buffer() -> nn.Module:
    """:func:`model`'s shape, its activation scaled by a non-persistent buffer (not in
    the state dict: no checkpoint can restore it)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), _ScaledTanh(), nn.Linear(HIDDEN, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, 1, generator=g)


#: the loss scale every check starts from, in the strategy and in the reference alike.
#: torch's default (65536) is at the edge of float16 overflow for these models, and
#: whether a step overflows depends on how the batch is split: each rank's gradients of
#: a mean over fewer samples are larger, so a rank may skip a step one process takes.
#: Parity compares the maths with no step skipped; skipping is `scaler_skip`'s.
PARITY_SCALE = 2.0**10


def with_parity_scale(state: Any) -> Any:
    """A precision's state (``Precision.state_dict()``) with every loss scale in it set
    to `PARITY_SCALE` (GradScaler's ``"scale"``, at any depth: a plugin may nest it)."""
    if isinstance(state, dict):
        return {k: (PARITY_SCALE if k == "scale" and isinstance(v, (int, float))
                    else with_parity_scale(v)) for k, v in state.items()}
    return state


def tensor_parallel_plan(module: nn.Module, mesh: Any) -> nn.Module:
    """How the suite splits its MLP for strategies that take a ``parallelize_fn``:
    column-wise then row-wise over ``mesh["tp"]``, then FSDP2 over ``mesh["dp_shard"]``
    (the 2-D ``("dp_replicate", "dp_shard")`` mesh, HSDP, when dp_replicate > 1 too) when
    more than one rank shares the data. Under pipeline parallel ``module`` is a stage:
    only its own layers (not `nn.Identity`) are split."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    if mesh["tp"].size() > 1:
        # a model may say how it splits (the recipe checks' model does); else the MLP's
        own_plan: dict[str, str] = getattr(module, "tensor_parallel", MLP_TENSOR_PARALLEL)
        styles: dict[str, ParallelStyle] = {
            name: ColwiseParallel() if style == "colwise" else RowwiseParallel()
            for name, style in own_plan.items()}
        owned = {name: style for name, style in styles.items()
                 if isinstance(module.get_submodule(name), nn.Linear)}
        if owned:
            parallelize_module(module, mesh["tp"], owned)
    replicate, shard = mesh["dp_replicate"].size(), mesh["dp_shard"].size()
    if replicate > 1:
        fully_shard(module, mesh=mesh["dp_replicate", "dp_shard"])
    elif shard > 1:
        fully_shard(module, mesh=mesh["dp_shard"])
    return module


#: the compute dtype of Transformer Engine's rows: its FP8 products happen inside its
#: own layers, which take and return activations in the parameters' dtype
FP8_COMPUTE = "float8"
#: dtypes the reference can compute in
_FLOATING = ("float64", "float32", "float16", "bfloat16")


class NoReference(ValueError):
    """The suite cannot derive a single-process reference for a precision's row."""


def precision_row(precision: str) -> PrecisionRow:
    """The row of ``precision``, built-in or registered.

    Raises:
        NoReference: no such precision is registered in this process.
    """
    row = current_parts().precisions.get(precision)
    if row is None:
        raise NoReference(f"precision {precision!r} is not registered in this process "
                          "(is the package that registers it installed?)")
    return row


@dataclass(frozen=True, slots=True)
class Recipe:
    """How the single-process reference trains in a precision, derived from its row.

    Attributes:
        param_dtype: the dtype the reference model is cast to.
        autocast: the dtype the forward autocasts to, or None.
        scaler: whether a gradient scaler scales the loss.
        compute: the compute dtype's kind, which sets the tolerance: ``"float32"``
            (float32 or float64), ``"half"`` (float16, bfloat16) or ``"float8"``.
    """

    param_dtype: torch.dtype
    autocast: torch.dtype | None
    scaler: bool
    compute: str


def recipe(precision: str) -> Recipe:
    """The reference for ``precision``, from its row's ``param_dtype``,
    ``compute_dtype`` and ``scaler``:

    * parameters and compute in one floating dtype (``*-true``): the model cast to it;
    * float32 parameters, float16 or bfloat16 compute (``*-mixed``): autocast to the
      compute dtype, with a gradient scaler when the row has one;
    * FP8 compute (Transformer Engine): the model cast to the parameters' dtype, at
      FP8's tolerance.

    Raises:
        NoReference: any other combination, naming it: the suite refuses to compare a
            precision against a baseline it does not compute the same way.
    """
    row = precision_row(precision)
    param, compute = row.param_dtype, row.compute_dtype
    facts = f"param_dtype={param!r}, compute_dtype={compute!r}, scaler={row.scaler}"

    def refuse(why: str) -> NoReference:
        return NoReference(
            f"precision {precision!r} ({facts}): the conformance suite has no "
            f"single-process reference for it: {why}. It computes references for "
            "parameters and compute in one of " + ", ".join(_FLOATING) + " without a "
            "scaler, float32 parameters with float16 or bfloat16 compute (with or without "
            f"a scaler), and {FP8_COMPUTE!r} compute over float16 or bfloat16 parameters")

    if param not in _FLOATING:
        raise refuse(f"{param!r} is not a parameter dtype it computes in")
    dtype = getattr(torch, param)
    if compute == FP8_COMPUTE:
        if param not in ("float16", "bfloat16") or row.scaler:
            raise refuse("FP8 compute is referenced over half-precision parameters "
                         "without a scaler only")
        return Recipe(dtype, None, False, "float8")
    if compute not in _FLOATING:
        raise refuse(f"{compute!r} is not a compute dtype it computes in")
    kind = "float32" if compute in ("float32", "float64") else "half"
    if compute == param:
        if row.scaler:
            raise refuse("a gradient scaler cannot unscale gradients held in the "
                         "parameters' own half dtype")
        return Recipe(dtype, None, False, kind)
    if param == "float32" and compute in ("float16", "bfloat16"):
        return Recipe(dtype, getattr(torch, compute), row.scaler, kind)
    raise refuse(f"parameters in {param} computing in {compute} is neither one dtype "
                 "nor float32 parameters under autocast")


def activation_dtype(precision: str) -> torch.dtype:
    """The dtype a Linear layer's output has under ``precision``: the compute dtype,
    except for FP8 compute (the Transformer Engine precisions), whose matrix products
    happen inside its layers, which return activations in the parameters' dtype (torch
    has no dtype named ``float8``)."""
    made = recipe(precision)
    return made.param_dtype if made.compute == "float8" else (
        made.autocast or made.param_dtype)


@contextlib.contextmanager
def autocast(made: Recipe) -> Iterator[None]:
    """The block under CPU autocast to the recipe's dtype, if it has one."""
    if made.autocast is not None:
        with torch.autocast("cpu", dtype=made.autocast):
            yield
    else:
        yield


def optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """One optimizer step (through the loss scaler when there is one), then zero_grad."""
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad()


def baseline(precision: str, steps: int, accumulate: int = 1) -> dict[str, torch.Tensor]:
    """K SGD steps in one plain process on the full batches, in ``precision`` the way a
    single device runs it (see `recipe`: the module cast for ``*-true``, autocast and a
    loss scaler for ``*-mixed``).

    Raises:
        NoReference: the precision's row is one the suite has no reference for.
    """
    made = recipe(precision)
    net = model().to(made.param_dtype)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=PARITY_SCALE) if made.scaler else None
    dtype = next(net.parameters()).dtype
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro)
            with autocast(made):
                out = net(x.to(dtype))
            loss = nn.functional.mse_loss(out.float(), y) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()  # type: ignore[no-untyped-call]
        optimizer_step(opt, scaler)
    return {k: v.detach().float().clone() for k, v in net.state_dict().items()}


def gradient_norms(loss_factor: float = 1.0) -> list[torch.Tensor]:
    """The gradient norm of each Linear layer of :func:`model` after one float32
    backward of the (scaled) MSE loss on batch 0, in one plain process."""
    net = model()
    x, y = batch(0)
    (nn.functional.mse_loss(net(x), y) * loss_factor).backward()  # type: ignore[no-untyped-call]
    return [torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in layer.parameters()
                                                if p.grad is not None]))
            for layer in net.children() if isinstance(layer, nn.Linear)]


def tolerance(precision: str, extra: tuple[float, float] | None) -> dict[str, float]:
    """``assert_close`` tolerances for training parity in ``precision``, from its row's
    compute dtype (see `recipe`): float32's own for float32 and float64 compute
    (compared in float32), a few half-precision ulps for float16 and bfloat16, a few
    FP8 ulps for FP8; widened by a strategy's declared ``parity_tolerance``.

    Raises:
        NoReference: the precision's row is one the suite has no reference for.
    """
    compute = recipe(precision).compute
    if compute == "float32":
        rtol, atol = 1.3e-6, 1e-5
    elif compute == "float8":
        # FP8 products against the half-precision baseline: a few FP8 ulps
        rtol, atol = 1.25e-1, 2.5e-2
    else:
        rtol, atol = 2e-2, 2e-3
    if extra is not None:
        rtol, atol = max(rtol, extra[0]), max(atol, extra[1])
    return {"rtol": rtol, "atol": atol}
