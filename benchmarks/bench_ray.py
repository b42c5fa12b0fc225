"""The Ray launcher next to interlock's own launchers, in one run on one machine.

Two measurements, for ``ray_ddp`` (every rank a Ray actor), ``ddp_fork`` and
``ddp_spawn`` on 2 gloo CPU ranks:

1. **Launch to first barrier.** Wall time from the caller's ``strategy.launch(...)``
   until every rank has passed its first barrier (each rank reads
   ``time.perf_counter()``, a system-wide monotonic clock on Linux, right after the
   barrier; the latest counts). For Ray this includes reserving the placement group,
   starting the actors (a fresh Python process each, which imports torch) and the
   rendezvous; the connection to Ray is made once before the rounds and reported apart.
2. **DDP step time.** The same MLP and loop in each: rank 0 times blocks of steps
   between barriers after warm-up steps; the median block per launch is the figure.

The variants run in rotated order, round after round, so a slow stretch of the machine
hits each; ratios to ``ddp_fork`` are taken within a round, and their median and range
over the rounds reported. The Ray cluster is a local one started here (``ray.init``),
with as many logical CPUs as the machine has cores.

Usage::

    python benchmarks/bench_ray.py --rounds 5 --json ray.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

VARIANTS = ("ray_ddp", "ddp_fork", "ddp_spawn")
WIDTH = 512


def work(strategy: Any, steps: int, warmup: int, block: int) -> dict[str, float]:
    """In every rank: the first barrier's time, then timed DDP steps."""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.barrier()
    passed = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.all_reduce(passed, op=dist.ReduceOp.MAX)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH),
                        nn.ReLU(), nn.Linear(WIDTH, 1))
    model = strategy.setup_module(net)
    opt = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(64, WIDTH), torch.randn(64, 1)

    def step() -> None:
        strategy.backward(nn.functional.mse_loss(model(x), y), model)
        strategy.optimizer_step(opt)
        opt.zero_grad()

    for _ in range(warmup):
        step()
    blocks = []
    for _ in range(max(1, steps // block)):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(block):
            step()
        dist.barrier()
        blocks.append((time.perf_counter() - start) / block)
    return {"first_barrier": float(passed.item()), "step": statistics.median(blocks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if min(args.rounds, args.steps, args.block) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps and --block must be >= 1, --warmup >= 0")

    import ray

    import interlock

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    connect_s = time.perf_counter() - started
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    try:
        for round_ in range(args.rounds):
            order = VARIANTS[round_ % len(VARIANTS):] + VARIANTS[:round_ % len(VARIANTS)]
            for variant in order:
                strategy = interlock.resolve(strategy=variant, accelerator="cpu", devices=2)
                start = time.perf_counter()
                out = strategy.launch(work, args.steps, args.warmup, args.block)
                rows[variant].append({"launch": out["first_barrier"] - start,
                                      "step": out["step"]})
    finally:
        ray.shutdown()

    def ratios(key: str, variant: str) -> list[float]:
        return [a[key] / b[key] for a, b in zip(rows[variant], rows["ddp_fork"], strict=True)]

    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": sys.version.split()[0], "torch": __import__("torch").__version__,
        "ray": ray.__version__, "rounds": args.rounds, "ray_connect_s": connect_s,
        "load_1min": [load_before, os.getloadavg()[0]], "variants": {},
    }
    print(f"ray.init (local instance, once): {connect_s:.2f} s")
    print(f"{'variant':<10} {'launch to 1st barrier (s)':>26} {'vs fork':>16} "
          f"{'DDP step (ms)':>14} {'vs fork':>16}")
    for variant in VARIANTS:
        launch = [r["launch"] for r in rows[variant]]
        step = [r["step"] * 1e3 for r in rows[variant]]
        lr, sr = ratios("launch", variant), ratios("step", variant)
        report["variants"][variant] = {
            "launch_s_median": statistics.median(launch), "launch_s": launch,
            "step_ms_median": statistics.median(step), "step_ms": step,
            "launch_vs_fork_median": statistics.median(lr),
            "step_vs_fork_median": statistics.median(sr),
            "step_vs_fork_range": [min(sr), max(sr)],
        }
        print(f"{variant:<10} {statistics.median(launch):>26.2f} "
              f"{statistics.median(lr):>7.2f} [{min(lr):.2f}-{max(lr):.2f}] "
              f"{statistics.median(step):>14.2f} "
              f"{statistics.median(sr):>7.2f} [{min(sr):.2f}-{max(sr):.2f}]")
    print(f"load average (1 min) before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
