"""N-D parallelism with interlock: one script for any layout of pipeline, data and
tensor parallel, chosen by a flag.

A small residual MLP (an ``nn.Sequential`` of blocks) learns a noisy linear map on
synthetic data. The layout is the engine's ``parallelism=`` flag; the engine checks it
before any process starts, the strategy builds the device mesh, and the same training
step, ``strategy.forward_backward``, runs every layout, pipelines included:

    python examples/parallelism.py --devices 4 --parallelism dp_shard=2,tp=2
    python examples/parallelism.py --devices 4 --parallelism pp=2,dp_shard=2 \\
        --schedule 1F1B --microbatches 4 --checkpoint ckpt/pp2
    python examples/parallelism.py --devices 4 --parallelism dp_replicate=2,dp_shard=2
    python examples/parallelism.py --devices 4 --parallelism pp=2,dp_shard=2 --explain

``--check`` trains the same steps in one plain process afterwards and prints the
largest parameter difference (float32 reduction order only). A checkpoint written under
one layout loads under any other (``--resume``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

import interlock
from interlock.strategies.model_parallel import ModelParallelStrategy

FEATURES = 16
WIDTH = 32
BLOCKS = 4


class Block(nn.Module):
    """A residual block: ``x + W2 tanh(W1 x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, WIDTH)
        self.down = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


def build_model() -> nn.Sequential:
    """Input layer, blocks, output layer: a pipeline cuts between children."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, WIDTH), *(Block() for _ in range(BLOCKS)),
                         nn.Linear(WIDTH, 1))


def parallelize(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel inside each block (``up`` column-wise, ``down`` row-wise, so a
    block needs one all-reduce), then FSDP2 over the data-parallel ranks: the 2-D
    ``(dp_replicate, dp_shard)`` mesh (HSDP) when both are above 1. Under pipeline
    parallel ``module`` is this rank's stage: blocks of other stages are ``nn.Identity``.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if mesh["tp"].size() > 1:
        for block in module.children():
            if isinstance(block, Block):
                parallelize_module(block, mesh["tp"],
                                   {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if mesh["dp_replicate"].size() > 1:
        fully_shard(module, mesh=mesh["dp_replicate", "dp_shard"])
    elif mesh["dp_shard"].size() > 1:
        fully_shard(module, mesh=mesh["dp_shard"])
    return module


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, FEATURES, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.1 + 0.01 * torch.randn(size, 1, generator=g)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = nn.functional.mse_loss(output.float(), target)
    return loss


def whole(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor whole on the CPU (sharded ones gathered: call on every rank)."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in state.items()}


def train(strategy: ModelParallelStrategy, args: argparse.Namespace) -> dict[str, Any]:
    model = strategy.setup_module(build_model())
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=args.lr))
    start = 0
    if args.resume and args.checkpoint and Path(args.checkpoint).exists():
        state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": 0}
        strategy.load_checkpoint(args.checkpoint, state)
        start = state["step"]
        strategy.print(f"resumed at step {start} from {args.checkpoint}")
    # ranks of one tensor-, context- or pipeline-parallel group read the same shard
    shards, index = strategy.data_parallel_size, strategy.data_parallel_rank
    for step in range(start, args.steps):
        x, y = batch(step, args.batch_size)
        loss = strategy.forward_backward(model, x.chunk(shards)[index],
                                         y.chunk(shards)[index], loss_fn)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        mean = strategy.all_reduce(loss, reduce_op="mean")
        if step % 5 == 0 or step == args.steps - 1:
            strategy.print(f"step {step:3d}  loss {float(mean):.5f}")
    if args.checkpoint:
        strategy.save_checkpoint(args.checkpoint, {"model": model, "optimizer": optimizer,
                                                   "step": args.steps})
    merged: dict[str, torch.Tensor] = {}
    for part in strategy.collective.all_gather_object(whole(model.state_dict())):
        merged.update(part)  # pipeline stages hold different layers
    return merged


def one_process(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """The same steps in one plain process on the whole batches (no interlock)."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = batch(step, args.batch_size)
        loss_fn(model(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--parallelism", default="dp_shard=2,tp=2",
                   help="degrees, e.g. pp=2,dp_shard=2 (pp, dp_replicate, dp_shard, cp, tp)")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--schedule", choices=("1F1B", "GPipe"), default="1F1B")
    p.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per step under pp > 1 (default 2 x pp)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint", help="a distributed checkpoint directory to write")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--explain", action="store_true", help="print the plan and stop")
    p.add_argument("--check", action="store_true",
                   help="compare the result with one plain process")
    args = p.parse_args(argv)
    if args.checkpoint:
        try:  # refused now, not after training in every rank
            Path(args.checkpoint).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            print(f"error: --checkpoint {args.checkpoint}: cannot create its directory "
                  f"({error.strerror})", file=sys.stderr)
            return 2
    try:
        strategy = interlock.resolve(
            strategy=ModelParallelStrategy(parallelize_fn=parallelize,
                                           pipeline_schedule=args.schedule,
                                           pipeline_microbatches=args.microbatches),
            accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
            precision=args.precision, parallelism=args.parallelism)
    except ValueError as error:  # ResolutionError, or an option out of range
        print(f"error: {error}", file=sys.stderr)
        return 2
    assert isinstance(strategy, ModelParallelStrategy)
    if args.explain:
        print(strategy.plan.explain() if strategy.plan else strategy)
        return 0
    result = strategy.launch(train, args)
    if args.check:
        expected = one_process(args)
        worst = max(float((result[k].float() - v.float()).abs().max()) for k, v in
                    expected.items())
        print(f"largest difference from one plain process: {worst:.3g}")
        return 0 if worst < 1e-4 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
