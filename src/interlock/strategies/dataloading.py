"""Data loaders for a strategy: every data-parallel rank reads its share of the data.

Words used here:

- *replicas*: ``strategy.data_parallel_size``, the number of different batches a step
  sees; ranks that share a batch (tensor-parallel peers) are one replica.
- *order*: the indices (or, for a custom batch sampler, the batches) of one epoch,
  the same on every rank.
- *share*: what one replica takes of the order: every ``replicas``-th item from its
  rank. Training pads the order by repeating it from the start (or, with
  ``drop_last``, cuts its tail) so every replica gets as many items; evaluation takes
  the order as it is, each item once, the counts differing by at most one.

What the loader had decides the order (docs/runtime.md has the full table):

- a ``RandomSampler`` over the whole dataset: a permutation seeded with
  ``seed + epoch``, as torch's DistributedSampler; a ``SequentialSampler``: the indices.
- any other sampler: replayed in full on every rank under torch's global generator
  seeded from the agreed seed and the epoch (then restored); a plain ``BatchSampler``
  is taken apart into its sampler; a custom batch sampler shares out whole batches.
- a sampler that knows its rank (``num_replicas`` and ``rank``): kept, once checked.
- an ``IterableDataset`` over several replicas, or a ``DataLoader`` subclass that would
  have to be rebuilt: refused with a ``ValueError`` that says what to do.

Workers: the rebuilt loader's generator, from which torch draws each epoch's worker
base seed, is seeded per data-parallel rank, unless ``seed_everything(workers=False)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from interlock.seeding import derive_seed, seed_workers_enabled

if TYPE_CHECKING:
    from interlock.strategies.collectives import Collective

T = TypeVar("T")


class LoaderStrategy(Protocol):
    """What sharding a loader needs of a strategy (`interlock.strategies.base.Strategy`,
    which calls these functions, and so is not imported here)."""

    @property
    def world_size(self) -> int: ...
    @property
    def data_parallel_size(self) -> int: ...
    @property
    def data_parallel_rank(self) -> int: ...
    @property
    def collective(self) -> Collective: ...

    def batch_to_device(self, batch: Any) -> Any: ...

    def broadcast(self, obj: T, src: int = 0) -> T: ...

__all__ = ["ShardSampler", "StrategyDataLoader", "setup_dataloader", "shard", "shard_loader",
           "shard_size"]

#: ``pad``: training without drop_last; ``drop``: training with drop_last;
#: ``stride``: evaluation (no item twice, counts may differ by one)
ShareMode = Literal["pad", "drop", "stride"]

# tags that keep the seeds derived from one agreed seed apart
_ORDER, _WORKERS = 1, 2


class StrategyDataLoader:
    """What ``Strategy.setup_dataloader`` returns: its loader, one epoch per ``iter()``.

    Each ``iter()`` starts the next epoch (first 0): the sampler's epoch is set before
    any index is drawn, so shuffling differs from epoch to epoch, and is the same on
    every rank for one epoch, without calling ``set_epoch``. Batches go through
    ``strategy.batch_to_device`` when ``move_to_device`` is set.

    Attributes:
        loader: the ``DataLoader`` iterated (the original one in a single process).
        evaluation: whether the shares are uneven and free of duplicates.
        move_to_device: whether batches are moved to the strategy's root device.
    """

    def __init__(self, loader: DataLoader[Any], strategy: LoaderStrategy, *, move_to_device: bool,
                 evaluation: bool) -> None:
        self.loader = loader
        self.evaluation = evaluation
        self.move_to_device = move_to_device
        self._strategy = strategy
        self._epoch = 0

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next (when resuming), then count on from it."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch({epoch!r}): an epoch is an int >= 0")
        self._epoch = epoch

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
        return self.loader.batch_size

    @property
    def sampler(self) -> Any:
        return self.loader.sampler

    @property
    def batch_sampler(self) -> Any:
        return self.loader.batch_sampler

    def __len__(self) -> int:
        """Batches this rank gets per epoch."""
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch
        self._epoch += 1
        batch_sampler = self.loader.batch_sampler
        for part in {id(p): p for p in (self.loader.sampler, batch_sampler,
                                        getattr(batch_sampler, "sampler", None))}.values():
            _set_epoch(part, epoch)
        # created now, not lazily: worker processes prefetch indices as soon as they start
        batches = iter(self.loader)
        if not self.move_to_device:
            return batches
        return (self._strategy.batch_to_device(batch) for batch in batches)

    def __repr__(self) -> str:
        return (f"StrategyDataLoader(batches={len(self)}, epoch={self._epoch}, "
                f"evaluation={self.evaluation})")


def setup_dataloader(strategy: LoaderStrategy, loader: DataLoader[Any], *,
                     move_to_device: bool = True, evaluation: bool = False
                     ) -> StrategyDataLoader:
    """``loader`` for this rank (what ``Strategy.setup_dataloader`` does).

    In a single process the loader is kept as it is. With several processes it is
    rebuilt with a :class:`ShardSampler` over the data-parallel ranks; the shuffle seed
    is agreed with one broadcast, so every rank must call this, in the same order.

    Raises:
        TypeError: ``loader`` is not a ``torch.utils.data.DataLoader``.
        ValueError: for what cannot be shared faithfully, saying what to do instead.
        RuntimeError: several processes, but called outside ``strategy.launch``.
    """
    if isinstance(loader, StrategyDataLoader):
        raise TypeError("this loader was set up already: pass the original DataLoader")
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"setup_dataloader expects a torch.utils.data.DataLoader, got "
            f"{type(loader).__name__}"
        )
    for flag, value in (("move_to_device", move_to_device), ("evaluation", evaluation)):
        if not isinstance(value, bool):
            raise TypeError(f"setup_dataloader({flag}={value!r}): expected True or False")
    replicas, rank = strategy.data_parallel_size, strategy.data_parallel_rank
    if strategy.world_size > 1:
        loader = _for_this_rank(strategy, loader, replicas, rank, evaluation)
    return StrategyDataLoader(loader, strategy, move_to_device=move_to_device,
                              evaluation=evaluation)


def _for_this_rank(strategy: LoaderStrategy, loader: DataLoader[Any], replicas: int, rank: int,
                   evaluation: bool) -> DataLoader[Any]:
    if isinstance(loader.dataset, IterableDataset):
        if replicas == 1:
            return loader  # tensor-parallel peers: each reads the whole (same) stream
        raise ValueError(
            f"setup_dataloader cannot split {type(loader.dataset).__name__}, an "
            f"IterableDataset, over {replicas} data-parallel ranks: a stream has no "
            "indices to share out. Make the dataset yield only this rank's part "
            "(strategy.data_parallel_rank of strategy.data_parallel_size; in workers also "
            "torch.utils.data.get_worker_info()), the same number of batches on every "
            "rank when training, and move its batches with strategy.batch_to_device"
        )
    sampler, batch_sampler, _, _ = _parts(loader)
    sharded = next((p for p in (sampler, batch_sampler) if _is_sharded(p)), None)
    if sharded is not None:
        _check_sharded(sharded, replicas, rank, evaluation)
        return loader
    if type(loader) is not DataLoader:
        raise ValueError(
            f"setup_dataloader rebuilds the loader with a distributed sampler, and cannot "
            f"rebuild {type(loader).__name__} (a DataLoader subclass) faithfully: pass a "
            "plain torch.utils.data.DataLoader, or give yours a "
            "DistributedSampler(dataset, num_replicas=strategy.data_parallel_size, "
            "rank=strategy.data_parallel_rank) and setup_dataloader keeps it as it is"
        )
    if not strategy.collective.is_initialized:
        raise RuntimeError(
            f"setup_dataloader with {strategy.world_size} processes runs in each of them: "
            "call it inside the function given to strategy.launch (the ranks agree there "
            "on a shuffle seed)"
        )
    # peek, do not draw: setting a loader up leaves every random stream where it was
    seed = strategy.broadcast(derive_seed(_peek(_shuffle_generator(loader, sampler)),
                                          _next_setup(strategy)), src=0)
    worker_seed = derive_seed(seed, _WORKERS, rank) if seed_workers_enabled() else None
    return shard_loader(loader, replicas=replicas, rank=rank, seed=seed,
                        evaluation=evaluation, worker_seed=worker_seed)


#: the attribute a strategy keeps its count of loaders set up in (absent: none yet)
_SETUPS = "_loader_setups"


def _next_setup(strategy: LoaderStrategy) -> int:
    """How many loaders this attempt set up before this one (each loader's shuffle seed
    mixes it in, so loaders set up one after another shuffle apart). Kept on the
    strategy and counted from 0 again at every launch and attempt: rank 0 of the script
    launcher runs them all in one process, and a count that lived on would change the
    data order of a restarted attempt."""
    count = int(getattr(strategy, _SETUPS, 0))
    setattr(strategy, _SETUPS, count + 1)
    return count


def shard_loader(loader: DataLoader[Any], *, replicas: int, rank: int, seed: int,
                 evaluation: bool = False, worker_seed: int | None = None) -> DataLoader[Any]:
    """A new DataLoader like ``loader`` whose sampler takes share ``rank`` of ``replicas``.

    Everything else the loader was given is kept: batch size, drop_last, shuffling,
    workers, collate_fn, pinning, worker_init_fn, prefetching, persistent workers, the
    multiprocessing context. The caller makes sure that ``seed`` is the same on every
    rank.

    Args:
        loader: a plain map-style DataLoader.
        replicas, rank: how many shares, and which one this is.
        seed: the epoch orders derive from it (``seed + epoch`` shuffles, as torch's
            DistributedSampler does; a custom sampler runs with torch's global
            generator seeded from it).
        evaluation: each item once (uneven shares) instead of equal shares.
        worker_seed: seeds the new loader's generator, from which each epoch's worker
            base seed is drawn; None keeps the loader's generator.
    """
    if not 0 <= rank < replicas:
        raise ValueError(f"rank {rank} is not one of {replicas} data-parallel ranks")
    sampler, batch_sampler, batch_size, drop_last = _parts(loader)
    if batch_sampler is not None:
        # whole batches are shared out; torch allows no drop_last beside a batch_sampler
        mode: ShareMode = "stride" if evaluation else "pad"
        batches = ShardSampler(_Replayed(batch_sampler, seed), replicas=replicas, rank=rank,
                               mode=mode)
        return _rebuilt(loader, batch_sampler=batches, generator_seed=worker_seed)
    mode = "stride" if evaluation else "drop" if drop_last else "pad"
    indices = ShardSampler(_order_of(loader, sampler, seed), replicas=replicas, rank=rank,
                           mode=mode)
    return _rebuilt(loader, sampler=indices, batch_size=batch_size, drop_last=drop_last,
                    generator_seed=worker_seed)


class _Order(Protocol):
    """One epoch's items, the same on every rank."""

    def __len__(self) -> int: ...

    def items(self, epoch: int) -> Sequence[Any]: ...


