"""Strategy.setup_dataloader: every data-parallel rank reads its share, epoch after epoch.

The sharing rules are checked in this process over simulated ranks (against torch's
DistributedSampler where it is the reference); real 2-rank gloo runs check what only
real processes show: the ranks agreeing on a shuffle without identical generators,
the epoch advancing on its own, workers seeded apart, tensor-parallel peers sharing
batches, and no process left behind.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import data_workloads as dw
import pytest
import torch
from harness import launch_forked
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from typeguard import suppress_type_checks

import interlock
from interlock.strategies.base import Strategy
from interlock.strategies.dataloading import (
    ShardSampler,
    StrategyDataLoader,
    setup_dataloader,
    shard,
    shard_loader,
)
from interlock.strategies.model_parallel import ModelParallelStrategy

# ------------------------------------------------------------------ helpers


def single() -> Strategy:
    return interlock.resolve(accelerator="cpu", devices=1, strategy="single_device",
                             machine=interlock.Machine())


def two_ranks(name: str = "ddp_fork") -> Strategy:
    """A 2-rank strategy (not launched: this process sees itself as rank 0 of 2)."""
    return interlock.resolve(accelerator="cpu", devices=2, strategy=name,
                             machine=interlock.Machine())


def ids(loader: Any, epochs: int = 1) -> list[list[list[int]]]:
    """The sample ids of every batch, per epoch."""
    return [[dw.flat(batch) for batch in loader] for _ in range(epochs)]


def flatten(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


class Ranks:
    """Stands in for one rank of a strategy whose ranks form tensor-parallel groups of
    ``tp`` (``data_parallel_size = world_size // tp``); ``shared`` plays the broadcast
    (the first rank to call it is rank 0)."""

    def __init__(self, global_rank: int, world_size: int, tp: int,
                 shared: dict[str, Any]) -> None:
        self.global_rank, self.world_size, self._tp, self._shared = (
            global_rank, world_size, tp, shared)

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self._tp

    @property
    def data_parallel_rank(self) -> int:
        return self.global_rank // self._tp

    @property
    def collective(self) -> Any:
        return self  # a process group that exists

    is_initialized = True

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self._shared.setdefault("value", obj)

    def batch_to_device(self, batch: Any) -> Any:
        return batch


def simulated(world_size: int, tp: int) -> list[Strategy]:
    shared: dict[str, Any] = {}
    return [cast(Strategy, Ranks(r, world_size, tp, shared)) for r in range(world_size)]


def assert_gone(pids: set[int], seconds: float = 10.0) -> None:
    """No process in ``pids`` is alive (zombies count as gone), within ``seconds``."""
    deadline = time.monotonic() + seconds
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _running(p)}
        time.sleep(0.1)
    assert not alive, f"DataLoader worker processes still running after launch: {alive}"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ------------------------------------------------------------------ one process


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_single_process_gets_the_original_loader(num_workers: int) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(dw.Draws(10), batch_size=4, shuffle=True, num_workers=num_workers,
                          collate_fn=dw.keep, generator=torch.Generator().manual_seed(3))

    pids: set[int] = set()

    def batches(source: Any) -> list[list[list[tuple[int, int, int]]]]:
        random.seed(0)  # what the main process draws (num_workers=0) from Python's random
        seen = [list(source) for _ in range(2)]
        pids.update(s["pid"] for epoch in seen for batch in epoch for s in batch)
        return [[[(s["index"], s["torch_seed"], s["python"]) for s in batch]
                 for batch in epoch] for epoch in seen]

    original = loader()
    set_up = single().setup_dataloader(original)
    assert set_up.loader is original, "a single process must keep the loader object"
    assert len(set_up) == len(original) == 3
    assert batches(set_up) == batches(loader()), (
        "one process: the set-up loader's batches differ from a plain DataLoader's with "
        "the same generator seed")
    assert_gone(pids - {os.getpid()})


def test_setting_up_consumes_no_random_numbers() -> None:
    before = torch.get_rng_state()
    for strategy in simulated(2, 1):
        setup_dataloader(strategy, DataLoader(dw.Numbers(10), shuffle=True))
    assert torch.equal(torch.get_rng_state(), before), "setup_dataloader drew from torch's RNG"


# (torch refuses drop_last without a batch_size)
@pytest.mark.parametrize(("batch_size", "drop_last"), [(3, False), (3, True), (None, False)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("n", "replicas"), [(10, 2), (10, 3), (7, 4), (1, 2), (12, 3)])
def test_training_shares_match_torchs_distributed_sampler(
    n: int, replicas: int, shuffle: bool, drop_last: bool, batch_size: int | None
) -> None:
    dataset = dw.Numbers(n)
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
    for rank in range(replicas):
        ours = shard_loader(plain, replicas=replicas, rank=rank, seed=42)
        seed = getattr(ours.sampler.order, "seed", 0)  # type: ignore[attr-defined]
        reference: DistributedSampler[int] = DistributedSampler(
            dataset, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        expected_loader = DataLoader(dataset, batch_size=batch_size, sampler=reference,
                                     drop_last=drop_last)
        for epoch in range(3):
            ours.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            reference.set_epoch(epoch)
            got, expected = ids(ours)[0], ids(expected_loader)[0]
            assert got == expected, (
                f"n={n} replicas={replicas} rank={rank} epoch={epoch} shuffle={shuffle} "
                f"drop_last={drop_last}: {got} != DistributedSampler's {expected}")
            assert len(ours) == len(got), f"len() says {len(ours)}, iteration gave {len(got)}"


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("n", "replicas"), [(10, 3), (11, 2), (2, 3), (9, 3)])
def test_evaluation_gives_every_sample_exactly_once(n: int, replicas: int,
                                                   shuffle: bool) -> None:
    plain = DataLoader(dw.Numbers(n), batch_size=2, shuffle=shuffle)
    shares = []
    for rank in range(replicas):
        loader = shard_loader(plain, replicas=replicas, rank=rank, seed=7, evaluation=True)
        batches = ids(loader)[0]
        assert len(loader) == len(batches), f"rank {rank}: len() {len(loader)} != {batches}"
        shares.append(flatten(batches))
    assert sorted(flatten(shares)) == list(range(n)), f"evaluation shares {shares}"
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1, f"evaluation shares are too uneven: {sizes}"


def test_shard_pads_drops_and_strides() -> None:
    items = list(range(7))
    assert [shard(items, 3, r, "pad") for r in range(3)] == [[0, 3, 6], [1, 4, 0], [2, 5, 1]]
    assert [shard(items, 3, r, "drop") for r in range(3)] == [[0, 3], [1, 4], [2, 5]]
    assert [shard(items, 3, r, "stride") for r in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [shard([9], 3, r, "pad") for r in range(3)] == [[9], [9], [9]]
    assert [shard([], 2, r, "pad") for r in range(2)] == [[], []]


def test_a_custom_sampler_is_replayed_alike_on_every_rank() -> None:
    """SubsetRandomSampler draws from torch's global generator: each rank's differs,
    yet the shares must split one order, and the global generator is left alone."""
    plain = DataLoader(dw.Numbers(9), batch_size=2, sampler=SubsetRandomSampler(range(9)))
    orders = []
    for epoch in range(2):
        shares = []
        for rank in range(2):
            # worker_seed: the loader's own generator draws the workers' base seed
            loader = shard_loader(plain, replicas=2, rank=rank, seed=5, worker_seed=1)
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            torch.manual_seed(100 + rank)
            before = torch.get_rng_state()
            shares.append(flatten(ids(loader)[0]))
            assert torch.equal(torch.get_rng_state(), before), "the global RNG was consumed"
        assert len(shares[0]) == len(shares[1]) == 5, f"unequal training shares {shares}"
        assert set(shares[0] + shares[1]) == set(range(9)), (
            f"epoch {epoch}: the ranks replayed different orders: {shares}")
        orders.append(shares)
    assert orders[0] != orders[1], "the custom sampler's order did not change with the epoch"


def test_a_sampler_with_replacement_is_shared_out_not_reshuffled() -> None:
    weights = [1.0] * 6
    plain = DataLoader(dw.Numbers(6), batch_size=3,
                       sampler=WeightedRandomSampler(weights, num_samples=8, replacement=True))
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        runs.append([flatten(ids(shard_loader(plain, replicas=2, rank=r, seed=5))[0])
                     for r in range(2)])
    assert runs[0] == runs[1], f"shares depend on the rank's own generator: {runs}"
    assert [len(s) for s in runs[0]] == [4, 4], runs[0]


@pytest.mark.parametrize(("evaluation", "expected"), [
    (False, [[[0, 1, 2], [4, 5], [10]], [[3], [6, 7, 8, 9], [0, 1, 2]]]),
    (True, [[[0, 1, 2], [4, 5], [10]], [[3], [6, 7, 8, 9]]]),
])
def test_a_custom_batch_sampler_shares_whole_batches(evaluation: bool,
                                                     expected: list[Any]) -> None:
    plain = dw.make_loader({"n": 11, "sampler": "uneven_batches"})
    got = [ids(shard_loader(plain, replicas=2, rank=r, seed=0, evaluation=evaluation))[0]
           for r in range(2)]
    assert got == expected, f"evaluation={evaluation}: {got}"
    lengths = [len(shard_loader(plain, replicas=2, rank=r, seed=0, evaluation=evaluation))
               for r in range(2)]
    assert lengths == [len(e) for e in expected]


def test_a_plain_batch_sampler_is_taken_apart_into_indices() -> None:
    dataset = dw.Numbers(7)
    given = DataLoader(dataset,
                       batch_sampler=BatchSampler(SequentialSampler(dataset), 2, False))
    got = [ids(shard_loader(given, replicas=2, rank=r, seed=0))[0] for r in range(2)]
    assert got == [[[0, 2], [4, 6]], [[1, 3], [5, 0]]], got


def test_the_loaders_options_are_kept() -> None:
    def init(worker_id: int) -> None:
        pass

    original = DataLoader(dw.Numbers(10), batch_size=3, shuffle=True, drop_last=True,
                          num_workers=2, collate_fn=dw.keep, pin_memory=False, timeout=5.0,
                          worker_init_fn=init, multiprocessing_context="fork",
                          prefetch_factor=3, persistent_workers=True, in_order=False)
    kept = shard_loader(original, replicas=2, rank=1, seed=0)
    for option in ("batch_size", "drop_last", "num_workers", "collate_fn", "pin_memory",
                   "timeout", "worker_init_fn", "prefetch_factor", "persistent_workers",
                   "in_order", "multiprocessing_context", "generator", "dataset"):
        assert getattr(kept, option) == getattr(original, option), option
    assert isinstance(kept.sampler, ShardSampler) and kept.sampler.mode == "drop"
    reseeded = shard_loader(original, replicas=2, rank=1, seed=0, worker_seed=99)
    assert reseeded.generator is not None and reseeded.generator.initial_seed() == 99


def test_tensor_parallel_peers_share_batches_and_replicas_split_the_data() -> None:
    """4 ranks in tensor-parallel pairs: 2 data-parallel replicas."""
    ranks = simulated(4, 2)
    got = [ids(setup_dataloader(s, DataLoader(dw.Numbers(10), batch_size=2, shuffle=True)), 2)
           for s in ranks]
    assert got[0] == got[1] and got[2] == got[3], f"peers read different batches: {got}"
    for epoch in range(2):
        first, second = flatten(got[0][epoch]), flatten(got[2][epoch])
        assert sorted(first + second) == list(range(10)), (
            f"epoch {epoch}: the replicas' shares {first} and {second} are not the dataset")
    assert got[0][0] != got[0][1], "the epoch did not advance on its own"


def test_an_iterable_dataset_is_kept_for_one_replica_and_refused_for_more() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

    loader = DataLoader(Stream(), batch_size=2)
    assert setup_dataloader(simulated(2, 2)[1], loader).loader is loader
    with pytest.raises(ValueError, match=r"cannot split Stream, an IterableDataset, over 2 "
                       r"data-parallel ranks.*strategy\.data_parallel_rank"):
        two_ranks().setup_dataloader(loader)


def test_what_cannot_be_shared_faithfully_is_refused_with_what_to_do() -> None:
    strategy = two_ranks()
    dataset = dw.Numbers(10)

    class Custom(DataLoader[Any]):
        pass

    with pytest.raises(ValueError, match=r"cannot rebuild Custom .*DistributedSampler"):
        strategy.setup_dataloader(Custom(dataset))
    wrong = DataLoader(dataset, sampler=DistributedSampler(dataset, num_replicas=2, rank=1))
    with pytest.raises(ValueError, match=r"num_replicas=2, rank=1, but this process is "
                       r"data-parallel rank 0 of 2"):
        strategy.setup_dataloader(wrong)
    right = DataLoader(dataset, sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    assert strategy.setup_dataloader(right).loader is right, "a matching sampler is kept"
    with pytest.raises(ValueError, match=r"evaluation=True\) promises every sample exactly "
                       "once"):
        strategy.setup_dataloader(right, evaluation=True)
    with pytest.raises(ValueError, match="at least one DataLoader"):
        strategy.setup_dataloaders()
    with pytest.raises(RuntimeError, match=r"call it inside the function given to "
                       r"strategy\.launch"):
        strategy.setup_dataloader(DataLoader(dataset, shuffle=True))
    with pytest.raises(ValueError, match="rank 2 is not one of 2"):
        shard_loader(DataLoader(dataset), replicas=2, rank=2, seed=0)
    done = single().setup_dataloader(DataLoader(dataset))
    with pytest.raises(ValueError, match="an epoch is an int >= 0"):
        done.set_epoch(-1)
    with suppress_type_checks():
        with pytest.raises(TypeError, match="set up already"):
            single().setup_dataloader(done)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"expects a torch\.utils\.data\.DataLoader, got list"):
            single().setup_dataloader([1, 2])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="evaluation='yes'"):
            single().setup_dataloader(DataLoader(dataset), evaluation="yes")  # type: ignore[arg-type]


def test_batches_go_through_batch_to_device(monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = single()
    monkeypatch.setattr(strategy, "batch_to_device", lambda batch: ("moved", batch.tolist()))
    moved, kept = strategy.setup_dataloaders(DataLoader(dw.Numbers(4), batch_size=2),
                                             DataLoader(dw.Numbers(4), batch_size=2))
    assert list(moved) == [("moved", [0, 1]), ("moved", [2, 3])]
    kept.move_to_device = False
    assert [b.tolist() for b in kept] == [[0, 1], [2, 3]]


def test_each_iteration_is_the_next_epoch_and_set_epoch_resumes() -> None:
    class Recording(SequentialSampler):
        def __init__(self, data: Any) -> None:
            super().__init__(data)
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

    sampler = Recording(dw.Numbers(4))
    loader = single().setup_dataloader(DataLoader(dw.Numbers(4), sampler=sampler))
    for _ in range(2):
        list(loader)
    iter(loader)  # started, never consumed: still an epoch
    assert sampler.epochs == [0, 1, 2] and loader.epoch == 3
    loader.set_epoch(7)
    list(loader)
    assert sampler.epochs[-1] == 7 and loader.epoch == 8
    assert isinstance(loader, StrategyDataLoader) and "epoch=8" in repr(loader)


# ------------------------------------------------------------------ real ranks

CASES: dict[str, dict[str, Any]] = {
    "shuffle": {"n": 10, "batch_size": 3, "shuffle": True},
    "shuffle_drop_last": {"n": 11, "batch_size": 2, "shuffle": True, "drop_last": True},
    "evaluation": {"n": 11, "batch_size": 2, "evaluation": True},
    "custom_sampler": {"n": 9, "batch_size": 2, "sampler": "subset_random"},
    "custom_batches": {"n": 11, "sampler": "uneven_batches"},
}


@pytest.mark.timeout(90)
def test_two_ranks_agree_on_each_epoch_and_share_it_out() -> None:
    ranks = two_ranks().launch(dw.epochs, CASES, 3)["ranks"]
    for name, spec in CASES.items():
        seen = [r[name] for r in ranks]
        for rank, view in enumerate(seen):
            for epoch, batches in enumerate(view["epochs"]):
                assert view["len"] == len(batches), (
                    f"{name}: rank {rank} epoch {epoch}: len() {view['len']} but "
                    f"{len(batches)} batches")
        evaluation = bool(spec.get("evaluation"))
        if not evaluation:
            assert seen[0]["len"] == seen[1]["len"], f"{name}: unequal batch counts {seen}"
        orders = []
        for epoch in range(3):
            shares = [flatten(view["epochs"][epoch]) for view in seen]
            everything = sorted(shares[0] + shares[1])
            if evaluation:
                assert everything == list(range(spec["n"])), f"{name} epoch {epoch}: {shares}"
            elif spec.get("drop_last"):
                # each rank: n // 2 samples, in full batches only
                full = spec["n"] // 2 // spec["batch_size"] * spec["batch_size"]
                assert len(set(everything)) == len(everything) == 2 * full, (
                    f"{name} epoch {epoch}: drop_last shares {shares}")
            else:
                assert set(everything) == set(range(spec["n"])), f"{name} {epoch}: {shares}"
                if "batch_size" in spec:
                    assert len(shares[0]) == len(shares[1]), f"{name} {epoch}: {shares}"
            orders.append(shares)
        if spec.get("shuffle") or spec.get("sampler") == "subset_random":
            assert orders[0] != orders[1] != orders[2], f"{name}: epochs repeat: {orders}"
        if spec.get("shuffle"):
            seed = seen[0]["seed"]
            assert seen[1]["seed"] == seed, f"{name}: the ranks shuffle with different seeds"
            for rank in range(2):
                reference: DistributedSampler[int] = DistributedSampler(
                    dw.Numbers(spec["n"]), 2, rank, seed=seed,
                    drop_last=bool(spec.get("drop_last")))
                for epoch in range(3):
                    reference.set_epoch(epoch)
                    expected = list(reference)
                    got = flatten(seen[rank]["epochs"][epoch])
                    if spec.get("drop_last"):
                        expected = expected[: len(expected) // spec["batch_size"]
                                            * spec["batch_size"]]
                    assert got == expected, f"{name} rank {rank} epoch {epoch}: {got}"


def draws_by_worker(samples: list[dict[str, int]]) -> dict[int, set[tuple[int, ...]]]:
    by: dict[int, set[tuple[int, ...]]] = {}
    for s in samples:
        by.setdefault(s["worker"], set()).add((s["torch_seed"],))
    return by


@pytest.mark.timeout(120)
def test_workers_are_seeded_apart_per_rank_and_worker_and_reproducibly() -> None:
    runs = [two_ranks().launch(dw.worker_draws, 7)["ranks"] for _ in range(2)]
    first = runs[0]
    seeds = {(rank, s["worker"]): s["torch_seed"]
             for rank, view in enumerate(first) for s in view["seeded"]}
    assert sorted(seeds) == [(0, 0), (0, 1), (1, 0), (1, 1)], seeds
    assert len(set(seeds.values())) == 4, f"workers share seeds: {seeds}"
    for kind in ("python", "numpy", "torch"):
        draws = [s[kind] for view in first for s in view["seeded"]]
        assert len(set(draws)) == len(draws), f"{kind} draws repeat across workers: {draws}"
    default = {(rank, s["worker"]): s["torch_seed"]
               for rank, view in enumerate(first) for s in view["torch_default"]}
    assert default[0, 0] == default[1, 0], (
        "with workers=False and identically seeded ranks, torch gives rank 1's workers "
        f"rank 0's seeds (this is what the default prevents): {default}")

    def without_pids(run: list[dict[str, Any]]) -> list[Any]:
        return [[{k: v for k, v in s.items() if k != "pid"} for s in view["seeded"]]
                for view in run]

    assert without_pids(runs[0]) == without_pids(runs[1]), "worker draws are not reproducible"
    assert [view["offset_seed"] for view in first] == [7, 8]
    assert [view["reused_seed"] for view in first] == [7, 7]
    pids = set()
    for run in runs:
        mine = {s["pid"] for view in run for kind in ("seeded", "torch_default")
                for s in view[kind]}
        assert len(mine) == 8, f"expected 2 workers x 2 ranks x 2 loaders: {mine}"
        pids |= mine
    assert_gone(pids)


@pytest.mark.timeout(120)
def test_model_parallel_tensor_peers_read_the_same_batches_and_worker_seeds() -> None:
    strategy = interlock.resolve(
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
        accelerator="cpu", devices=2, machine=interlock.Machine())
    assert isinstance(strategy, ModelParallelStrategy)
    ranks = launch_forked(strategy, dw.peers)["ranks"]
    assert_gone({pid for r in ranks for pid in r["pids"]})
    assert [r["replicas"] for r in ranks] == [(1, 0), (1, 0)], "expected one replica"
    assert ranks[0]["epochs"] == ranks[1]["epochs"], (
        "tensor-parallel peers (ranks seeded apart) read different batches or worker seeds")
    for epoch in ranks[0]["epochs"]:
        assert sorted(i for batch in epoch for i, _ in batch) == list(range(8))
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]


@pytest.mark.timeout(90)
def test_print_and_the_rank_zero_logger_write_on_rank_zero_only(
    capfd: pytest.CaptureFixture[str],
) -> None:
    two_ranks().launch(dw.output)
    out, err = capfd.readouterr()
    assert "plain print from rank 0" in out and "plain print from rank 1" in out, (
        f"the ranks' output was not captured, so the test proves nothing:\n{out}")
    assert "plain log from rank 1" in err, err
    assert out.count("strategy.print from rank 0") == 1, out
    assert "strategy.print from rank 1" not in out, out
    assert err.count("logged by rank 0") == 1, err
    assert "logged by rank 1" not in err, err

