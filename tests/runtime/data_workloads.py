"""What launched ranks run for test_dataloading.py (module level, so spawn could import it).

Loaders are described by plain dicts (``spec``) and built inside the ranks; each
function returns what every rank saw, gathered, so that the test compares ranks.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Iterator
from typing import Any

import numpy
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, SubsetRandomSampler

import interlock
from interlock.strategies.base import Strategy


class Numbers(Dataset[int]):
    """Sample ``i`` is the int ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class Draws(Dataset[dict[str, int]]):
    """Sample ``i`` says which worker made it and what that worker's generators draw."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, int]:
        info = torch.utils.data.get_worker_info()
        return {
            "index": index,
            "worker": -1 if info is None else info.id,
            "torch_seed": torch.initial_seed(),
            "python": random.getrandbits(32),
            "numpy": int(numpy.random.randint(2**31)),
            "torch": int(torch.randint(2**31, ()).item()),
            "pid": os.getpid(),
        }


class FixedBatches(Sampler[list[int]]):
    """A custom batch sampler: the same uneven batches every epoch."""

    def __init__(self, batches: list[list[int]]) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


def keep(batch: list[Any]) -> list[Any]:
    """A collate_fn that keeps samples as they are (seeds exceed int64)."""
    return batch


#: ten samples in five uneven batches
UNEVEN_BATCHES = [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9], [10]]


def make_loader(spec: dict[str, Any]) -> DataLoader[Any]:
    """A DataLoader over ``Numbers(spec["n"])``; ``sampler`` names a custom one."""
    options = {k: v for k, v in spec.items() if k not in ("n", "sampler", "evaluation")}
    dataset = Numbers(spec["n"])
    if spec.get("sampler") == "subset_random":  # draws from torch's global generator
        options["sampler"] = SubsetRandomSampler(range(spec["n"]))
    elif spec.get("sampler") == "uneven_batches":
        options["batch_sampler"] = FixedBatches(UNEVEN_BATCHES)
    return DataLoader(dataset, **options)


def flat(batch: Any) -> list[int]:
    """A batch's sample ids (a lone sample without a batch dimension too)."""
    if isinstance(batch, int) or (isinstance(batch, torch.Tensor) and batch.dim() == 0):
        return [int(batch)]
    return [int(i) for i in batch]


def epochs(strategy: Strategy, specs: dict[str, dict[str, Any]], count: int) -> dict[str, Any]:
    """The sample ids of every batch each rank got, ``count`` epochs per loader.

    Each rank seeds torch differently first: whatever the ranks agree on comes from
    setup_dataloader, not from identical generators.
    """
    torch.manual_seed(1000 + strategy.global_rank)
    seen: dict[str, Any] = {}
    for name, spec in specs.items():
        loader = strategy.setup_dataloader(make_loader(spec),
                                           evaluation=bool(spec.get("evaluation")))
        order = getattr(loader.loader.sampler, "order", None)
        seen[name] = {
            "len": len(loader),
            "epochs": [[flat(batch) for batch in loader] for _ in range(count)],
            "seed": getattr(order, "seed", None),
        }
    return {"ranks": strategy.collective.all_gather_object(seen)}


def worker_draws(strategy: Strategy, seed: int) -> dict[str, Any]:
    """Draws made in two workers per rank: with per-rank worker seeding (the default)
    and with ``workers=False``; plus what seed_everything returns in a rank."""
    out: dict[str, Any] = {}
    for name, workers in (("seeded", True), ("torch_default", False)):
        interlock.seed_everything(seed, workers=workers)
        loader = strategy.setup_dataloader(
            DataLoader(Draws(8), batch_size=1, num_workers=2, collate_fn=keep))
        out[name] = [sample for batch in loader for sample in batch]
    out["offset_seed"] = interlock.seed_everything(seed, rank_offset=True)
    out["reused_seed"] = interlock.seed_everything()
    return {"ranks": strategy.collective.all_gather_object(out)}


def peers(strategy: Strategy) -> dict[str, Any]:
    """Batches and worker draws of a shuffled loader with workers, ranks seeded apart."""
    torch.manual_seed(strategy.global_rank)
    loader = strategy.setup_dataloader(
        DataLoader(Draws(8), batch_size=2, shuffle=True, num_workers=2, collate_fn=keep))
    epochs = [list(loader) for _ in range(2)]
    seen = {
        "replicas": (strategy.data_parallel_size, strategy.data_parallel_rank),
        "epochs": [[[(s["index"], s["torch_seed"]) for s in batch] for batch in epoch]
                   for epoch in epochs],
        "pids": sorted({s["pid"] for epoch in epochs for batch in epoch for s in batch}),
    }
    return {"ranks": strategy.collective.all_gather_object(seen)}


def output(strategy: Strategy) -> None:
    """Print and log from every rank, to the real stdout and stderr."""
    rank = strategy.global_rank
    handler = logging.StreamHandler(sys.stderr)
    log = logging.getLogger("interlock_tests.rank_zero")
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        strategy.print(f"strategy.print from rank {rank}", flush=True)
        print(f"plain print from rank {rank}", flush=True)
        interlock.rank_zero_logger("interlock_tests.rank_zero").info("logged by rank %d", rank)
        log.info("plain log from rank %d", rank)
        handler.flush()
        strategy.barrier()
    finally:
        log.removeHandler(handler)
