"""`model_shape`: a module's `ModelShape`, measured without touching its memory.

Only sizes, dtypes and structure are read, so a model built on the meta device
(``with torch.device("meta"): model = Net()``) is measured as well as a real one, and
a 70B model is sized on a laptop. torch is imported only when this is called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from interlock.engine.model import ModelShape

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
                activation_bytes_per_sample: int | None = None,
                sample: Any = None) -> ModelShape:
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
        activation_bytes_per_sample: passed on to the shape, when known otherwise.
        sample: one micro-batch of input (a tensor, or a tuple of the forward's
            arguments) to measure ``activation_bytes_per_sample`` with: the forward
            runs once with autograd on, and the tensors it saves for the backward pass
            (each storage once; the module's parameters and buffers left out, they are
            counted apart) and its output (a loss keeps a tensor of that size) are
            added up and divided by the batch, the first dimension of the first
            tensor; the largest of them gives ``largest_activation_bytes_per_sample``.
            Give the micro-batch the plan is for: what does not grow with the batch
            (autocast's half-precision copies of the weights) is then counted once.
            Give a module whose forward returns the loss to count what the loss keeps.
            On the meta device nothing is allocated; elsewhere the forward really runs,
            with that device's kernels (attention kernels keep less than the meta
            device's reference path). Run it under ``torch.autocast`` to
            measure a mixed-precision forward.

    Raises:
        ValueError: the module has no trainable parameters, a plan names a submodule it
            lacks or a style other than ``colwise`` and ``rowwise``, ``units`` holds
            something other than module classes, a sample has no batch dimension, or
            both ``sample`` and ``activation_bytes_per_sample`` are given.
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
    if sample is not None:
        if activation_bytes_per_sample is not None:
            raise ValueError("model_shape(): give sample= or activation_bytes_per_sample=, "
                             "not both")
        activation_bytes_per_sample, largest = _activations_per_sample(module, sample)
    else:
        largest = None
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
        largest_activation_bytes_per_sample=largest,
    )


def _activations_per_sample(module: nn.Module, sample: Any) -> tuple[int, int]:
    """Bytes autograd saves for the backward pass in one forward of ``sample``, plus the
    output's, per sample of its batch; and the largest of those tensors', per sample."""
    import torch

    args = sample if isinstance(sample, tuple) else (sample,)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None or first.dim() == 0 or first.shape[0] == 0:
        raise ValueError("model_shape(sample=...): expected a batch, a tensor (or a tuple "
                         "of arguments holding one) whose first dimension counts samples")
    batch = int(first.shape[0])
    owned = {t.untyped_storage()._cdata for t in (*module.parameters(), *module.buffers())}
    saved: dict[int, int] = {}
    # the storages counted, held until the forward is over so that none is freed and its
    # address taken by a later one (which would then count as seen)
    held: list[torch.UntypedStorage] = []

    def note(tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage._cdata not in owned and storage._cdata not in saved:
            saved[storage._cdata] = storage.nbytes()
            held.append(storage)

    def pack(tensor: torch.Tensor) -> None:
        # nothing is kept for a backward pass that never runs: keeping the tensor would
        # tie the graph into a reference cycle, alive until the garbage collector runs
        note(tensor)

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("model_shape(sample=...) runs no backward pass")

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        output = module(*args)
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    for tensor in outputs:
        if isinstance(tensor, torch.Tensor):
            note(tensor)
    del output, outputs
    held.clear()
    return -(-sum(saved.values()) // batch), -(-max(saved.values(), default=0) // batch)


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
