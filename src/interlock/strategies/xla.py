"""XLA strategies: one XLA device, data parallel over XLA devices, and XLA's FSDP.

torch_xla is imported when a strategy is set up or steps, never at import time: the
engine answers ``missing-package`` for the xla rows when it is not installed.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from interlock.strategies import random_state
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.accelerators.xla import import_torch_xla
from interlock.strategies.base import Strategy
from interlock.strategies.checkpointing import PRECISION_KEY, missing_entries
from interlock.strategies.collectives import Collective, SingleDeviceCollective, TorchCollective
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO, CheckpointLoadError
from interlock.strategies.io.base import load_with
from interlock.strategies.launchers.xla import torch_xla_environment
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.precision import Precision
from interlock.strategies.random_state import RANDOM_KEY

T = TypeVar("T")


def xla_device() -> torch.device:
    """This process's XLA device."""
    import_torch_xla()
    import torch_xla

    device: torch.device = torch_xla.device()
    return device


class XLACollective(TorchCollective):
    """torch.distributed over torch_xla's ``xla`` backend, with object collectives
    that work there.

    The backend takes XLA tensors only, while torch's object collectives stage the
    pickled bytes in CPU tensors for any backend they do not know; here the bytes
    travel through ``xm.rendezvous`` (an all-gather of byte tensors on the XLA
    device) instead, and every rank unpickles what it needs.
    """

    def _exchange(self, payload: bytes) -> list[bytes]:
        import torch_xla.core.xla_model as xm

        return list(xm.rendezvous("interlock-objects", payload))

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [pickle.loads(b) for b in self._exchange(pickle.dumps(obj))]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        payloads = self._exchange(pickle.dumps(obj) if self.rank == src else b"")
        return pickle.loads(payloads[src])

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        everyone = self._exchange(pickle.dumps(obj))
        return [pickle.loads(b) for b in everyone] if self.rank == dst else None

    def scatter_object(self, objs: list[Any] | None, src: int = 0) -> Any:
        if self.rank == src and (objs is None or len(objs) != self.world_size):
            raise ValueError(
                f"scatter_object needs a list of {self.world_size} objects on rank {src}"
            )
        payloads = self._exchange(pickle.dumps(objs) if self.rank == src else b"")
        return pickle.loads(payloads[src])[self.rank]


class _XLADevice:
    """The root device of the XLA strategies: this process's XLA device, found on first
    use (torch_xla picks which)."""

    _device: torch.device | None = None

    @property
    def root_device(self) -> torch.device:
        if self._device is None:
            self._device = xla_device()
        return self._device


class _XLAParallelStrategy(_XLADevice, ParallelStrategy):
    """What the multi-process XLA strategies share: the world size from the cluster
    environment and the process group over torch_xla's backend."""

    @property
    def world_size(self) -> int:
        return self.cluster_environment.world_size()

    def setup_environment(self) -> None:
        """Bind the XLA device and create the process group over torch_xla's "xla"
        backend (its own rendezvous); idempotent."""
        if self._collective.owns_group:
            return
        import_torch_xla()
        import torch_xla.distributed.xla_backend  # noqa: F401 - registers the "xla" backend

        self.accelerator.setup_device(self.root_device)
        self._collective.setup(backend="xla", init_method="xla://", timeout=self.timeout)


