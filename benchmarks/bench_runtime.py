"""The strategy runtime next to raw torch.distributed and Lightning Fabric.

Four measurements, one run, one machine:

1. **DDP step time.** The same MLP, data and loop on 2 gloo CPU ranks, written three
   ways: through ``interlock.resolve(strategy="ddp_fork")``, with raw torch
   (``torch.multiprocessing`` fork, ``init_process_group("gloo")``,
   ``DistributedDataParallel``), and with ``lightning.fabric.Fabric(strategy="ddp_fork")``.
   Rank 0 times blocks of steps: a barrier, ``--block-steps`` steps, a barrier, and the
   elapsed time divided by the number of steps (so rank 1's last backward and step are
   inside the block, and one barrier per block is included in the figure). Warm-up steps
   are not timed. The three variants run in rotated order, round after round, so a slow
   stretch of the machine hits each of them; the ratio to raw torch is taken within each
   round and its median reported with the range over the rounds.
2. **Launch to first barrier.** Wall time from the parent's call to ``launch`` until every
   rank has passed its first barrier (each rank reads ``time.perf_counter()``, a
   system-wide monotonic clock on Linux, right after the barrier; the latest of them
   counts), for interlock's fork and spawn launchers, raw
   ``torch.multiprocessing.start_processes`` with the same start method, and Fabric.
3. **resolve() vs ``_Connector``.** ``interlock.resolve(...)`` (plan + build: the
   strategy and all its parts) against Lightning's ``_Connector(...)``, which also
   builds them, on the same flags, interleaved call by call; memoised and cold plans.
4. **What each library adds per step.** The loop of section 1 on a 16x16 layer in one
   process and one thread, where a step is almost nothing but Python dispatch, so the
   difference to raw torch is each library's own per-step cost without the noise of
   real work. This is what can tell a 0.1% overhead from a 3% one on a machine whose
   step times move by several percent from one launch to the next.

Run it on a quiet machine: the figures move with anything else using the cores; the
1-minute load average at the start and end is printed with the results.

Lightning is a benchmark-only dependency: it is imported here, never by interlock.

Usage::

    python benchmarks/bench_runtime.py --json runtime.json
    python benchmarks/bench_runtime.py --only resolve --resolve-repeat 5000
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import itertools
import json
import logging
import math
import os
import platform
import socket
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

# torch is imported at module level on purpose: spawned children re-import this script,
# and every variant's children need torch anyway. interlock and lightning are imported
# only where they are used, so that a raw-torch child never pays for either.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

STEP_OVERHEAD_TARGET = 1.03  # interlock step time at most 3% above raw DDP
LAUNCH_OVERHEAD_TARGET = 1.10  # interlock launch-to-first-barrier at most 10% above raw
RESOLVE_SPEEDUP_TARGET = 5.0  # resolve() at least 5x faster than _Connector

WORLD_SIZE = 2
HOST = "127.0.0.1"


# --------------------------------------------------------------------------- helpers


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), math.ceil(q / 100.0 * len(ordered))))
    return ordered[rank - 1]


def _mad(values: list[float]) -> float:
    """Median absolute deviation from the median: a spread one bad round cannot inflate."""
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values)


def _free_port() -> int:
    """A port that was free a moment ago (what a raw torch script typically does)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def _restored_environ() -> Iterator[None]:
    """Undo the variables a launch sets in the parent (Fabric sets MASTER_PORT there)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Mute Lightning's INFO lines and warnings (mixed precision, rewritten flags).

    Muting makes Lightning slightly faster than a default run, which only works against
    interlock's ratio.
    """
    import lightning_utilities.core.rank_zero as rank_zero_module

    loggers = [rank_zero_module.log, logging.getLogger("lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


# --------------------------------------------------------------------------- model, data, loop


@dataclass(frozen=True)
class StepConfig:
    """What every variant trains; pickled into the workers."""

    in_features: int = 1024
    hidden: int = 1024
    layers: int = 3
    classes: int = 10
    batch: int = 64
    distinct_batches: int = 8
    warmup: int = 10
    blocks: int = 8
    block_steps: int = 10
    lr: float = 0.01
    threads: int = 1  # torch.set_num_threads in each rank; 0 leaves what the launcher set
    seed: int = 0

    def parameters(self) -> int:
        dims = [self.in_features] + [self.hidden] * self.layers + [self.classes]
        return sum(a * b + b for a, b in itertools.pairwise(dims))


def _build_model(cfg: StepConfig) -> nn.Module:
    torch.manual_seed(cfg.seed)  # identical weights in every rank and every variant
    dims = [cfg.in_features] + [cfg.hidden] * cfg.layers
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(cfg.hidden, cfg.classes))
    return nn.Sequential(*layers)


def _make_batches(cfg: StepConfig, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pre-made batches, different per rank, identical across variants."""
    gen = torch.Generator().manual_seed(1000 + rank)
    return [
        (
            torch.randn(cfg.batch, cfg.in_features, generator=gen),
            torch.randint(0, cfg.classes, (cfg.batch,), generator=gen),
        )
        for _ in range(cfg.distinct_batches)
    ]


def _set_threads(cfg: StepConfig) -> int:
    """Apply cfg.threads; returns the thread count the launcher left this rank with."""
    before = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    return before


def _train(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    barrier: Callable[[], None],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    cfg: StepConfig,
) -> dict[str, Any]:
    """Warm up, then time blocks of steps between barriers (in this rank)."""
    i = 0
    loss = torch.zeros(())
    for _ in range(cfg.warmup):
        loss = step(*batches[i % len(batches)])
        i += 1
    block_s: list[float] = []
    step_s: list[float] = []
    for _ in range(cfg.blocks):
        barrier()
        start = time.perf_counter()
        for _ in range(cfg.block_steps):
            t = time.perf_counter()
            loss = step(*batches[i % len(batches)])
            step_s.append(time.perf_counter() - t)
            i += 1
        barrier()
        block_s.append((time.perf_counter() - start) / cfg.block_steps)
    return {"block_s": block_s, "step_s": step_s, "final_loss": float(loss.item())}


# --------------------------------------------------------------------------- 1. step workers


def _interlock_steps(strategy: Any, cfg: StepConfig) -> dict[str, Any]:
    threads = _set_threads(cfg)
    model = strategy.setup_module(_build_model(cfg))
    optimizer = strategy.setup_optimizer(
        torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        return loss.detach()

    out = _train(step, strategy.barrier, _make_batches(cfg, strategy.global_rank), cfg)
    out["threads_at_entry"] = threads
    out["wrapper"] = type(getattr(model, "forward_module", model)).__name__
    return out


def _raw_steps(rank: int, cfg: StepConfig, port: int, results: Any) -> None:
    threads = _set_threads(cfg)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = HOST, str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    model = nn.parallel.DistributedDataParallel(_build_model(cfg))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    out = _train(step, dist.barrier, _make_batches(cfg, rank), cfg)
    dist.destroy_process_group()
    out["threads_at_entry"] = threads
    out["wrapper"] = type(model).__name__
    if rank == 0:
        results.put(out)


def _fabric_steps(fabric: Any, cfg: StepConfig) -> dict[str, Any]:
    threads = _set_threads(cfg)
    model = _build_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        return loss.detach()

    out = _train(step, fabric.barrier, _make_batches(cfg, fabric.global_rank), cfg)
    out["threads_at_entry"] = threads
    out["wrapper"] = type(model._forward_module).__name__
    return out


def _run_steps(variant: str, cfg: StepConfig) -> dict[str, Any]:
    """One launch of one variant; rank 0's timings."""
    with _restored_environ():
        if variant == "interlock":
            import interlock

            strategy = interlock.resolve(accelerator="cpu", devices=WORLD_SIZE, strategy="ddp_fork")
            result: dict[str, Any] = strategy.launch(_interlock_steps, cfg)
            return result
        if variant == "raw torch":
            ctx = mp.get_context("fork")
            results = ctx.SimpleQueue()
            mp.start_processes(
                _raw_steps,
                args=(cfg, _free_port(), results),
                nprocs=WORLD_SIZE,
                start_method="fork",
            )
            result = results.get()
            return result
        if variant == "fabric":
            from lightning.fabric import Fabric

            with _quiet_lightning():
                fabric = Fabric(accelerator="cpu", devices=WORLD_SIZE, strategy="ddp_fork")
                result = fabric.launch(_fabric_steps, cfg)
            return result
    raise ValueError(variant)


STEP_VARIANTS = ("interlock", "raw torch", "fabric")


def bench_steps(cfg: StepConfig, rounds: int, variants: tuple[str, ...]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    orders = []
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        orders.append(list(order))
        for variant in order:
            out = _run_steps(variant, cfg)
            runs[variant].append(out)
            print(
                f"  round {r + 1}/{rounds} {variant:<10} "
                f"{statistics.median(out['block_s']) * 1e3:7.2f} ms/step",
                file=sys.stderr,
                flush=True,
            )

    summary: dict[str, Any] = {}
    for variant, outs in runs.items():
        pooled = [b for o in outs for b in o["block_s"]]
        steps = [s for o in outs for s in o["step_s"]]
        round_medians = [statistics.median(o["block_s"]) for o in outs]
        med = statistics.median(pooled)
        summary[variant] = {
            "median_ms": med * 1e3,
            "round_medians_ms": [m * 1e3 for m in round_medians],
            "round_spread_pct": (max(round_medians) - min(round_medians)) / med * 100,
            "round_mad_pct": _mad(round_medians) / med * 100,
            "block_p10_ms": _percentile(pooled, 10) * 1e3,
            "block_p90_ms": _percentile(pooled, 90) * 1e3,
            "single_step_p90_ms": _percentile(steps, 90) * 1e3,
            "threads_at_entry": sorted({o["threads_at_entry"] for o in outs}),
            "wrapper": sorted({o["wrapper"] for o in outs}),
            "final_losses": [o["final_loss"] for o in outs],
        }
    if "raw torch" in runs:
        raw_rounds = summary["raw torch"]["round_medians_ms"]
        for variant in variants:
            paired = [
                a / b for a, b in zip(summary[variant]["round_medians_ms"], raw_rounds, strict=True)
            ]
            summary[variant]["ratio_to_raw"] = statistics.median(paired)
            summary[variant]["ratio_to_raw_rounds"] = paired
            summary[variant]["ratio_to_raw_mad"] = _mad(paired)
            summary[variant]["pooled_ratio_to_raw"] = (
                summary[variant]["median_ms"] / summary["raw torch"]["median_ms"]
            )
    return {
        "config": asdict(cfg),
        "parameters": cfg.parameters(),
        "rounds": rounds,
        "orders": orders,
        "variants": summary,
    }


# --------------------------------------------------------------------------- 2. launch workers


def _latest_barrier_exit(gather: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Read the clock (right after the caller's barrier) and return the latest rank's."""
    t = torch.tensor([time.perf_counter()], dtype=torch.float64)
    return float(gather(t).max())


def _interlock_first_barrier(strategy: Any) -> float:
    strategy.barrier()
    return _latest_barrier_exit(strategy.all_gather)


def _raw_gather(t: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.stack(parts)


def _raw_first_barrier(rank: int, rendezvous: tuple[str, int, bool], results: Any) -> None:
    host, port, parent_hosts_store = rendezvous
    if parent_hosts_store:
        store = dist.TCPStore(host, port, None, False, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)
        dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    dist.barrier()
    latest = _latest_barrier_exit(_raw_gather)
    dist.destroy_process_group()
    if rank == 0:
        results.put(latest)


def _fabric_first_barrier(fabric: Any) -> float:
    fabric.barrier()
    return _latest_barrier_exit(fabric.all_gather)


LAUNCH_VARIANTS = {
    # name: (library, start method, detail)
    "interlock ddp_fork": ("interlock", "fork", ""),
    "raw fork, env://": ("raw", "fork", "env"),
    "raw fork, store in parent": ("raw", "fork", "store"),
    "fabric ddp_fork": ("fabric", "fork", ""),
    "interlock ddp_spawn": ("interlock", "spawn", ""),
    "raw spawn, env://": ("raw", "spawn", "env"),
    "raw spawn, store in parent": ("raw", "spawn", "store"),
    "fabric ddp_spawn": ("fabric", "spawn", ""),
}


def _launch_once(name: str) -> tuple[float, float]:
    """Seconds to the last rank's first barrier exit, and to launch() returning."""
    library, method, detail = LAUNCH_VARIANTS[name]
    with _restored_environ():
        if library == "interlock":
            import interlock

            strategy = interlock.resolve(
                accelerator="cpu", devices=WORLD_SIZE, strategy=f"ddp_{method}"
            )
            start = time.perf_counter()
            latest = strategy.launch(_interlock_first_barrier)
        elif library == "raw":
            start = time.perf_counter()
            store = None
            if detail == "store":  # what interlock's launcher does: the parent binds port 0
                store = dist.TCPStore(HOST, 0, None, True, wait_for_workers=False)
                rendezvous = (HOST, int(store.port), True)
            else:
                rendezvous = (HOST, _free_port(), False)
            results = mp.get_context(method).SimpleQueue()
            mp.start_processes(
                _raw_first_barrier,
                args=(rendezvous, results),
                nprocs=WORLD_SIZE,
                start_method=method,
            )
            latest = results.get()
            del store
        else:
            from lightning.fabric import Fabric

            with _quiet_lightning():
                fabric = Fabric(accelerator="cpu", devices=WORLD_SIZE, strategy=f"ddp_{method}")
                start = time.perf_counter()
                latest = fabric.launch(_fabric_first_barrier)
        returned = time.perf_counter()
    return latest - start, returned - start


def bench_launch(repeats: dict[str, int], names: list[str]) -> dict[str, Any]:
    """Launch each variant ``repeats[start method]`` times, rotating the order."""
    for name in names:  # untimed: the parent's first launch pays one-off imports
        _launch_once(name)
    samples: dict[str, dict[str, list[float]]] = {
        n: {"barrier_ms": [], "returned_ms": []} for n in names
    }
    for method, count in repeats.items():
        group = [n for n in names if LAUNCH_VARIANTS[n][1] == method]
        for r in range(count):
            order = group[r % len(group) :] + group[: r % len(group)]
            if r % 2:
                order.reverse()
            for name in order:
                barrier_s, returned_s = _launch_once(name)
                samples[name]["barrier_ms"].append(barrier_s * 1e3)
                samples[name]["returned_ms"].append(returned_s * 1e3)
        print(f"  {method}: {count} launches per variant done", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    for name, s in samples.items():
        summary[name] = {
            "launches": len(s["barrier_ms"]),
            "median_ms": statistics.median(s["barrier_ms"]),
            "p25_ms": _percentile(s["barrier_ms"], 25),
            "p75_ms": _percentile(s["barrier_ms"], 75),
            "min_ms": min(s["barrier_ms"]),
            "max_ms": max(s["barrier_ms"]),
            "returned_median_ms": statistics.median(s["returned_ms"]),
            # whole-second stalls (on some VMs, a TCP connect to the store) hit every variant
            "over_5x_median": sum(
                x > 5 * statistics.median(s["barrier_ms"]) for x in s["barrier_ms"]
            ),
            "samples_ms": s["barrier_ms"],
            "returned_samples_ms": s["returned_ms"],
        }
    for name in names:
        _, method, _ = LAUNCH_VARIANTS[name]
        for base in ("env", "store"):
            ref = f"raw {method}, {'env://' if base == 'env' else 'store in parent'}"
            if ref in summary:
                summary[name][f"ratio_to_raw_{base}"] = (
                    summary[name]["median_ms"] / summary[ref]["median_ms"]
                )
    return {"repeats": repeats, "variants": summary}


# --------------------------------------------------------------------------- 3. resolve


RESOLVE_FLAG_SETS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "cpu x1, auto, 32-true",
        {"accelerator": "cpu", "devices": 1, "strategy": "auto", "precision": "32-true"},
    ),
    (
        "cpu x2, ddp, bf16-mixed",
        {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "precision": "bf16-mixed"},
    ),
    (
        "cpu x2, ddp_fork, 32-true",
        {"accelerator": "cpu", "devices": 2, "strategy": "ddp_fork", "precision": "32-true"},
    ),
    (
        "cpu x4, ddp_spawn, bf16-mixed",
        {"accelerator": "cpu", "devices": 4, "strategy": "ddp_spawn", "precision": "bf16-mixed"},
    ),
    (
        "cpu x2, ddp, 32-true, 2 nodes",
        {
            "accelerator": "cpu",
            "devices": 2,
            "strategy": "ddp",
            "precision": "32-true",
            "num_nodes": 2,
        },
    ),
    (
        "auto, auto, auto, 32-true",
        {"accelerator": "auto", "devices": "auto", "strategy": "auto", "precision": "32-true"},
    ),
)


def _describe_strategy(strategy: Any) -> str:
    launcher = strategy.launcher
    launcher_name = type(launcher).__name__ if launcher is not None else "None"
    method = getattr(launcher, "start_method", None) or getattr(launcher, "_start_method", None)
    if method:
        launcher_name += f"({method})"
    env = getattr(strategy, "cluster_environment", None)
    return (
        f"{type(strategy).__name__}, {type(strategy.precision).__name__}, "
        f"{type(env).__name__ if env is not None else '-'}, {launcher_name}, "
        f"world {strategy.world_size}"
    )


def _timed_ns(fn: Callable[[], Any]) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def bench_resolve(repeat: int, warmup: int) -> list[dict[str, Any]]:
    from lightning.fabric.connector import _Connector

    import interlock
    from interlock.engine.planner import clear_cache

    machine = interlock.Machine.probe()
    results = []
    for name, flags in RESOLVE_FLAG_SETS:

        def memoised(flags: dict[str, Any] = flags) -> Any:
            return interlock.resolve(**flags, machine=machine)

        def cold(flags: dict[str, Any] = flags) -> Any:
            clear_cache()  # every rule runs again, then build
            return interlock.resolve(**flags, machine=machine)

        def probed(flags: dict[str, Any] = flags) -> Any:
            return interlock.resolve(**flags)

        def lightning(flags: dict[str, Any] = flags) -> Any:
            return _Connector(**flags)

        contenders = {"memoised": memoised, "cold": cold, "probed": probed, "lightning": lightning}
        with _quiet_lightning():
            outcome = {
                "interlock": _describe_strategy(memoised()),
                "lightning": _describe_strategy(lightning().strategy),
            }
            ns: dict[str, list[int]] = {k: [] for k in contenders}
            for _ in range(warmup):
                for fn in contenders.values():
                    fn()
            gc.collect()
            gc_was_enabled = gc.isenabled()
            gc.disable()  # as timeit does; collected between flag sets instead
            try:
                for _ in range(repeat):
                    for key, fn in contenders.items():
                        ns[key].append(_timed_ns(fn))
            finally:
                if gc_was_enabled:
                    gc.enable()
            gc.collect()
        timings = {}
        for key, values in ns.items():
            us = [v / 1000.0 for v in values]
            timings[key] = {"median_us": statistics.median(us), "p90_us": _percentile(us, 90)}
        for key in ("memoised", "cold", "probed"):
            timings[key]["speedup"] = timings["lightning"]["median_us"] / timings[key]["median_us"]
        results.append({"name": name, "flags": flags, "outcome": outcome, "timings": timings})
    return results


# --------------------------------------------------------------------------- 4. dispatch cost


def bench_dispatch(repeat: int, warmup: int) -> dict[str, Any]:
    """Per-step Python cost of each library's wrappers, measured without the noise of work.

    One process, one thread, a 16x16 linear layer and a batch of 4, so a step is almost
    nothing but dispatch: the difference to raw torch is what the library adds to every
    step. interlock's single-device strategy is used; DDPStrategy runs the same
    ``StrategyModule.forward``, ``Strategy.backward`` and ``Strategy.optimizer_step`` code
    (it only adds the DistributedDataParallel wrap, which raw DDP has as well).
    """
    from lightning.fabric import Fabric

    import interlock

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    x = torch.randn(4, 16)
    y = torch.randint(0, 16, (4,))

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Linear(16, 16)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    raw_model, raw_opt = fresh()

    def raw() -> None:
        raw_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(raw_model(x), y)
        loss.backward()
        raw_opt.step()

    strategy = interlock.resolve(accelerator="cpu", devices=1)
    model, opt = fresh()
    il_model = strategy.setup_module(model)
    il_opt = strategy.setup_optimizer(opt)

    def il() -> None:
        il_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(il_model(x), y)
        strategy.backward(loss, il_model)
        strategy.optimizer_step(il_opt)

    contenders: dict[str, Callable[[], None]] = {"raw torch": raw, "interlock": il}
    with _quiet_lightning():
        fabric = Fabric(accelerator="cpu", devices=1)
        fb_model, fb_opt = fabric.setup(*fresh())

    def fb() -> None:
        fb_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fb_model(x), y)
        fabric.backward(loss)
        fb_opt.step()

    contenders["fabric"] = fb
    ns: dict[str, list[int]] = {k: [] for k in contenders}
    try:
        for _ in range(warmup):
            for fn in contenders.values():
                fn()
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(repeat):
                for key, fn in contenders.items():
                    ns[key].append(_timed_ns(fn))
        finally:
            if gc_was_enabled:
                gc.enable()
    finally:
        torch.set_num_threads(threads)
    summary = {
        k: {"median_us": statistics.median(v) / 1e3, "p90_us": _percentile(v, 90) / 1e3}
        for k, v in ns.items()
    }
    for k in contenders:
        summary[k]["added_us"] = summary[k]["median_us"] - summary["raw torch"]["median_us"]
    return {"repeat": repeat, "variants": summary}


# --------------------------------------------------------------------------- report


def _version(dist_name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return "not installed"


def _interlock_source() -> str:
    """Where interlock was imported from, with the commit when it is a git checkout.

    Other work may edit the source tree while this runs, and spawned ranks import it
    from disk again, so the report says exactly what was measured.
    """
    import subprocess

    import interlock

    where = os.path.dirname(os.path.dirname(os.path.abspath(interlock.__file__)))
    try:
        commit = subprocess.run(
            ["git", "-C", where, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return where
    return f"{where} @ {commit}{' + uncommitted changes' if dirty else ''}"


def environment_info() -> dict[str, Any]:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "lightning": _version("lightning"),
        "interlock": _version("interlock"),
        "interlock_source": _interlock_source(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def render_steps(steps: dict[str, Any]) -> list[str]:
    from tabulate import tabulate

    cfg = steps["config"]
    v = steps["variants"]
    out = [
        f"1. DDP training step, {WORLD_SIZE} gloo CPU ranks (fork), MLP "
        f"{cfg['in_features']}-{'-'.join([str(cfg['hidden'])] * cfg['layers'])}-"
        f"{cfg['classes']} ({steps['parameters'] / 1e6:.2f} M parameters), batch "
        f"{cfg['batch']}, SGD+momentum, {cfg['warmup']} warm-up steps, then "
        f"{cfg['blocks']} blocks x {cfg['block_steps']} steps per launch, "
        f"{steps['rounds']} rounds in rotated order; "
        f"threads per rank: {cfg['threads'] or 'as launched'}",
        "   per step = (barrier .. block of steps .. barrier) / steps, timed in rank 0",
    ]
    rows = []
    for name, s in v.items():
        ratio = s.get("ratio_to_raw")
        rounds = s.get("ratio_to_raw_rounds", [])
        rows.append(
            [
                name,
                f"{s['median_ms']:.2f}",
                f"{min(s['round_medians_ms']):.2f}-{max(s['round_medians_ms']):.2f}",
                f"{s['round_spread_pct']:.1f}% / {s['round_mad_pct']:.1f}%",
                f"{s['single_step_p90_ms']:.2f}",
                "" if ratio is None else f"{ratio:.3f} ({min(rounds):.3f}-{max(rounds):.3f})",
                ",".join(str(t) for t in s["threads_at_entry"]),
                ", ".join(s["wrapper"]),
                f"{s['final_losses'][0]:.6f}"
                + ("" if len(set(s["final_losses"])) == 1 else " (varies)"),
            ]
        )
    out.append(
        tabulate(
            rows,
            headers=[
                "variant",
                "median ms/step",
                "round medians",
                "round spread: range / MAD",
                "single-step p90 ms",
                "vs raw (per-round range)",
                "threads at entry",
                "wraps in",
                "final loss",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    if "interlock" in v and "raw torch" in v:
        ratio = v["interlock"]["ratio_to_raw"]
        rounds = v["interlock"]["ratio_to_raw_rounds"]
        resolvable = not (min(rounds) <= STEP_OVERHEAD_TARGET <= max(rounds))
        out.append(
            f"interlock / raw DDP: {ratio:.3f}, the median of per-round ratios (range "
            f"{min(rounds):.3f}-{max(rounds):.3f}, MAD {v['interlock']['ratio_to_raw_mad']:.3f}; "
            f"ratio of pooled medians {v['interlock']['pooled_ratio_to_raw']:.3f}). "
            f"Target <= {STEP_OVERHEAD_TARGET:.2f}: {_verdict(ratio <= STEP_OVERHEAD_TARGET)}"
            + ("" if resolvable else "; the per-round ratios straddle the target, see section 4")
        )
    losses = {name: s["final_losses"][0] for name, s in v.items()}
    if len(set(losses.values())) > 1:
        out.append(f"note: final losses differ between variants: {losses}")
    return out


def render_launch(launch: dict[str, Any]) -> list[str]:
    from tabulate import tabulate

    v = launch["variants"]
    reps = ", ".join(f"{n} {m}" for m, n in launch["repeats"].items())
    out = [
        f"2. Launch to first barrier ({WORLD_SIZE} ranks, gloo), median over launches "
        f"({reps} per variant, after one untimed launch each), milliseconds"
    ]
    rows = []
    for name, s in v.items():
        rows.append(
            [
                name,
                f"{s['median_ms']:.1f}",
                f"{s['p25_ms']:.1f}-{s['p75_ms']:.1f}",
                f"{s['min_ms']:.1f}-{s['max_ms']:.1f}",
                f"{s['over_5x_median']}/{s['launches']}",
                f"{s['returned_median_ms']:.1f}",
                f"{s['ratio_to_raw_env']:.2f}" if "ratio_to_raw_env" in s else "",
                f"{s['ratio_to_raw_store']:.2f}" if "ratio_to_raw_store" in s else "",
            ]
        )
    out.append(
        tabulate(
            rows,
            headers=[
                "variant",
                "median to barrier",
                "p25-p75",
                "min-max",
                "> 5x median",
                "median until launch() returns",
                "vs raw env://",
                "vs raw store in parent",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    for method in ("fork", "spawn"):
        s = v.get(f"interlock ddp_{method}")
        if s is None or "ratio_to_raw_env" not in s:
            continue
        env_ratio = s["ratio_to_raw_env"]
        store_ratio = s.get("ratio_to_raw_store", float("nan"))
        out.append(
            f"interlock ddp_{method} / raw {method}: {env_ratio:.2f} (env://), "
            f"{store_ratio:.2f} (store in parent). Target <= {LAUNCH_OVERHEAD_TARGET:.2f}: "
            f"{_verdict(env_ratio <= LAUNCH_OVERHEAD_TARGET)} against env://, "
            f"{_verdict(store_ratio <= LAUNCH_OVERHEAD_TARGET)} against store in parent"
        )
    return out


def render_resolve(results: list[dict[str, Any]], repeat: int) -> list[str]:
    from tabulate import tabulate

    out = ["3. resolve() (plan + build) vs Lightning _Connector, what each built:"]
    rows = []
    for r in results:
        rows.append([r["name"], "interlock", r["outcome"]["interlock"]])
        rows.append(["", "lightning", r["outcome"]["lightning"]])
    out.append(
        tabulate(
            rows,
            headers=["flags", "library", "strategy, precision, environment, launcher, world"],
            tablefmt="github",
        )
    )
    out.append("")
    out.append(
        f"   per call, microseconds, {repeat} calls per cell interleaved call by call, "
        "machine probed once unless stated"
    )
    labels = {
        "memoised": "resolve(machine=m), plan memoised",
        "cold": "resolve(machine=m), clear_cache() first",
        "probed": "resolve(), machine probed per call",
    }
    rows = []
    met = {"memoised": True, "cold": True}
    for r in results:
        t = r["timings"]
        lt = t["lightning"]
        for key, label in labels.items():
            verdict = ""
            if key in met:
                ok = t[key]["speedup"] >= RESOLVE_SPEEDUP_TARGET
                met[key] &= ok
                verdict = "met" if ok else "missed"
            rows.append(
                [
                    r["name"] if key == "memoised" else "",
                    label,
                    f"{t[key]['median_us']:.1f}",
                    f"{t[key]['p90_us']:.1f}",
                    f"{lt['median_us']:.1f}",
                    f"{lt['p90_us']:.1f}",
                    f"{t[key]['speedup']:.1f}x",
                    verdict,
                ]
            )
    out.append(
        tabulate(
            rows,
            headers=[
                "flags",
                "interlock call",
                "median",
                "p90",
                "_Connector median",
                "_Connector p90",
                "speedup",
                f">= {RESOLVE_SPEEDUP_TARGET:g}x",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    out.append(
        f"resolve() target ({RESOLVE_SPEEDUP_TARGET:g}x at the median, every flag set): "
        f"memoised plan {_verdict(met['memoised'])}, cold plan {_verdict(met['cold'])}"
    )
    return out


def render_dispatch(dispatch: dict[str, Any], steps: dict[str, Any] | None) -> list[str]:
    from tabulate import tabulate

    v = dispatch["variants"]
    out = [
        "4. What each library adds to every step: one process, one thread, a 16x16 linear "
        f"layer, batch 4 ({dispatch['repeat']} steps per variant, interleaved), microseconds"
    ]
    rows = [
        [name, f"{s['median_us']:.1f}", f"{s['p90_us']:.1f}", f"{s['added_us']:+.1f}"]
        for name, s in v.items()
    ]
    out.append(
        tabulate(
            rows,
            headers=["variant", "median us/step", "p90", "added vs raw torch"],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    if steps is not None and "raw torch" in steps["variants"]:
        step_us = steps["variants"]["raw torch"]["median_ms"] * 1e3
        shares = ", ".join(
            f"{name} {s['added_us'] / step_us * 100:+.3f}%"
            for name, s in v.items()
            if name != "raw torch"
        )
        out.append(
            f"As a share of the {step_us / 1e3:.2f} ms raw DDP step of section 1: {shares} "
            f"(the step target allows {(STEP_OVERHEAD_TARGET - 1) * 100:.0f}%)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        default="step,launch,resolve,dispatch",
        help="comma-separated sections to run (step, launch, resolve, dispatch)",
    )
    parser.add_argument(
        "--rounds", type=int, default=6, help="launches per step variant, in rotated order (>= 3)"
    )
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=8, help="timed blocks per launch")
    parser.add_argument("--block-steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width")
    parser.add_argument("--layers", type=int, default=3, help="hidden layers of the MLP")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per rank in every variant; 0 keeps what the "
        "launcher left (Fabric sets cpus/ranks, the others do not)",
    )
    parser.add_argument(
        "--fork-repeats", type=int, default=30, help="timed launches per fork variant"
    )
    parser.add_argument(
        "--spawn-repeats", type=int, default=9, help="timed launches per spawn variant"
    )
    parser.add_argument(
        "--dispatch-repeat", type=int, default=5000, help="timed tiny steps per variant"
    )
    parser.add_argument("--resolve-repeat", type=int, default=3000)
    parser.add_argument("--resolve-warmup", type=int, default=50)
    parser.add_argument(
        "--no-fabric", action="store_true", help="leave Lightning Fabric out of sections 1 and 2"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = sections - {"step", "launch", "resolve", "dispatch"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")

    lt_vars = sorted(k for k in os.environ if k.startswith("LT_"))
    if lt_vars:
        print(
            f"warning: {', '.join(lt_vars)} set; Lightning reads these and overrides the flags",
            file=sys.stderr,
        )
    try:
        import interlock.strategies.ddp  # noqa: F401 - forked children inherit it
    except ImportError as exc:
        parser.exit(2, f"cannot import interlock ({exc}); see benchmarks/README.md\n")
    if not args.no_fabric or sections & {"resolve", "dispatch"}:
        try:
            # Imported before any launch, so that every forked child inherits the same
            # modules whichever library it runs.
            import lightning.fabric  # noqa: F401
            from lightning.fabric.connector import _Connector  # noqa: F401
        except ImportError as exc:
            parser.exit(2, f"cannot import lightning ({exc}); see benchmarks/README.md\n")

    info = environment_info()
    report: dict[str, Any] = {"environment": info}
    out = ["Environment: " + ", ".join(f"{k}={v}" for k, v in info.items()), ""]

    if "step" in sections:
        cfg = StepConfig(
            hidden=args.hidden,
            layers=args.layers,
            batch=args.batch,
            warmup=args.warmup_steps,
            blocks=args.blocks,
            block_steps=args.block_steps,
            threads=args.threads,
        )
        variants = STEP_VARIANTS if not args.no_fabric else ("interlock", "raw torch")
        print("DDP steps ...", file=sys.stderr, flush=True)
        report["steps"] = bench_steps(cfg, args.rounds, variants)
        out += [*render_steps(report["steps"]), ""]
    if "launch" in sections:
        names = [n for n in LAUNCH_VARIANTS if not (args.no_fabric and n.startswith("fabric"))]
        print("launch latency ...", file=sys.stderr, flush=True)
        repeats = {"fork": args.fork_repeats, "spawn": args.spawn_repeats}
        report["launch"] = bench_launch({m: n for m, n in repeats.items() if n > 0}, names)
        out += [*render_launch(report["launch"]), ""]
    if "resolve" in sections:
        print("resolve ...", file=sys.stderr, flush=True)
        report["resolve"] = bench_resolve(args.resolve_repeat, args.resolve_warmup)
        out += [*render_resolve(report["resolve"], args.resolve_repeat), ""]
    if "dispatch" in sections:
        # Last: it computes in this process, and nothing may be forked after that.
        print("dispatch ...", file=sys.stderr, flush=True)
        report["dispatch"] = bench_dispatch(args.dispatch_repeat, args.resolve_warmup)
        out += render_dispatch(report["dispatch"], report.get("steps"))

    # Other work on the machine is the main source of noise; say how busy it was.
    info["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    out[0] += f", loadavg_1m_at_end={info['loadavg_1m_at_end']}"
    print("\n".join(out))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
