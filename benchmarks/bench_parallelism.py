"""FSDP 2 x TP 2 through interlock next to the same loop written directly against torch.

One run, 4 gloo CPU ranks, a mesh of ``dp_shard`` 2 x ``tp`` 2. The model is an MLP of
``--layers`` residual blocks of width ``--width`` (``x + down(relu(up(x)))``); in every
block ``up`` is ``ColwiseParallel`` and ``down`` ``RowwiseParallel`` over the ``tp``
dimension, then each block and the root are ``fully_shard``-ed over ``dp_shard``. Both
variants live in the same 4 processes, started by
``interlock.resolve(strategy=ModelParallelStrategy(parallelize_fn=...), accelerator="cpu",
devices=4, parallelism={"dp_shard": 2, "tp": 2})`` and its ``launch`` (the script
launcher re-runs this file for ranks 1-3):

- *interlock*: ``setup_module`` (which calls the ``parallelize_fn`` with the plan's
  5-D mesh ``(pp, dp_replicate, dp_shard, cp, tp)``), ``setup_optimizer``,
  ``forward_backward`` and ``optimizer_step``; each rank takes batch shard
  ``data_parallel_rank`` of ``data_parallel_size``.
- *raw*: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))`` over
  the same default process group, ``parallelize_module`` and ``fully_shard`` by hand,
  ``loss.backward()``, ``optimizer.step()``; the batch shard is the rank's ``dp_shard``
  coordinate.

Same initial weights (seed 0), same batch, AdamW with the same settings. Each variant
first runs ``--warmup`` untimed steps, then the two alternate in blocks of
``--block-steps`` steps for ``--rounds`` rounds (A B, B A, A B, ...). A block is timed
on rank 0 between two barriers on the default group (the same barrier for both
variants, garbage collected before it); its time divided by its steps is one sample.
The CPU time the 4 processes spent in the block (``time.process_time``, summed over the
ranks after the clock stopped) is reported per step next to it: on a machine with fewer
cores than ranks, or shared with other work, wall time is mostly waiting for the
scheduler, and CPU time shows better what each variant costs. Ratios interlock/raw are
taken within each round and their median reported with the range; the target is at
most 1.03 on the wall-clock median. At the end both models have taken the same steps on
the same data, and their full parameters are compared with ``assert_close`` on every
rank, so the two did the same work.

The process group and the rank processes are interlock's for both variants: what is
compared is the training step, not start-up.

Usage::

    python benchmarks/bench_parallelism.py --json parallelism.json
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import interlock
from interlock.strategies.base import Strategy
from interlock.strategies.model_parallel import ModelParallelStrategy

VARIANTS = ("interlock", "raw")
DP, TP = 2, 2


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x)))
        return out


def build(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(layers)))


def parallelize(module: nn.Module, tp_mesh: DeviceMesh, dp_mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel inside each block, then FSDP2 per block and on the root."""
    for block in module.children():
        parallelize_module(block, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=dp_mesh)
    fully_shard(module, mesh=dp_mesh)
    return module


