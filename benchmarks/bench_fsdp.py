"""FSDP through interlock next to the same loop written directly with ``fully_shard``.

Two measurements, one run, one machine (2 gloo CPU ranks):

1. **Step time.** An MLP of ``--layers`` residual blocks of width ``--width``, each block
   its own FSDP2 unit, trained with AdamW on a fixed batch. Variant *interlock*:
   ``interlock.resolve(strategy=FSDPStrategy(auto_wrap_policy={Block}))``, then
   ``setup_module``/``backward``/``optimizer_step``. Variant *raw*: ``init_process_group``,
   ``init_device_mesh``, ``fully_shard`` per block and on the root, plain
   ``loss.backward()``/``optimizer.step()``. Both variants start their ranks the same way
   (forked processes that look like torchrun's, so interlock runs in place under its
   external launcher) and time ``--steps`` steps after ``--warmup`` untimed ones, between
   barriers. The variants alternate for ``--rounds`` rounds; the ratio interlock/raw is
   taken within each round and its median reported with its range.
2. **Peak memory per rank with and without empty init.** In fresh forked ranks, the peak
   resident set size (``ru_maxrss``) after building and sharding a model of
   ``--memory-layers`` blocks of width ``--memory-width``: built normally (every rank
   allocates the whole model, then keeps its shard) and with
   ``module_init_context(empty_init=True)`` (meta device; each rank allocates only its
   shards). The baseline RSS after importing torch is reported too.

Usage::

    python benchmarks/bench_fsdp.py --json fsdp.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def build(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(layers)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_torchrun_rank(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update({
        "TORCHELASTIC_RUN_ID": "bench", "RANK": str(rank), "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })


def _timed(step: Any, barrier: Any, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    barrier()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    barrier()
    return (time.perf_counter() - started) / steps


def _interlock_rank(rank: int, world: int, port: int, args: argparse.Namespace,
                    out: Any) -> None:
    _as_torchrun_rank(rank, world, port)
    import interlock
    from interlock.strategies.fsdp import FSDPStrategy

    strategy = interlock.resolve(strategy=FSDPStrategy(auto_wrap_policy={Block}),
                                 accelerator="cpu", devices=world)

    def run(strategy: Any) -> float:
        model = strategy.setup_module(build(args.layers, args.width))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(args.batch, args.width)

        def step() -> None:
            loss = model(x).pow(2).mean()
            strategy.backward(loss, model)
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()

        return _timed(step, strategy.barrier, args.warmup, args.steps)

    seconds = strategy.launch(run)
    if rank == 0:
        out.put(seconds)


def _raw_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    _as_torchrun_rank(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    model = build(args.layers, args.width)
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width)

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()

    seconds = _timed(step, dist.barrier, args.warmup, args.steps)
    dist.destroy_process_group()
    if rank == 0:
        out.put(seconds)


def _memory_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any,
                 empty_init: bool) -> None:
    _as_torchrun_rank(rank, world, port)
    import interlock
    from interlock.strategies.fsdp import FSDPStrategy

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    strategy = interlock.resolve(strategy=FSDPStrategy(auto_wrap_policy={Block}),
                                 accelerator="cpu", devices=world)

    def run(strategy: Any) -> int:
        with strategy.module_init_context(empty_init=empty_init):
            model = build(args.memory_layers, args.memory_width)
        strategy.setup_module(model)
        strategy.barrier()
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    peak = strategy.launch(run)
    out.put((rank, baseline, peak))


def _launch(target: Any, world: int, *extra: Any) -> list[Any]:
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *extra[:1], out, *extra[1:]))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.exitcode != 0:
            raise RuntimeError(f"{target.__name__} rank exited with {p.exitcode}")
    results = []
    while not out.empty():
        results.append(out.get())
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--memory-layers", type=int, default=8)
    p.add_argument("--memory-width", type=int, default=2048)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    world = 2

    rows: list[dict[str, float]] = []
    for round_ in range(args.rounds):
        order = [("interlock", _interlock_rank), ("raw", _raw_rank)]
        if round_ % 2:
            order.reverse()
        times = {name: _launch(fn, world, args)[0] for name, fn in order}
        rows.append(times)
        print(f"round {round_ + 1}: interlock {times['interlock'] * 1e3:.2f} ms/step, "
              f"raw fully_shard {times['raw'] * 1e3:.2f} ms/step, "
              f"ratio {times['interlock'] / times['raw']:.3f}", flush=True)
    ratios = [r["interlock"] / r["raw"] for r in rows]
    step = {
        "interlock_ms": statistics.median(r["interlock"] for r in rows) * 1e3,
        "raw_ms": statistics.median(r["raw"] for r in rows) * 1e3,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(f"step time: interlock {step['interlock_ms']:.2f} ms, raw {step['raw_ms']:.2f} ms, "
          f"interlock/raw median {step['ratio_median']:.3f} "
          f"(range {step['ratio_min']:.3f}-{step['ratio_max']:.3f}); target <= 1.03")

    params = sum(p.numel() for p in build(args.memory_layers, args.memory_width).parameters())
    memory: dict[str, Any] = {"model_mb": params * 4 / 2**20}
    for empty in (False, True):
        results = _launch(_memory_rank, world, args, empty)
        memory["empty_init" if empty else "normal_init"] = {
            "peak_mb_per_rank": [peak / 1024 for _, _, peak in sorted(results)],
            "baseline_mb_per_rank": [base / 1024 for _, base, _ in sorted(results)],
        }
    for label in ("normal_init", "empty_init"):
        m = memory[label]
        print(f"{label}: peak RSS per rank {[round(x) for x in m['peak_mb_per_rank']]} MB "
              f"(after importing torch: {[round(x) for x in m['baseline_mb_per_rank']]} MB; "
              f"model {memory['model_mb']:.0f} MB in float32)")
    result = {"step": step, "rounds": rows, "memory": memory, "args": vars(args),
              "torch": torch.__version__, "cpus": os.cpu_count(),
              "loadavg": os.getloadavg()}
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
