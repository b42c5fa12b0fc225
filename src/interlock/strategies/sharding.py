"""Helpers the sharded strategies share: meta-device materialisation, activation
checkpointing, and norms of sharded gradients."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` lives on the meta device."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


@torch.no_grad()
def materialize_meta(module: nn.Module, device: torch.device) -> None:
    """Allocate the meta tensors of a (sharded) module and initialise them.

    Only the local shards are allocated; tensors already on a real device (buffers
    built by ``__init__``) keep their values. Every submodule with a
    ``reset_parameters`` method runs it; parameters of modules without one are left
    uninitialised, as after ``torch.empty``, and are meant to be loaded from a
    checkpoint.

    A submodule whose parameters are sharded (DTensors) is reset on full-size
    temporary parameters, of which each rank keeps its own slice: drawing random
    numbers into the local shards directly would give every shard the same values
    wherever DTensor has no random-number tracker (CPU meshes, CPU-offloaded shards).
    With every rank on one random stream (:func:`rank0_random_stream`), the sharded
    module then holds exactly what ``reset_parameters()`` gives one process. The peak
    is one submodule's full parameters, not the model's.
    """
    module._apply(  # type: ignore[no-untyped-call]
        lambda t: torch.empty_like(t, device=device) if t.is_meta else t
    )
    for sub in module.modules():
        reset = getattr(sub, "reset_parameters", None)
        if not callable(reset):
            continue
        sharded: dict[str, DTensor] = {
            n: p for n, p in sub._parameters.items() if isinstance(p, DTensor)  # type: ignore[misc]
        }
        if not sharded:
            reset()
            continue
        originals = dict(sub._parameters)
        for name, param in sharded.items():
            local = param.to_local()
            sub._parameters[name] = nn.Parameter(
                torch.empty(param.shape, dtype=local.dtype, device=local.device),
                requires_grad=param.requires_grad)
        try:
            reset()
            for name, param in sharded.items():
                full = sub._parameters[name]
                if full is None:
                    continue
                mine = distribute_tensor(full.detach(), param.device_mesh, param.placements,
                                         src_data_rank=None)  # every rank holds the same
                param.to_local().copy_(mine.to_local())
        finally:
            sub._parameters.update(originals)


@torch.no_grad()
def make_storage_private(module: nn.Module) -> None:
    """Give every CPU parameter and buffer of ``module`` that lives in shared memory a
    private copy, in place (parameter objects are kept, so optimizers created over
    them still step them).

    Shared memory is how torch's multiprocessing hands tensors to other processes
    (``share_memory_()``, a queue, a spawned process's arguments): if the ranks of one
    node all held such a storage, every rank's optimizer would update the same
    numbers and each step would be applied once per rank.
    """
    for sub in module.modules():
        for param in sub.parameters(recurse=False):
            if in_shared_memory(param):
                param.data = param.data.clone()
        for name, buffer in sub.named_buffers(recurse=False):
            if in_shared_memory(buffer):
                sub._buffers[name] = buffer.clone()


def in_shared_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s CPU storage is in shared memory (another process may write
    it). A sharded tensor (DTensor) is never: its shards were allocated by this rank."""
    # is_shared() is always true for CUDA tensors: only CPU storage is in question
    return (not isinstance(tensor, DTensor) and tensor.device.type == "cpu"
            and bool(tensor.is_shared()))  # type: ignore[no-untyped-call]


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module) -> None:
    """Give every rank rank 0's values of the module's real parameters and buffers.

    What DDP does when it wraps a module, for the strategies that shard it instead:
    without it each rank's shard would come from that rank's own initialisation, and
    replicated (tensor-parallel) parameters would differ between ranks. Meta tensors
    are skipped (see :func:`rank0_random_stream`).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    # parameters() yields a tied parameter once; an expanded view (stride 0) cannot be
    # written element by element, and is a view of something broadcast anyway
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_meta or isinstance(tensor, DTensor) or 0 in tensor.stride():
            continue
        if tensor.is_contiguous():
            dist.broadcast(tensor.detach(), src=0)
        else:
            values = tensor.detach().contiguous()
            dist.broadcast(values, src=0)
            tensor.detach().copy_(values)


@contextlib.contextmanager
def rank0_random_stream(device: torch.device) -> Iterator[None]:
    """Inside the block every rank draws random numbers from one stream, seeded by
    rank 0; the caller's random state is restored afterwards.

    Parameters initialised on the meta device get their values from
    ``reset_parameters()`` after sharding: with one stream, replicated parameters
    are equal on every rank and no rank's own seed decides a shard.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        yield
        return
    # manual_seed reseeds every CUDA device: restore them all
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        # drawn inside: the caller's random state is left exactly as it was
        seed = [int(torch.randint(0, 2**62, ()).item())]
        dist.broadcast_object_list(seed, src=0)
        torch.manual_seed(seed[0])
        yield


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


def _norm_groups(grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``grads`` grouped so that each group is one kind of tensor: DTensors of one mesh
    and placement each, plain tensors by device (a foreach kernel takes one kind).

    Meshes are told apart by what they are (equal meshes span the same ranks), not by
    object: a long-lived process may hold two equal mesh objects, and every rank must
    group alike, or their collectives would not match."""
    groups: dict[tuple[object, ...], list[torch.Tensor]] = {}
    for grad in grads:
        key: tuple[object, ...] = ((grad.device_mesh, tuple(grad.placements))
                                   if isinstance(grad, DTensor) else ("local", grad.device))
        groups.setdefault(key, []).append(grad)
    return list(groups.values())


@torch.no_grad()
def clip_grad_norm(parameters: Sequence[torch.Tensor], max_norm: float, norm_type: float,
                   *, device: torch.device,
                   stages: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Clip the gradients of ``parameters`` by their total ``norm_type``-norm; return
    that norm (a plain tensor) before clipping.

    The norm is the one a single process would compute over the whole model:

    - gradients of different kinds (plain tensors beside DTensors of a tensor-parallel
      plan that left a layer replicated, DTensors of different meshes under FSDP x TP)
      are measured group by group, each sharded group over its whole mesh, and the
      group norms combined;
    - under pipeline parallel each rank holds one stage's parameters: ``stages`` is the
      pipeline group, over which the stages' norms are combined (sum of p-th powers, or
      the max), so that every stage measures the whole model and clips with the same
      coefficient.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    groups = _norm_groups(grads)
    if stages is None and len(groups) <= 1:
        # one kind of gradient: torch's own clip, as it has always been
        return total_norm(torch.nn.utils.clip_grad_norm_(parameters, max_norm,
                                                         norm_type=norm_type))
    p = float(norm_type)
    parts = [total_norm(torch.nn.utils.get_total_norm(g, p)).float().to(device)
             for g in groups]
    norm = (torch.linalg.vector_norm(torch.stack(parts), p) if parts
            else torch.zeros((), device=device))
    if stages is not None:
        if p == float("inf"):
            dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=stages)
        else:
            powered = norm.pow(p)
            dist.all_reduce(powered, op=dist.ReduceOp.SUM, group=stages)
            norm = powered.pow(1.0 / p)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for grad in grads:
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        by_device.setdefault(local.device, []).append(local)
    for where, tensors in by_device.items():
        torch._foreach_mul_(tensors, coefficient.to(where))
    return norm
