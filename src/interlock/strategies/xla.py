"""XLA strategies: one XLA device, data parallel over XLA devices, and XLA's FSDP.

torch_xla is imported when a strategy is set up or steps, never at import time: the
engine answers ``missing-package`` for the xla rows when it is not installed.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
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
from interlock.strategies.checkpointing import PRECISION_KEY, missing_entries, restoring
from interlock.strategies.checkpointing.fit import describe_misfits, refuse_misfits
from interlock.strategies.checkpointing.state import restore_plain
from interlock.strategies.collectives import Collective, SingleDeviceCollective, TorchCollective
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO, CheckpointLoadError
from interlock.strategies.io.base import load_with
from interlock.strategies.launchers.xla import torch_xla_environment
from interlock.strategies.module_wrapper import StrategyModule
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


def _debug_checks(debug: bool) -> None:
    """With ``debug``, torch_xla's debug checks in this process (``PT_XLA_DEBUG_LEVEL=2``,
    unless the variable is set already)."""
    if debug:
        os.environ.setdefault("PT_XLA_DEBUG_LEVEL", "2")


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
    """One process on one XLA device (torch_xla picks which).

    Args:
        debug: turn on torch_xla's debug checks (``PT_XLA_DEBUG_LEVEL=2``).
    """

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
        _debug_checks(self.debug)
        self.accelerator.setup_device(self.root_device)


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
        _debug_checks(self.debug)
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

    def setup_module(self, module: nn.Module) -> StrategyModule:
        set_up = super().setup_module(module)
        return XLAFSDPModule(set_up.forward_module, set_up.module, self.precision)

    def _parameters_by_name(self, module: StrategyModule) -> dict[str, nn.Parameter]:
        # torch_xla's FSDP takes the parameters out of the user's module and keeps a
        # sharded one for each under another name, which remembers the original
        return {name: shard for name, (_, shard) in _shards(module.forward_module).items()}

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
        its digest unless ``verify=False``.

        All or nothing, like every strategy's load: a file that lacks an entry or does
        not fit the modules and optimizers (keys, shapes, dtypes) is refused before
        anything changes, and a restore that fails half-way is rolled back."""
        file = Path(path) / f"rank-{self.global_rank}.pt"
        checkpoint = load_with(self.checkpoint_io, file, map_location="cpu",
                               weights_only=weights_only, verify=verify)
        problem = missing_entries(path, checkpoint, state)
        if problem is not None:
            raise CheckpointLoadError(str(path), problem)
        shards = {name: _module_shards(file, name, checkpoint[name])
                  for name, target in state.items() if isinstance(target, nn.Module)}
        # the shards live in the FSDP wrappers, not in the user's modules inside them;
        # plain values reach ``state`` only once the whole restore has succeeded
        live = {name: getattr(value, "forward_module", value) if name in shards else value
                for name, value in state.items()}
        problem = describe_misfits(file, [
            why for name in shards
            for why in _layout_misfits(name, checkpoint[name], live[name])])
        if problem is not None:
            raise CheckpointLoadError(str(path), problem)
        refuse_misfits(file, live, {**checkpoint, **shards})
        saved_random = checkpoint.pop(RANDOM_KEY, None)
        with restoring(self, path, live):
            for name, shard in shards.items():
                live[name].load_state_dict(shard)
            for name, target in live.items():
                if isinstance(target, Optimizer):
                    target.load_state_dict(checkpoint[name])
            rest = restore_plain(self, live, {
                k: v for k, v in checkpoint.items()
                if not isinstance(live.get(k), (nn.Module, Optimizer))})
            if isinstance(saved_random, dict):  # this rank's own, saved in its own file
                random_state.restore_own(saved_random, self.root_device)
        state.update((name, value) for name, value in live.items() if name not in shards)
        return rest


def _layout_misfits(name: str, entry: dict[str, Any], live: nn.Module) -> list[str]:
    """Why the shards saved in ``entry`` are not those of ``live`` (XLA's FSDP wrapper).

    Its shards are flat and padded (to a multiple of 128 elements), so their shapes alone
    cannot tell a Linear(4, 3) from a Linear(4, 5): the shard metadata holds each
    parameter's original size, and the world size the shards were cut for."""
    layout = getattr(live, "get_shard_metadata", None)
    saved = entry.get("shard_metadata")
    if layout is None or not isinstance(saved, dict):
        return []
    own = layout()
    if saved.get("world_size") != own["world_size"]:
        return [f"module {name!r}: saved as shards of {saved.get('world_size')} rank(s), "
                f"this run has {own['world_size']}: load it at the world size it was saved "
                "at, or consolidate it first (torch_xla's "
                "consolidate_sharded_model_checkpoints)"]
    own_sizes, saved_sizes = _original_sizes(own), _original_sizes(saved)
    problems = [f"module {name!r}: {key}: saved shape {saved_sizes[key]}, this model has "
                f"{own_sizes[key]}" for key in saved_sizes.keys() & own_sizes.keys()
                if saved_sizes[key] != own_sizes[key]]
    problems += [f"module {name!r}: {key}: in the checkpoint, not in this model"
                 for key in saved_sizes.keys() - own_sizes.keys()]
    problems += [f"module {name!r}: {key}: not in the checkpoint"
                 for key in own_sizes.keys() - saved_sizes.keys()]
    return sorted(problems)