class ShardSampler(Sampler[Any]):
    """One replica's share of an epoch's order (indices, or whole batches).

    Args:
        order: gives each epoch's full order, the same on every rank.
        replicas, rank: how many shares, and which one this is.
        mode: ``pad``, ``drop`` or ``stride`` (see :func:`shard`).
    """

    def __init__(self, order: _Order, *, replicas: int, rank: int, mode: ShareMode) -> None:
        super().__init__()
        self.order = order
        self.replicas = replicas
        self.rank = rank
        self.mode: ShareMode = mode
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        return iter(shard(self.order.items(self.epoch), self.replicas, self.rank, self.mode))

    def __len__(self) -> int:
        return shard_size(len(self.order), self.replicas, self.rank, self.mode)


def shard(items: Sequence[Any], replicas: int, rank: int, mode: ShareMode) -> list[Any]:
    """Share ``rank`` of ``items``: every ``replicas``-th item, from the ``rank``-th.

    ``pad`` first repeats ``items`` from the start until every share is as long,
    ``drop`` first cuts the tail that does not divide evenly, ``stride`` does neither.
    """
    n = len(items)
    if mode == "pad" and n % replicas:
        items = list(itertools.islice(itertools.cycle(items), -(-n // replicas) * replicas))
    elif mode == "drop":
        items = items[: n - n % replicas]
    return list(items[rank::replicas])


def shard_size(n: int, replicas: int, rank: int, mode: ShareMode) -> int:
    """``len(shard(items, replicas, rank, mode))`` for ``n`` items."""
    if mode == "pad":
        return -(-n // replicas)
    if mode == "drop":
        return n // replicas
    return len(range(rank, n, replicas))


class _Permutation:
    """A shuffle: ``randperm`` seeded with ``seed + epoch`` (torch's DistributedSampler's)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def items(self, epoch: int) -> list[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        order: list[int] = torch.randperm(self.n, generator=generator).tolist()
        return order


class _Sequential:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def items(self, epoch: int) -> range:
        return range(self.n)


class _Replayed:
    """The user's sampler (or batch sampler) iterated in full, every rank alike.

    It runs with torch's global generator seeded from the agreed seed and the epoch
    (and restored afterwards), so samplers drawing from it agree across ranks and
    change from epoch to epoch.
    """

    def __init__(self, sampler: Iterable[Any], seed: int) -> None:
        self.sampler, self.seed = sampler, seed

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def items(self, epoch: int) -> list[Any]:
        _set_epoch(self.sampler, epoch)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(derive_seed(self.seed, _ORDER, epoch))
            return list(self.sampler)


def _parts(loader: DataLoader[Any]) -> tuple[Any, Any, int | None, bool]:
    """``(sampler, custom batch sampler or None, batch_size, drop_last)`` of ``loader``;
    a plain ``BatchSampler`` the user passed is taken apart, so that single indices
    (not whole batches) are shared out."""
    given = loader.batch_sampler
    if given is not None and loader.batch_size is None:
        if type(given) is BatchSampler:
            return given.sampler, None, given.batch_size, given.drop_last
        return None, given, None, False
    return loader.sampler, None, loader.batch_size, loader.drop_last


def _order_of(loader: DataLoader[Any], sampler: Any, seed: int) -> _Order:
    dataset: object = loader.dataset
    if type(sampler) is SequentialSampler and sampler.data_source is dataset:
        return _Sequential(len(sampler))
    if (type(sampler) is RandomSampler and sampler.data_source is dataset
            and not sampler.replacement and sampler.num_samples == len(sampler.data_source)):
        # 63 bits, so that adding the epoch stays within what manual_seed accepts
        return _Permutation(len(sampler), derive_seed(seed, _ORDER) >> 1)
    # anything else (a subset, weights, replacement, the user's own) is replayed
    return _Replayed(sampler, seed)


def _shuffle_generator(loader: DataLoader[Any], sampler: Any) -> torch.Generator | None:
    """The generator the original loader would have shuffled with (None: torch's)."""
    own = getattr(sampler, "generator", None)
    if isinstance(own, torch.Generator):
        return own
    return loader.generator if isinstance(loader.generator, torch.Generator) else None


def _peek(generator: torch.Generator | None) -> int:
    """The next 62 random bits of ``generator`` (torch's default one for None), left
    unconsumed."""
    source = generator if generator is not None else torch.default_generator
    copy = torch.Generator(device=source.device)
    copy.set_state(source.get_state())
    return int(torch.randint(2**62, (), generator=copy, device=source.device).item())


def _is_sharded(part: Any) -> bool:
    """Whether a sampler already knows its rank (torch's DistributedSampler does)."""
    return part is not None and hasattr(part, "num_replicas") and hasattr(part, "rank")


def _check_sharded(part: Any, replicas: int, rank: int, evaluation: bool) -> None:
    name = type(part).__name__
    if evaluation:
        raise ValueError(
            f"setup_dataloader(evaluation=True) promises every sample exactly once, which "
            f"the loader's {name} (it knows its rank already, and may pad) cannot: pass the "
            "loader with a plain sampler, and setup_dataloader shares it out without "
            "duplicates"
        )
    if (part.num_replicas, part.rank) != (replicas, rank):
        raise ValueError(
            f"the loader's {name} has num_replicas={part.num_replicas}, rank={part.rank}, "
            f"but this process is data-parallel rank {rank} of {replicas}: create it with "
            "num_replicas=strategy.data_parallel_size, rank=strategy.data_parallel_rank "
            "(not the global rank: tensor-parallel peers share a batch), or pass a plain "
            "sampler and let setup_dataloader share it out"
        )


def _rebuilt(loader: DataLoader[Any], *, sampler: Sampler[Any] | None = None,
             batch_sampler: Sampler[Any] | None = None, batch_size: int | None = 1,
             drop_last: bool = False, generator_seed: int | None) -> DataLoader[Any]:
    generator = loader.generator
    if generator_seed is not None:
        generator = torch.Generator()
        generator.manual_seed(generator_seed)
    options: dict[str, Any] = {name: getattr(loader, name) for name in (
        "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
        "multiprocessing_context", "prefetch_factor", "persistent_workers",
        "pin_memory_device", "in_order") if hasattr(loader, name)}  # in_order: torch >= 2.6
    options["generator"] = generator
    if batch_sampler is not None:
        return DataLoader(loader.dataset, batch_sampler=batch_sampler, **options)
    return DataLoader(loader.dataset, batch_size=batch_size, sampler=sampler,
                      drop_last=drop_last, **options)


def _set_epoch(part: Any, epoch: int) -> None:
    set_epoch = getattr(part, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
