"""Module construction that skips parameter initialisation."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class empty_init_context(TorchFunctionMode):
    """Within this context ``torch.nn.init`` functions return their tensor untouched.

    Parameters are still allocated (on the current device, in the current dtype) but
    not filled: use it when the weights will be loaded from a checkpoint anyway, which
    saves the time random initialisation takes for a large model.
    """

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            # every init function takes the tensor first and returns it
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)



@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every plain parameter registered inside the block is moved to the meta device.

    Only parameters: buffers keep the values ``__init__`` computed (a rotary
    frequency table, a causal mask, batch-norm statistics), which often are not in
    the state dict (``persistent=False``) and so could not be restored by loading a
    checkpoint. A parameter exists on the real device only until it is registered,
    one at a time, so the peak is the largest single parameter, not the model.
    """

    # one meta parameter per original, so a parameter registered twice (tied weights)
    # stays one; weak references, so the originals are freed as before
    moved: dict[int, tuple[weakref.ref[nn.Parameter], nn.Parameter]] = {}

    def to_meta(module: nn.Module, name: str, param: Any) -> Any:
        # subclasses (lazy or quantised parameters) know best where they live
        if type(param) is not nn.Parameter or param.is_meta:
            return None
        known = moved.get(id(param))
        if known is not None and known[0]() is param:
            return known[1]
        meta = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        meta.__dict__.update(param.__dict__)  # attributes a framework set on it
        moved[id(param)] = (weakref.ref(param), meta)
        return meta

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()