class SingleDeviceXLAStrategy(_XLADevice, Strategy):
    """One process on one XLA device (torch_xla picks which)."""

    registry_name: ClassVar[str] = "single_xla"

    def __init__(self, *, accelerator: Accelerator | None = None,
                 precision: Precision | None = None,
                 checkpoint_io: CheckpointIO | None = None,
                 cluster_environment: ClusterEnvironment | None = None,
                 debug: bool = False) -> None:
        super().__init__(accelerator=accelerator, precision=precision,
                         checkpoint_io=checkpoint_io,
                         cluster_environment=cluster_environment)
        self.debug = debug
        self._collective = SingleDeviceCollective()

    @property
    def collective(self) -> Collective:
        return self._collective

    def launch(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` here, as every single-process strategy does, and leave this
        process's environment as it was (importing torch_xla writes into it)."""
        with torch_xla_environment():
            return super().launch(fn, *args, **kwargs)

    def setup_environment(self) -> None:
        self.accelerator.setup_device(self.root_device)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        return self.precision.optimizer_step(optimizer, **kwargs)


class XLAStrategy(_XLAParallelStrategy):
    """Data parallel over XLA devices: one process per device, gradients averaged
    (``xm.reduce_gradients``) just before each optimizer step.

    Args:
        debug: turn on torch_xla's debug checks (``PT_XLA_DEBUG_LEVEL=2``) in the ranks.
        sync_module_states: broadcast rank 0's parameters in :meth:`setup_module`.
    """

    registry_name: ClassVar[str] = "xla"

    def __init__(self, *, accelerator: Accelerator | None = None,
                 parallel_devices: Sequence[torch.device | str] | None = None,
                 precision: Precision | None = None,
                 checkpoint_io: CheckpointIO | None = None,
                 cluster_environment: ClusterEnvironment | None = None,
                 debug: bool = False, sync_module_states: bool = True,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         precision=precision, checkpoint_io=checkpoint_io,
                         cluster_environment=cluster_environment, backend="xla",
                         timeout=timeout)
        self.debug = debug
        self.sync_module_states = sync_module_states
        self._collective = XLACollective()

    def setup_environment(self) -> None:
        if self.debug:
            import os

            os.environ.setdefault("PT_XLA_DEBUG_LEVEL", "2")
        super().setup_environment()

    def wrap_module(self, module: nn.Module) -> nn.Module:
        if self.sync_module_states and self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(module)  # rank 0's parameters everywhere
            xm.mark_step()  # the broadcast is its own graph, not part of the first step's
        return module

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        import torch_xla.core.xla_model as xm

        xm.reduce_gradients(optimizer)  # the mean over replicas, as DDP would
        return self.precision.optimizer_step(optimizer, **kwargs)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Nothing to skip: gradients are reduced in :meth:`optimizer_step`, so local
        backward passes accumulate on their own."""
        yield


class XLAFSDPStrategy(_XLAParallelStrategy):
    """torch_xla's fully sharded data parallel (``XlaFullyShardedDataParallel``).

    Checkpoints hold each rank's shards and their shard metadata (one file per rank,
    in a directory); torch_xla's ``consolidate_sharded_model_checkpoints`` turns them
    into one full state dict.

    Args:
        auto_wrap_policy: passed to ``XlaFullyShardedDataParallel``.
        fsdp_kwargs: any other keyword arguments of ``XlaFullyShardedDataParallel``.
    """

    registry_name: ClassVar[str] = "xla_fsdp"

    def __init__(self, *, accelerator: Accelerator | None = None,
                 parallel_devices: Sequence[torch.device | str] | None = None,
                 precision: Precision | None = None,
                 checkpoint_io: CheckpointIO | None = None,
                 cluster_environment: ClusterEnvironment | None = None,
                 auto_wrap_policy: Any = None,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT,
                 **fsdp_kwargs: Any) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         precision=precision, checkpoint_io=checkpoint_io,
                         cluster_environment=cluster_environment, backend="xla",
                         timeout=timeout)
        self.fsdp_kwargs = {"auto_wrap_policy": auto_wrap_policy, **fsdp_kwargs}
        self._collective = XLACollective()

    def wrap_module(self, module: nn.Module) -> nn.Module:
        from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel

        wrapped: nn.Module = XlaFullyShardedDataParallel(module, **self.fsdp_kwargs)
        return wrapped

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        # XLA's FSDP reduce-scatters gradients in backward: no extra reduction here
        return self.precision.optimizer_step(optimizer, **kwargs)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        inner = module.forward_module if hasattr(module, "forward_module") else module
        no_sync = getattr(inner, "no_sync", None)
        if not enabled or no_sync is None:
            yield
            return
        with no_sync():
            yield

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """A directory with ``rank-<r>.pt`` per rank: its shards and shard metadata."""
        shards = {name: _shard_state(value) for name, value in state.items()}
        precision_state = self.precision.state_dict()
        if precision_state:
            shards[PRECISION_KEY] = precision_state
        # this rank's own file carries this rank's random state (CPU, Python, numpy)
        shards[RANDOM_KEY] = random_state.capture(self.root_device)
        self.checkpoint_io.save_checkpoint(shards, Path(path) / f"rank-{self.global_rank}.pt")
        self.barrier()

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
        """Load this rank's shard file (saved at the same world size), checked against
        its digest unless ``verify=False``."""
        checkpoint = load_with(
            self.checkpoint_io, Path(path) / f"rank-{self.global_rank}.pt",
            map_location="cpu", weights_only=weights_only, verify=verify,
        )
        problem = missing_entries(path, checkpoint, state)
        if problem is not None:
            raise CheckpointLoadError(str(path), problem)
        precision_state = checkpoint.pop(PRECISION_KEY, None)
        if precision_state is not None:
            self.precision.load_state_dict(precision_state)
        saved_random = checkpoint.pop(RANDOM_KEY, None)
        for name, target in state.items():
            value = checkpoint.pop(name)
            if isinstance(target, nn.Module):
                getattr(target, "forward_module", target).load_state_dict(value["model"])
            elif isinstance(target, Optimizer):
                target.load_state_dict(value)
            else:
                state[name] = value
        if isinstance(saved_random, dict):
            random_state.restore_own(saved_random, self.root_device)
        return checkpoint


def _shard_state(value: Any) -> Any:
    if isinstance(value, nn.Module):
        inner = getattr(value, "forward_module", value)
        metadata = getattr(inner, "get_shard_metadata")()  # noqa: B009 - XLA FSDP only
        return {"model": inner.state_dict(), "shard_metadata": metadata}
    if isinstance(value, Optimizer):
        return value.state_dict()
    return value