def _original_name(prefix: str, name: str) -> str:
    """A parameter's name in the user's module, from its name in torch_xla's FSDP
    wrappers (which insert ``_fsdp_wrapped_module`` and ``_fpw_module`` levels)."""
    path = f"{prefix}.{name}" if prefix else name
    return ".".join(part for part in path.split(".")
                    if part and part not in ("_fsdp_wrapped_module", "_fpw_module"))


def _original_sizes(metadata: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each sharded parameter's name in the user's module and its size before sharding,
    from XLA FSDP shard metadata."""
    sizes: dict[str, tuple[int, ...]] = {}
    info = metadata.get("shard_info")
    for module_name, per_module in info.items() if isinstance(info, dict) else ():
        for param in per_module.values() if isinstance(per_module, dict) else ():
            if isinstance(param, dict) and "_orig_name" in param:
                key = _original_name(str(module_name), str(param["_orig_name"]))
                sizes[key] = tuple(param.get("_orig_size", ()))
    return sizes


def _module_shards(file: Path, name: str, entry: object) -> Mapping[str, Any]:
    """The state dict of a module's shards in an XLA FSDP file's entry ``name``."""
    model = entry.get("model") if isinstance(entry, dict) else None
    if not isinstance(model, Mapping):
        raise CheckpointLoadError(
            str(file), f"{str(file)!r}: entry {name!r} is not a module's shards as "
            "xla_fsdp saves them (a dict with 'model' and 'shard_metadata'): load a "
            "checkpoint this strategy saved, at the same world size")
    return model


class XLAFSDPModule(StrategyModule):
    """The module `XLAFSDPStrategy.setup_module` returns.

    torch_xla's FSDP takes the parameters out of the user's module and keeps one flat,
    padded shard of each per rank. ``state_dict`` gathers them back into full tensors
    keyed as in the user's module (tied parameters under each of their names, buffers
    included) and ``load_state_dict`` gives each rank its slice of full tensors: like
    DeepSpeed's stage 3, both are collectives, to call on every rank.
    """

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        # the buffers: XLA's FSDP leaves them in the user's module
        state = self.module.state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        with torch.no_grad():
            for name, full in _gathered(self.forward_module).items():
                state[prefix + name] = full
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        if not isinstance(state_dict, Mapping):
            raise TypeError("load_state_dict() takes a state dict (a mapping of names to "
                            f"tensors), got {type(state_dict).__name__}")
        shards = _shards(self.forward_module)
        tied = _tied(self.forward_module)
        rest = {k: v for k, v in state_dict.items() if k not in shards and k not in tied}
        missing = [name for name in shards if name not in state_dict]
        problems = [f"size mismatch for {name}: copying a param with shape "
                    f"{tuple(state_dict[name].shape)} from checkpoint, the shape in current "
                    f"model is {tuple(shard._orig_size)}"
                    for name, (_, shard) in shards.items()
                    if name in state_dict and tuple(state_dict[name].shape)
                    != tuple(shard._orig_size)]
        if problems or (strict and missing):
            problems += [f"missing key {name!r}" for name in missing]
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self.module).__name__}"
                               f": {'; '.join(problems)}")
        result = self.module.load_state_dict(rest, strict=strict, assign=assign)
        with torch.no_grad():
            for name, (unit, shard) in shards.items():
                if name in state_dict:
                    full = state_dict[name].detach().to(shard.device, shard.dtype)
                    shard.copy_(unit._get_shard(full))
        result.missing_keys[:0] = missing
        return result


def _shards(root: nn.Module) -> dict[str, tuple[Any, Any]]:
    """Each sharded parameter of torch_xla's FSDP units under ``root``, by its name in
    the user's module, with the unit that holds it (both torch_xla's objects)."""
    return {_original_name(prefix, shard._orig_name): (unit, shard)
            for prefix, unit in root.named_modules()
            for shard in getattr(unit, "sharded_params", ())}


def _tied(root: nn.Module) -> dict[str, str]:
    """The second and later names of tied parameters, each with the name it shares."""
    return {_original_name(prefix, f"{name}.{attr}"): _original_name(prefix, f"{owner}.{first}")
            for prefix, unit in root.named_modules()
            for name, owner, _, attr, _, first in getattr(unit, "shared_full_param_infos", ())}


def _gathered(root: nn.Module) -> dict[str, torch.Tensor]:
    """The full parameters, gathered from every rank's shard the way torch_xla's FSDP
    gathers them for forward (a collective), in the shards' dtype."""
    full: dict[str, torch.Tensor] = {}
    for name, (unit, shard) in _shards(root).items():
        size: torch.Size = shard._orig_size
        gather = functools.partial(unit.all_gather_op, groups=unit.sharding_groups)
        if unit._shard_param_on_dim_0:
            full[name] = gather(shard.detach())[:size[0]]
        elif unit._shard_size_multiple == 1:
            full[name] = gather(shard.detach())[:size.numel()].view(size)
        else:
            rows = shard.detach().view(-1, unit._shard_size_multiple)
            full[name] = gather(rows).flatten()[:size.numel()].view(size)
    for name, same in _tied(root).items():
        full[name] = full[same]
    return full


def _shard_state(value: Any) -> Any:
    if isinstance(value, nn.Module):
        inner = getattr(value, "forward_module", value)
        metadata = getattr(inner, "get_shard_metadata")()  # noqa: B009 - XLA FSDP only
        return {"model": inner.state_dict(), "shard_metadata": metadata}
    if isinstance(value, Optimizer):
        return value.state_dict()
    return value
