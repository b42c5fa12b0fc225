"""`TorchCollective`: the operations over a torch.distributed process group."""

from __future__ import annotations

import atexit
import datetime
import gc
from typing import Any

import torch
import torch.distributed as dist

from interlock.strategies.collectives.base import Collective, ReduceOp, check_op
from interlock.strategies.collectives.single_device import _check_leading, _mean_dtype

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # divided afterwards: gloo has no AVG
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


#: whether this process collects its garbage before its interpreter shuts down
_FREES_AT_EXIT = [False]


def free_groups_at_exit() -> None:
    """Collect this process's garbage at exit, while its interpreter is still whole
    (once per process; `TorchCollective.setup` calls it).

    A device mesh keeps its process groups in reference cycles (torch's DeviceMesh
    objects point at each other), so destroying them leaves them to the cyclic
    collector. A rank that exits right after teardown met them in the interpreter's
    last collection, during its shutdown, where a gloo worker thread that still held a
    tensor could not take the GIL and aborted the process ("terminate called without
    an active exception": the rank was reported as killed by a signal). An exit hook
    runs before that, when the threads can still finish. (A forked rank ends with
    ``os._exit`` and never finalises anything.)
    """
    if not _FREES_AT_EXIT[0]:
        atexit.register(gc.collect)
        _FREES_AT_EXIT[0] = True


class TorchCollective(Collective):
    """torch.distributed over any backend (gloo, nccl, ...).

    ``setup`` creates the default process group from a rendezvous store; ``teardown``
    destroys it only if this object created it.
    """

    def __init__(self) -> None:
        self._created = False

    # ----------------------------------------------------------------- lifecycle

    def setup(
        self,
        *,
        backend: str,
        rank: int = -1,
        world_size: int = -1,
        store: dist.Store | None = None,
        timeout: datetime.timedelta | None = None,
        device_id: torch.device | None = None,
        init_method: str | None = None,
    ) -> None:
        """Create the default process group (``env://`` when neither a store nor an
        ``init_method`` such as ``xla://`` is given; -1 lets the method supply ranks)."""
        if dist.is_initialized():
            raise RuntimeError(
                "a default process group already exists in this process; tear the other "
                "strategy down first"
            )
        dist.init_process_group(
            backend, init_method=init_method, store=store, rank=rank, world_size=world_size,
            timeout=timeout, device_id=device_id,
        )
        self._created = True
        free_groups_at_exit()

    def teardown(self) -> None:
        if self._created and dist.is_initialized():
            dist.destroy_process_group()
        self._created = False

    @property
    def owns_group(self) -> bool:
        """Whether this object created the default process group that exists now."""
        return self._created and dist.is_initialized()

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def is_initialized(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    # ----------------------------------------------------------------- tensors

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        check_op(op)
        out = (_mean_dtype(tensor) if op == "mean" else tensor).detach().clone().contiguous()
        dist.all_reduce(out, op=_OPS[op])
        if op == "mean":
            out = out / self.world_size
        return out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        src = tensor.detach().contiguous()
        parts = [torch.empty_like(src) for _ in range(self.world_size)]
        dist.all_gather(parts, src)
        return torch.stack(parts)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        out = tensor.detach().clone().contiguous()
        dist.broadcast(out, src=src)
        return out

    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: ReduceOp = "sum") -> torch.Tensor:
        check_op(op)
        out = (_mean_dtype(tensor) if op == "mean" else tensor).detach().clone().contiguous()
        dist.reduce(out, dst=dst, op=_OPS[op])
        if op == "mean" and self.rank == dst:
            out = out / self.world_size
        elif self.rank != dst:
            out = tensor.detach().clone()
        return out

    def gather(self, tensor: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        src = tensor.detach().contiguous()
        parts = None
        if self.rank == dst:
            parts = [torch.empty_like(src) for _ in range(self.world_size)]
        dist.gather(src, parts, dst=dst)
        return torch.stack(parts) if parts is not None else None

    def scatter(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        _check_leading(tensor, self.world_size)
        out = torch.empty_like(tensor[0]).contiguous()
        chunks = [t.contiguous() for t in tensor.detach()] if self.rank == src else None
        dist.scatter(out, chunks, src=src)
        return out

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        _check_leading(tensor, self.world_size)
        # one implementation on every backend: all_reduce, keep this rank's slice
        return self.all_reduce(tensor, op)[self.rank].clone()

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        _check_leading(tensor, self.world_size)
        src = tensor.detach().contiguous()
        out = torch.empty_like(src)
        dist.all_to_all_single(out, src)
        return out

    def barrier(self) -> None:
        dist.barrier()

    # ----------------------------------------------------------------- objects

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def scatter_object(self, objs: list[Any] | None, src: int = 0) -> Any:
        if self.rank == src and (objs is None or len(objs) != self.world_size):
            raise ValueError(
                f"scatter_object needs a list of {self.world_size} objects on rank {src}"
            )
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.rank == src else None, src=src)
        return box[0]
