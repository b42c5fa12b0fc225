"""`XLACheckpointIO`: checkpoints of tensors that live on XLA devices."""

from __future__ import annotations

from typing import Any, ClassVar

from interlock.strategies.io.base import PathLike
from interlock.strategies.io.torch_io import TorchCheckpointIO
from interlock.strategies.precision.utils import apply_to_tensors


class XLACheckpointIO(TorchCheckpointIO):
    """Runs the pending XLA graph, copies every tensor to the CPU, and then writes the
    file exactly as :class:`TorchCheckpointIO` does (atomically; loadable without
    torch_xla)."""

    name: ClassVar[str] = "xla"

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        import torch_xla.core.xla_model as xm

        xm.mark_step()  # materialise lazily traced values before reading them
        on_cpu = apply_to_tensors(checkpoint, lambda t: t.detach().to("cpu"))
        super().save_checkpoint(on_cpu, path)
