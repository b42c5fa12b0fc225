"""`SingleDeviceCollective`: the operations of a world of one process."""

from __future__ import annotations

from typing import Any

import torch

from interlock.strategies.collectives.base import Collective, ReduceOp, check_op


def _mean_dtype(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_floating_point() else tensor.to(torch.get_default_dtype())


class SingleDeviceCollective(Collective):
    """Identity semantics: what a world of size one would compute."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_initialized(self) -> bool:
        return True

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        check_op(op)
        return _mean_dtype(tensor).clone() if op == "mean" else tensor.clone()

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.unsqueeze(0).clone()

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        _check_rank(src)
        return tensor.clone()

    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: ReduceOp = "sum") -> torch.Tensor:
        _check_rank(dst)
        return self.all_reduce(tensor, op)

    def gather(self, tensor: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        _check_rank(dst)
        return self.all_gather(tensor)

    def scatter(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        _check_rank(src)
        _check_leading(tensor, 1)
        return tensor[0].clone()

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        _check_leading(tensor, 1)
        return self.all_reduce(tensor[0], op)

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        _check_leading(tensor, 1)
        return tensor.clone()

    def barrier(self) -> None:
        return None

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        _check_rank(src)
        return obj

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        _check_rank(dst)
        return [obj]

    def scatter_object(self, objs: list[Any] | None, src: int = 0) -> Any:
        _check_rank(src)
        if objs is None or len(objs) != 1:
            raise ValueError("scatter_object on one process needs a list of exactly 1 object")
        return objs[0]


def _check_rank(rank: int) -> None:
    if rank != 0:
        raise ValueError(f"rank {rank} does not exist in a world of 1 process")


def _check_leading(tensor: torch.Tensor, world_size: int) -> None:
    if tensor.dim() == 0 or tensor.shape[0] != world_size:
        raise ValueError(
            f"expected a tensor whose first dimension is the world size {world_size}, "
            f"got shape {tuple(tensor.shape)}"
        )