def parallelize_fn(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """interlock's hook: the full 5-D mesh in, its ``tp`` and ``dp_shard`` dims used."""
    return parallelize(module, mesh["tp"], mesh["dp_shard"])


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


def _full(module: nn.Module) -> dict[str, torch.Tensor]:
    # gathering a (dp_shard, tp) parameter takes two all-gathers, which torch logs a
    # warning about on every rank: expected here, and outside the timing
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return {name: p.full_tensor() if isinstance(p, DTensor) else p.detach()
                for name, p in module.named_parameters()}
    finally:
        quiet.setLevel(level)


def _rank(strategy: Strategy, args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.width, generator=generator)
    y = torch.randn(args.batch, args.width, generator=generator)

    def shard(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        return t.chunk(size)[rank].contiguous()

    # interlock
    model_i = build(args.layers, args.width)
    net = strategy.setup_module(model_i)
    opt_i = strategy.setup_optimizer(torch.optim.AdamW(net.parameters(), lr=args.lr))
    xi = shard(x, strategy.data_parallel_rank, strategy.data_parallel_size)
    yi = shard(y, strategy.data_parallel_rank, strategy.data_parallel_size)

    def step_interlock() -> None:
        strategy.forward_backward(net, xi, yi, loss_fn)
        strategy.optimizer_step(opt_i)
        opt_i.zero_grad()

    # raw torch, on the same default process group
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp_shard", "tp"))
    model_r = parallelize(build(args.layers, args.width), mesh["tp"], mesh["dp_shard"])
    opt_r = torch.optim.AdamW(model_r.parameters(), lr=args.lr)
    dp_rank = mesh["dp_shard"].get_local_rank()
    if (dp_rank, DP) != (strategy.data_parallel_rank, strategy.data_parallel_size):
        raise RuntimeError(f"rank {strategy.global_rank}: raw dp rank {dp_rank}/{DP}, "
                           f"interlock {strategy.data_parallel_rank}/"
                           f"{strategy.data_parallel_size}")
    xr, yr = shard(x, dp_rank, DP), shard(y, dp_rank, DP)

    def step_raw() -> None:
        loss = loss_fn(model_r(xr), yr)
        loss.backward()  # type: ignore[no-untyped-call]
        opt_r.step()
        opt_r.zero_grad()

    steps: dict[str, Callable[[], None]] = {"interlock": step_interlock, "raw": step_raw}

    def block(name: str, n: int) -> tuple[float, float]:
        gc.collect()
        dist.barrier()
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(n):
            steps[name]()
        dist.barrier()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        total_cpu = torch.tensor([cpu], dtype=torch.float64)
        dist.all_reduce(total_cpu)  # after the clock stopped
        return wall / n, total_cpu.item() / n

    for name in VARIANTS:
        block(name, args.warmup)
    rows: list[dict[str, float]] = []
    for round_ in range(args.rounds):
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        row: dict[str, float] = {}
        for name in order:
            row[name], row[f"{name}_cpu"] = block(name, args.block_steps)
        rows.append(row)
        if strategy.is_global_zero:
            print(f"round {round_ + 1}: interlock {row['interlock'] * 1e3:.2f} ms/step "
                  f"(CPU {row['interlock_cpu'] * 1e3:.1f} ms), raw {row['raw'] * 1e3:.2f} "
                  f"ms/step (CPU {row['raw_cpu'] * 1e3:.1f} ms), "
                  f"ratio {row['interlock'] / row['raw']:.3f}", flush=True)

    # the same steps on the same data: the same parameters
    full_i, full_r = _full(model_i), _full(model_r)
    if sorted(full_i) != sorted(full_r):
        raise AssertionError(f"parameter names differ: {sorted(full_i)} vs {sorted(full_r)}")
    for name in full_i:
        try:
            torch.testing.assert_close(full_i[name], full_r[name])
        except AssertionError as exc:
            raise AssertionError(f"rank {strategy.global_rank}, {name}: interlock and raw "
                                 f"differ after the same steps: {exc}") from None
    max_diff = max((full_i[n] - full_r[n]).abs().max().item() for n in full_i)
    params = sum(t.numel() for t in full_i.values())
    return {"rows": rows, "max_abs_diff": max_diff, "params": params,
            "steps_each": args.warmup + args.rounds * args.block_steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=64, help="global batch (split over dp)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps of each variant")
    p.add_argument("--block-steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    strategy = interlock.resolve(
        strategy=ModelParallelStrategy(parallelize_fn=parallelize_fn), accelerator="cpu",
        devices=DP * TP, parallelism={"dp_shard": DP, "tp": TP}, machine=interlock.Machine())
    out = strategy.launch(_rank, args)
    load_after = os.getloadavg()[0]
    rows = out["rows"]
    ratios = [r["interlock"] / r["raw"] for r in rows]
    cpu_ratios = [r["interlock_cpu"] / r["raw_cpu"] for r in rows]
    summary: dict[str, float] = {"ratio_median": statistics.median(ratios),
                                 "ratio_min": min(ratios), "ratio_max": max(ratios),
                                 "cpu_ratio_median": statistics.median(cpu_ratios),
                                 "cpu_ratio_min": min(cpu_ratios),
                                 "cpu_ratio_max": max(cpu_ratios)}
    for v in VARIANTS:
        for key in (v, f"{v}_cpu"):
            values = [r[key] * 1e3 for r in rows]
            summary.update({f"{key}_ms": statistics.median(values),
                            f"{key}_min_ms": min(values), f"{key}_max_ms": max(values)})
    print(f"\nFSDP {DP} x TP {TP}, 4 gloo CPU ranks, {args.layers} blocks of width "
          f"{args.width} ({out['params'] / 1e6:.2f} M parameters), global batch "
          f"{args.batch}; {args.rounds} rounds of {args.block_steps} steps each, "
          f"{args.warmup} warm-up steps discarded; load average {load_before:.2f} -> "
          f"{load_after:.2f}\n")
    print("| variant | step, median ms | range ms | CPU per step, 4 ranks, median ms "
          "| range ms |")
    print("|---|---:|---:|---:|---:|")
    for v in VARIANTS:
        print(f"| {v} | {summary[f'{v}_ms']:.2f} | "
              f"{summary[f'{v}_min_ms']:.2f}-{summary[f'{v}_max_ms']:.2f} | "
              f"{summary[f'{v}_cpu_ms']:.1f} | "
              f"{summary[f'{v}_cpu_min_ms']:.1f}-{summary[f'{v}_cpu_max_ms']:.1f} |")
    verdict = "met" if summary["ratio_median"] <= 1.03 else "MISSED"
    print(f"| interlock / raw (within a round) | {summary['ratio_median']:.3f} | "
          f"{summary['ratio_min']:.3f}-{summary['ratio_max']:.3f} | "
          f"{summary['cpu_ratio_median']:.3f} | "
          f"{summary['cpu_ratio_min']:.3f}-{summary['cpu_ratio_max']:.3f} |")
    print(f"\ntarget interlock/raw <= 1.03: {verdict}. Parameters after {out['steps_each']} "
          f"steps each: equal (assert_close), largest difference {out['max_abs_diff']:.1e}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"summary": summary, "rounds": rows, "max_abs_diff": out["max_abs_diff"],
                       "params": out["params"], "args": vars(args),
                       "torch": torch.__version__, "cpus": os.cpu_count(),
                       "loadavg": [load_before, load_after]}, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
