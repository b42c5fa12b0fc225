"""`model_shape`: a module's `ModelShape`, measured without touching its memory.

Only sizes, dtypes and structure are read, so a model built on the meta device
(``with torch.device("meta"): model = Net()``) is measured as well as a real one, and
a 70B model is sized on a laptop. torch is imported only when this is called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from interlock.connector.model import ModelShape

if TYPE_CHECKING:
    from torch import nn

#: the tensor-parallel styles a plan given to `model_shape` may name, and which of a
#: linear layer's tensors each splits (a row-wise layer's bias stays whole)
TENSOR_PARALLEL_STYLES: Mapping[str, tuple[str, ...]] = {
    "colwise": ("weight", "bias"),
    "rowwise": ("weight",),
}


def model_shape(module: nn.Module, *, units: Iterable[type[nn.Module]] | None = None,
                tensor_parallel: Mapping[str, str] | int | None = None,
                activation_bytes_per_sample: int | None = None) -> ModelShape:
    """Measure ``module``'s `ModelShape` (tied parameters counted once).

    Args:
        module: the model, on any device (the meta device included).
        units: the module classes a sharded strategy wraps as units of their own
            (``FSDPStrategy(auto_wrap_policy=...)``), to measure the largest unit FSDP
            gathers at once: ``()`` for the root alone (the default of an
            ``FSDPStrategy``), None to leave ``largest_unit`` unknown.
        tensor_parallel: the weights a tensor-parallel plan splits: a plan mapping
            submodule names to ``"colwise"`` or ``"rowwise"`` (as given to
            ``parallelize_module``), or the count of split elements; None for none.
        activation_bytes_per_sample: passed on to the shape (it cannot be read from the
            module: it depends on the data).

    Raises:
        ValueError: the module has no trainable parameters, a plan names a submodule it
            lacks or a style other than ``colwise`` and ``rowwise``, or ``units`` holds
            something other than module classes.
    """
    import torch
    from torch import nn

    if not isinstance(module, nn.Module):
        raise ValueError(f"model_shape() measures a torch.nn.Module, got "
                         f"{type(module).__name__}")
    unique: dict[int, torch.nn.Parameter] = {}
    for param in module.parameters():  # each parameter once, tied ones included
        unique.setdefault(id(param), param)
    trainable = [p for p in unique.values() if p.requires_grad and p.numel()]
    if not trainable:
        raise ValueError(f"model_shape(): {type(module).__name__} has no trainable "
                         "parameters: there is nothing to train, and nothing to estimate")
    by_dtype: dict[str, int] = {}
    for p in trainable:
        name = str(p.dtype).removeprefix("torch.")
        by_dtype[name] = by_dtype.get(name, 0) + p.numel()
    seen: set[int] = set()
    buffers = 0
    for buffer in module.buffers():
        if id(buffer) not in seen:
            seen.add(id(buffer))
            buffers += buffer.numel() * buffer.element_size()
    return ModelShape(
        parameters=sum(p.numel() for p in trainable),
        dtype=max(by_dtype, key=lambda d: by_dtype[d]),
        frozen_parameters=sum(p.numel() for p in unique.values() if not p.requires_grad),
        buffer_bytes=buffers,
        tensors=len(trainable),
        tensor_parallel=_tensor_parallel(module, tensor_parallel),
        layers=_layers(module) if isinstance(module, nn.Sequential) else (),
        largest_unit=None if units is None else _largest_unit(module, tuple(units)),
        tensor_rows=tuple((p.shape[0] if p.dim() else 1, p.numel()) for p in trainable),
        activation_bytes_per_sample=activation_bytes_per_sample,
    )


def _layers(module: nn.Sequential) -> tuple[int, ...]:
    """Trainable elements of each child that has some, a tied parameter in the first
    child that holds it (the pipeline split counts layers with parameters)."""
    seen: set[int] = set()
    layers = []
    for child in module:
        count = 0
        for param in child.parameters():
            if id(param) not in seen and param.requires_grad:
                seen.add(id(param))
                count += param.numel()
        if count:
            layers.append(count)
    return tuple(layers)


def _largest_unit(module: nn.Module, units: tuple[type[nn.Module], ...]) -> int:
    """The most elements any FSDP unit gathers when the submodules of ``units`` are
    wrapped (children before parents, each unit taking what no inner unit took) and the
    root takes the rest."""
    from torch import nn

    for kind in units:
        if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
            raise ValueError(f"model_shape(units=...): expected nn.Module classes, got "
                             f"{kind!r}")
    taken: set[int] = set()
    sizes = []
    for sub in [*reversed(list(module.modules())[1:]), module]:
        if sub is not module and not isinstance(sub, units):
            continue
        size = 0
        for param in sub.parameters():
            if id(param) not in taken:
                taken.add(id(param))
                size += param.numel()
        sizes.append(size)
    return max(max(sizes), 1)


def _tensor_parallel(module: nn.Module, plan: Mapping[str, str] | int | None) -> int:
    if plan is None:
        return 0
    if isinstance(plan, int) and not isinstance(plan, bool):
        return plan
    if not isinstance(plan, Mapping):
        raise ValueError("model_shape(tensor_parallel=...): expected a plan mapping "
                         "submodule names to 'colwise' or 'rowwise', or a count")
    total = 0
    for name, style in plan.items():
        if style not in TENSOR_PARALLEL_STYLES:
            raise ValueError(f"model_shape(tensor_parallel=...): {name!r} has style "
                             f"{style!r}; known: {', '.join(TENSOR_PARALLEL_STYLES)}")
        try:
            sub = module.get_submodule(name)
        except AttributeError:
            raise ValueError(f"model_shape(tensor_parallel=...): {type(module).__name__} "
                             f"has no submodule {name!r}") from None
        for tensor in TENSOR_PARALLEL_STYLES[style]:
            param = getattr(sub, tensor, None)
            if param is not None and getattr(param, "requires_grad", False):
                total += int(param.numel())
    return total


__all__ = ["TENSOR_PARALLEL_STYLES", "model_shape"]
