"""How long a training loop waits for a checkpoint: blocking vs asynchronous saves.

A model of ``--layers`` float32 ``Linear(--width, --width)`` layers (300 MB at the
defaults) trains with plain SGD on 2 CPU ranks (``interlock.resolve(strategy=
"ddp_fork")``); a ``CheckpointManager`` saves it with ``async_save=False`` and ``True``,
each into its own directory with ``keep=1``. Each round measures, for both modes in
alternating order:

1. **Blocked.** The time ``manager.save(step, state)`` takes before it returns, the
   larger of the two ranks' (every rank calls it; rank 0 writes the file).
2. **Durable.** From the start of ``save`` until the checkpoint is on disk and
   ``latest`` names it: the ``save`` call, then ``manager.wait()`` on rank 0 (nothing
   else running meanwhile). For a blocking save it equals the blocked time.
3. **Save plus training.** ``save`` followed by ``--steps`` training steps, timed
   together, then the write awaited: what the loop loses to a save, next to the same
   steps without one (measured in the same round). With ``async_save`` the write
   competes with training for the cores.

Medians over ``--rounds`` rounds are printed (with the range); ``--json`` writes every
figure. Run it on a quiet machine: the write goes to ``--directory`` (a temporary
folder by default, removed afterwards), so the disk's speed is part of the result.

Usage::

    python benchmarks/bench_checkpoint.py --json checkpoint.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import interlock
from interlock import CheckpointManager
from interlock.strategies.base import Strategy

MODES = ("blocking", "async")


def build(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _train(strategy: Strategy, net: nn.Module, opt: torch.optim.Optimizer,
           x: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        strategy.backward(net(x).square().mean(), net)
        strategy.optimizer_step(opt)
        opt.zero_grad()


def _rank(strategy: Strategy, args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    net = strategy.setup_module(build(args.layers, args.width))
    opt = strategy.setup_optimizer(torch.optim.SGD(net.parameters(), lr=1e-4))
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))
    managers = {mode: CheckpointManager(strategy, Path(args.directory, mode), keep=1,
                                        async_save=mode == "async") for mode in MODES}
    _train(strategy, net, opt, x, 2)  # warm up
    for manager in managers.values():  # the first save of each pays for making the file
        manager.save(0, {"model": net, "optimizer": opt, "step": 0})
        manager.wait()
    rows: list[dict[str, float]] = []
    step = 0
    for round_ in range(args.rounds):
        row: dict[str, float] = {}
        strategy.barrier()
        started = time.perf_counter()
        _train(strategy, net, opt, x, args.steps)
        strategy.barrier()
        row["steps_alone"] = time.perf_counter() - started
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            manager = managers[mode]
            step += 1
            strategy.barrier()
            started = time.perf_counter()
            manager.save(step, {"model": net, "optimizer": opt, "step": step})
            blocked = time.perf_counter() - started
            manager.wait()
            durable = time.perf_counter() - started
            row[f"{mode}_blocked"] = max(strategy.collective.all_gather_object(blocked))
            row[f"{mode}_durable"] = durable if strategy.is_global_zero else 0.0

            step += 1
            strategy.barrier()
            started = time.perf_counter()
            manager.save(step, {"model": net, "optimizer": opt, "step": step})
            _train(strategy, net, opt, x, args.steps)
            strategy.barrier()
            row[f"{mode}_with_steps"] = time.perf_counter() - started
            manager.wait()
        rows.append(row)
        if strategy.is_global_zero:
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v:.3f} s" for k, v in row.items()),
                  flush=True)
    for manager in managers.values():
        manager.close()
    size = sum(p.stat().st_size for p in Path(args.directory, "blocking").glob("step-*"))
    return {"rows": rows, "checkpoint_mb": size / 2**20}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=18)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=3, help="training steps after each save")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--directory", help="where to write (default: a temporary folder)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    made = args.directory is None
    if made:
        args.directory = tempfile.mkdtemp(prefix="bench-checkpoint-")
    try:
        strategy = interlock.resolve(strategy="ddp_fork", accelerator="cpu", devices=2,
                                     machine=interlock.Machine())
        out = strategy.launch(_rank, args)
    finally:
        if made:
            shutil.rmtree(args.directory, ignore_errors=True)
    rows = out["rows"]

    def summary(key: str) -> dict[str, float]:
        values = [r[key] for r in rows]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    keys = ["steps_alone"] + [f"{m}_{what}" for m in MODES
                              for what in ("blocked", "durable", "with_steps")]
    result = {key: summary(key) for key in keys}
    print(f"checkpoint file: {out['checkpoint_mb']:.0f} MB; {args.steps} training steps "
          f"alone: {result['steps_alone']['median']:.2f} s")
    for mode in MODES:
        b, d, w = (result[f"{mode}_{k}"] for k in ("blocked", "durable", "with_steps"))
        print(f"{mode:>8}: save() blocks {b['median']:.3f} s ({b['min']:.3f}-{b['max']:.3f}), "
              f"durable after {d['median']:.3f} s, save + {args.steps} steps "
              f"{w['median']:.2f} s ({w['min']:.2f}-{w['max']:.2f})")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"summary": result, "rounds": rows, "checkpoint_mb": out["checkpoint_mb"],
                       "args": vars(args), "torch": torch.__version__,
                       "cpus": os.cpu_count(), "loadavg": os.getloadavg()}, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
