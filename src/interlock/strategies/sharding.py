"""Helpers the sharded strategies share: meta-device materialisation, activation
checkpointing, and norms of sharded gradients."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` lives on the meta device."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


@torch.no_grad()
def materialize_meta(module: nn.Module, device: torch.device) -> None:
    """Allocate a (sharded) module built on the meta device and initialise it.

    Only the local shards are allocated. Every submodule with a ``reset_parameters``
    method runs it; parameters of modules without one are left uninitialised, as
    after ``torch.empty``, and are meant to be loaded from a checkpoint.
    """
    module.to_empty(device=device)
    for sub in module.modules():
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()


def apply_activation_checkpointing(module: nn.Module,
                                   classes: Sequence[type[nn.Module]]) -> None:
    """Recompute the activations of every submodule of one of ``classes`` in backward.

    Uses the composable API, which keeps parameter names (and so state-dict keys)
    unchanged, unlike wrapper modules.
    """
    if not classes:
        return
    from torch.distributed._composable import checkpoint

    for sub in list(module.modules()):
        if isinstance(sub, tuple(classes)):
            checkpoint(sub)


def total_norm(norm: torch.Tensor) -> torch.Tensor:
    """A norm computed over sharded gradients (a DTensor) as a plain tensor."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
