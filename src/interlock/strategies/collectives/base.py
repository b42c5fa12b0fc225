"""`Collective`: the one place where cross-process operations are implemented.

Strategies call these directly. Every tensor operation returns a new tensor and leaves
its input untouched; results live on the input's device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

import torch

ReduceOp = Literal["sum", "mean", "max", "min"]
REDUCE_OPS: tuple[str, ...] = ("sum", "mean", "max", "min")


def check_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"reduce op {op!r} is unknown; choose one of {', '.join(REDUCE_OPS)}")


class Collective(ABC):
    """Cross-process operations over the processes of one strategy.

    Conventions: ``all_gather`` and ``gather`` stack results along a new first dimension
    of size ``world_size``; ``scatter``, ``reduce_scatter`` and ``all_to_all`` take a
    tensor whose first dimension is ``world_size`` and rank ``r`` works on slice ``r``.
    ``mean`` of an integer tensor is computed in the default floating dtype.
    """

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank in the collective's group."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of processes in the group."""

    @property
    @abstractmethod
    def is_initialized(self) -> bool:
        """Whether the group exists."""

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """The element-wise reduction of ``tensor`` over all ranks, on every rank."""

    @abstractmethod
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor``, stacked: shape ``(world_size, *tensor.shape)``."""

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``tensor`` on every rank (same shape and dtype everywhere)."""

    @abstractmethod
    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: ReduceOp = "sum") -> torch.Tensor:
        """The reduction on rank ``dst``; other ranks get their input back (a copy)."""

    @abstractmethod
    def gather(self, tensor: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        """Every rank's ``tensor`` stacked on rank ``dst``; None elsewhere."""

    @abstractmethod
    def scatter(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Slice ``r`` of rank ``src``'s ``(world_size, ...)`` tensor, on rank ``r``."""

    @abstractmethod
    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """Slice ``r`` of the reduction of every rank's ``(world_size, ...)`` tensor."""

    @abstractmethod
    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """Output slice ``j`` on rank ``r`` is slice ``r`` of rank ``j``'s input."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank arrives."""

    @abstractmethod
    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable object, in rank order."""

    @abstractmethod
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable object on every rank."""

    @abstractmethod
    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's object in rank order on ``dst``; None elsewhere."""

    @abstractmethod
    def scatter_object(self, objs: list[Any] | None, src: int = 0) -> Any:
        """Element ``r`` of rank ``src``'s list, on rank ``r``."""

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Destroy what this collective created."""
