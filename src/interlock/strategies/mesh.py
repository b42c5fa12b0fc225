"""`MeshDegrees`: how the world is split into data-parallel and tensor-parallel groups.

Glossary:

world size
    every rank of the job (devices per node x nodes).
data parallel (dp)
    groups that see different batches; gradients are reduced (or sharded, with
    FSDP2) across them.
tensor parallel (tp)
    ranks that split each layer's weights between them and see the same batch.

The ranks form a 2-D mesh of shape ``(dp, tp)``: tensor-parallel neighbours are the
fastest-varying dimension, so they land on the same node, where the links are fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Degree = int | Literal["auto"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshDegrees:
    """Validated degrees of parallelism whose product is the world size.

    Attributes:
        data_parallel: size of the data-parallel dimension.
        tensor_parallel: size of the tensor-parallel dimension.
    """

    data_parallel: int
    tensor_parallel: int

    def __post_init__(self) -> None:
        for name in ("data_parallel", "tensor_parallel"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MeshDegrees({name}={value!r}): expected an int >= 1")

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.tensor_parallel

    @property
    def data_parallel_enabled(self) -> bool:
        return self.data_parallel > 1

    @property
    def tensor_parallel_enabled(self) -> bool:
        return self.tensor_parallel > 1

    @classmethod
    def resolve(cls, *, data_parallel: Degree, tensor_parallel: Degree, world_size: int,
                devices_per_node: int) -> MeshDegrees:
        """Fill in ``"auto"`` degrees and check that the product is ``world_size``.

        Both ``"auto"``: tensor parallel within a node (``devices_per_node``), data
        parallel across nodes. One ``"auto"``: the world size divided by the other.

        Raises:
            ValueError: naming both degrees and the world size when they do not fit.
        """
        for name, value in (("data_parallel_size", data_parallel),
                            ("tensor_parallel_size", tensor_parallel)):
            if value != "auto" and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"{name}={value!r}: expected 'auto' or an int >= 1")
        dp = None if data_parallel == "auto" else data_parallel
        tp = None if tensor_parallel == "auto" else tensor_parallel
        if dp is None and tp is None:
            tp, dp = devices_per_node, world_size // devices_per_node
        elif dp is None and tp is not None:
            dp = _divide(world_size, tp, "tensor_parallel_size")
        elif tp is None and dp is not None:
            tp = _divide(world_size, dp, "data_parallel_size")
        data_parallel, tensor_parallel = int(dp or 0), int(tp or 0)
        if data_parallel * tensor_parallel != world_size:
            raise ValueError(
                f"data_parallel_size={data_parallel} x tensor_parallel_size={tensor_parallel}"
                f" = {data_parallel * tensor_parallel}, but the world has {world_size} "
                f"ranks; the product must equal the world size"
            )
        return cls(data_parallel=data_parallel, tensor_parallel=tensor_parallel)


def _divide(world_size: int, size: int, name: str) -> int:
    if world_size % size:
        raise ValueError(
            f"{name}={size} does not divide the world size {world_size}; choose one of "
            f"{', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)}"
        )
    return world_size // size
