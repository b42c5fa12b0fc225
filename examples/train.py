"""A real training script on interlock: flags in, resolve, launch, train, checkpoint, resume.

A small MLP learns a noisy linear map on synthetic data (no downloads). Every rank
takes its shard of each global batch, so any world size trains on exactly the same
samples per step as one process would: final parameters match the single-process
run up to floating-point reduction order.

    python examples/train.py --accelerator cpu --devices 2 --strategy ddp --steps 20
    python examples/train.py --devices 2 --strategy ddp_spawn --precision bf16-mixed \\
        --checkpoint ckpt/last.pt --checkpoint-every 5 [--resume]
    torchrun --nproc-per-node 2 examples/train.py --devices 2 --pg-timeout 60

On SIGTERM (a scheduler preempting the job) every rank stops at the same step, the
checkpoint is saved, and the process exits with status 143.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

import interlock
from interlock.strategies.base import Strategy
from interlock.strategies.model_parallel import ModelParallelStrategy
from interlock.strategies.parallel import ParallelStrategy
from interlock.strategies.preemption import DEFAULT_GRACE, PreemptionGuard

FEATURES = 16
HIDDEN = 32


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def global_batch(step: int, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of a step: the same on every rank and for every world size."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch_size, FEATURES, generator=g)
    w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    y = x @ w + 0.1 * torch.randn(batch_size, 1, generator=g)
    return x, y


def shard(tensor: torch.Tensor, strategy: Strategy) -> torch.Tensor:
    """This rank's part of a global batch (tensor-parallel ranks share theirs)."""
    replicas = strategy.data_parallel_size
    if tensor.shape[0] % replicas:
        raise ValueError(
            f"--batch-size {tensor.shape[0]} must divide by the {replicas} data-parallel ranks"
        )
    return tensor.chunk(replicas)[strategy.data_parallel_rank]


def parallelize(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """How ``--strategy model_parallel`` splits the MLP: the hidden layer column-wise and
    the output layer row-wise over the tensor-parallel ranks, then FSDP2 over the
    data-parallel ranks."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if mesh["tensor_parallel"].size() > 1:
        parallelize_module(module, mesh["tensor_parallel"],
                           {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mesh["data_parallel"].size() > 1:
        fully_shard(module, mesh=mesh["data_parallel"])
    return module


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on the CPU (sharded ones are gathered: call on all ranks)."""
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().double()
        for k, v in model.state_dict().items()
    }


def train(strategy: Strategy, args: argparse.Namespace) -> dict[str, Any]:
    interlock.seed_everything(args.seed)
    with strategy.module_init_context():
        model = build_model()
    model = strategy.setup_module(model)
    optimizer = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=args.lr))
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": 0}
    if args.resume and args.checkpoint and Path(args.checkpoint).exists():
        strategy.load_checkpoint(args.checkpoint, state)
    loss = torch.tensor(float("nan"))
    started = time.perf_counter()
    with PreemptionGuard(grace=args.preemption_grace) as preemption:
        for step in range(int(state["step"]), args.steps):
            inject_fault(strategy, args, step)
            for micro in range(args.accumulate):
                x, y = global_batch(step * args.accumulate + micro, args.batch_size, args.seed)
                x, y = strategy.batch_to_device((shard(x, strategy), shard(y, strategy)))
                last = micro == args.accumulate - 1
                with strategy.no_backward_sync(model, enabled=not last):
                    loss = nn.functional.mse_loss(model(x).float(), y) / args.accumulate
                    strategy.backward(loss, model)
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()
            state["step"] = step + 1
            if args.ready_file and state["step"] == 1:
                # for tests: this rank is in the loop, with the preemption guard in place
                Path(f"{args.ready_file}.rank{strategy.global_rank}").touch()
            every = args.checkpoint_every
            if args.checkpoint and every and state["step"] % every == 0:
                strategy.save_checkpoint(args.checkpoint, state)
            if preemption.should_stop(strategy):
                # every rank gets here after the same step: save together, then exit 143
                if args.checkpoint:
                    strategy.save_checkpoint(args.checkpoint, state)
                if strategy.is_global_zero:
                    where = f"saved to {args.checkpoint}" if args.checkpoint else "not saved"
                    print(f"preempted after step {state['step']}: checkpoint {where}",
                          file=sys.stderr, flush=True)
                preemption.stop()
    mean_loss = strategy.all_reduce(loss.detach() * args.accumulate, "mean")
    summary = {
        "strategy": strategy.plan.strategy if strategy.plan else type(strategy).__name__,
        "world_size": strategy.world_size,
        "steps": int(state["step"]),
        "loss": float(mean_loss),
        "seconds": round(time.perf_counter() - started, 3),
        "cluster": strategy.plan.cluster_environment if strategy.plan else "local",
        "launcher": strategy.plan.launcher if strategy.plan else None,
    }
    if args.output:
        params = full_parameters(model)  # a collective for sharded models: every rank
        if strategy.is_global_zero:
            torch.save(params, args.output)
    return summary


def inject_fault(strategy: Strategy, args: argparse.Namespace, step: int) -> None:
    """The hidden test faults: fail or hang one rank before a step's collectives."""
    if args.fail_at_step == step and strategy.global_rank == args.fail_rank:
        raise RuntimeError(f"deliberate failure at step {step} on rank {args.fail_rank} "
                           f"(time {time.time():.3f})")
    if args.hang_at_step == step and strategy.global_rank == args.hang_rank:
        print(f"rank {args.hang_rank} hangs at step {step} (time {time.time():.3f})",
              file=sys.stderr, flush=True)
        while True:
            time.sleep(1.0)


def seconds(text: str) -> float:
    """A positive number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", default="1")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="checkpoint file to write (and resume from)")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--output", help="write rank 0's final parameters here (torch.save)")
    p.add_argument("--pg-timeout", type=seconds, metavar="SECONDS",
                   help="how long a collective waits for a missing rank before failing "
                   "(default: the strategy's, 30 minutes)")
    p.add_argument("--preemption-grace", type=seconds, default=DEFAULT_GRACE, metavar="SECONDS",
                   help="after SIGTERM, exit with 143 at the latest after this long")
    p.add_argument("--fail-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--fail-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-before-setup-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        strategy = interlock.resolve(
            accelerator=args.accelerator, devices=args.devices,
            # model parallelism needs to be told how to split this model
            strategy=(ModelParallelStrategy(parallelize_fn=parallelize)
                      if args.strategy == "model_parallel" else args.strategy),
            precision=args.precision, num_nodes=args.num_nodes,
        )
    except interlock.ResolutionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.pg_timeout is not None and isinstance(strategy, ParallelStrategy):
        strategy.timeout = datetime.timedelta(seconds=args.pg_timeout)
    if args.hang_before_setup_rank >= 0 and "LOCAL_RANK" in os.environ and (
            os.environ.get("RANK") == str(args.hang_before_setup_rank)):
        # a test fault: a rank re-run by the script launcher (or torchrun) that never
        # connects, like one still importing torch on a busy machine
        print(f"rank {args.hang_before_setup_rank} hangs before setup", file=sys.stderr,
              flush=True)
        while True:
            time.sleep(1.0)
    summary = strategy.launch(train, args)
    if strategy.is_global_zero:
        for note in strategy.plan.notes if strategy.plan else ():
            print(f"note: {note}", file=sys.stderr)
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
