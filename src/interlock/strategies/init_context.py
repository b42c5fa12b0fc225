"""Module construction that skips parameter initialisation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

