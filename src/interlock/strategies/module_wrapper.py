"""The module a strategy hands back from `setup_module`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from interlock.strategies.precision.base import Precision


class StrategyModule(nn.Module):
    """Runs the (possibly wrapped) module under the strategy's precision.

    ``forward`` converts the inputs, runs inside the precision's forward context and
    converts the outputs. ``state_dict`` and ``load_state_dict`` act on the original
    module, so checkpoints look the same whatever the strategy wrapped it in.
    """

    def __init__(
        self, forward_module: nn.Module, original: nn.Module, precision: Precision
    ) -> None:
        super().__init__()
        self._forward_module = forward_module
        self._original = original
        self._precision = precision

    @property
    def module(self) -> nn.Module:
        """The user's module, unwrapped."""
        return self._original

    @property
    def forward_module(self) -> nn.Module:
        """What forward actually calls (the user's module or its DDP/FSDP wrapper)."""
        return self._forward_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._precision.convert_input((args, kwargs))
        with self._precision.forward_context():
            output = self._forward_module(*args, **kwargs)
        return self._precision.convert_output(output)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._original.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self._original.load_state_dict(state_dict, strict=strict, assign=assign)


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside a StrategyModule (or the module itself)."""
    return module.module if isinstance(module, StrategyModule) else module


def keeping_ties(module: nn.Module, change: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """``change(module)`` (a move or a cast), its tied parameters still tied.

    ``Module.to`` gives each module a new Parameter where the tensor types of the two
    sides differ (CPU to an XLA device; anywhere under
    ``torch.__future__.set_overwrite_module_params_on_conversion(True)``), so a weight
    two modules shared (an embedding tied to the output layer) would become two that
    train apart. Afterwards each group of names that held one parameter holds one
    again (names that ``change`` removed are left alone)."""
    places: dict[int, list[tuple[str, str]]] = {}
    for owner, sub in module.named_modules():
        for name, param in sub._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((owner, name))
    changed = change(module)
    for (owner, first), *others in (p for p in places.values() if len(p) > 1):
        shared = _parameter(changed, owner, first)
        for sub_name, name in others:
            if shared is not None and _parameter(changed, sub_name, name) is not None:
                changed.get_submodule(sub_name)._parameters[name] = shared
    return changed


def _parameter(module: nn.Module, owner: str, name: str) -> nn.Parameter | None:
    try:
        return module.get_submodule(owner)._parameters.get(name)
    except AttributeError:
        return None


def move_to_device(data: Any, device: torch.device) -> Any:
    """``data`` with every tensor (in nested lists, tuples and dicts) on ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, dict):
        return {k: move_to_device(v, device) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # named tuple
        return type(data)(*(move_to_device(v, device) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(move_to_device(v, device) for v in data)
    return data
