"""Helpers shared by the precision plugins: walking batches, the default dtype, checks."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch


def apply_to_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in ``data``, rebuilding its containers.

    Lists, tuples (named tuples included) and mappings are walked recursively; any
    other object is returned unchanged.
    """
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        out = copy.copy(data)  # keeps the dict subclass and, say, a defaultdict's factory
        for key, value in data.items():
            out[key] = apply_to_tensors(value, fn)
        return out
    if isinstance(data, Mapping):
        return type(data)({k: apply_to_tensors(v, fn) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a named tuple
        return type(data)(*(apply_to_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(v, fn) for v in data)
    return data


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Cast the floating-point tensors in ``data`` to ``dtype``; leave the others."""

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if torch.is_floating_point(tensor) else tensor

    return apply_to_tensors(data, cast)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Make ``dtype`` torch's default dtype inside the block, restoring it after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def check_one_of(owner: str, arg: str, value: object, allowed: Collection[str],
                 expected: str = "one of") -> None:
    """ValueError ``owner(arg=value): expected one of 'a', 'b'`` unless ``value`` is allowed."""
    if value not in allowed:
        raise ValueError(
            f"{owner}({arg}={value!r}): expected {expected} {', '.join(map(repr, allowed))}"
        )
