"""A real training script on interlock: flags in, resolve, launch, train, checkpoint, resume.

A small MLP learns a noisy linear map on synthetic data (no downloads). Every rank
takes its shard of each global batch, so any world size trains on exactly the same
samples per step as one process would: final parameters match the single-process
run up to floating-point reduction order.

    python examples/train.py --accelerator cpu --devices 2 --strategy ddp --steps 20
    python examples/train.py --devices 2 --strategy ddp --launcher spawn --precision bf16-mixed \\
        --checkpoint ckpt/last.pt --checkpoint-every 5 [--resume]
    torchrun --nproc-per-node 2 examples/train.py --devices 2 --pg-timeout 60

On SIGTERM (a scheduler preempting the job) every rank stops at the same step, the
checkpoint is saved, and the process exits with status 143.

Surviving faults, with the checkpoint and ``--resume`` given:

- ``--max-restarts N``: when a rank fails, interlock's own launchers (strategies
  ``ddp``, ``ddp_spawn``, ...) stop every rank and start them all again, up to N
  times, and the run resumes from the last checkpoint. Under torchrun give torchrun
  ``--max-restarts N`` instead (interlock does not restart processes it did not start).
- ``--requeue-on USR1``: in a SLURM batch job submitted with ``sbatch --requeue``,
  that signal (sent by ``#SBATCH --signal=USR1@120`` before the time limit, or by
  ``scancel --signal=USR1 JOBID``) makes every rank stop after the same step and save;
  rank 0 then runs ``scontrol requeue $SLURM_JOB_ID``, and the requeued job's
  ``srun ... --resume`` continues from the checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
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
from interlock.strategies.restarts import MAX_RESTARTS_LIMIT, restart_attempt

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

    if mesh["tp"].size() > 1:
        parallelize_module(module, mesh["tp"],
                           {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mesh["dp_shard"].size() > 1:
        fully_shard(module, mesh=mesh["dp_shard"])
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
        if strategy.is_global_zero:
            print(f"resumed from {args.checkpoint} at step {int(state['step'])}",
                  file=sys.stderr, flush=True)
    loss = torch.tensor(float("nan"))
    started = time.perf_counter()
    signals = (signal.SIGTERM,) + ((args.requeue_on,) if args.requeue_on else ())
    with PreemptionGuard(signals, grace=args.preemption_grace) as preemption:
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
                # every rank gets here after the same step: save together, then exit
                # with 128 + the signal (143 for SIGTERM)
                if args.checkpoint:
                    strategy.save_checkpoint(args.checkpoint, state)
                # a collective too: requeue when any rank got the requeue signal
                requeue = args.requeue_on is not None and strategy.reduce_boolean_decision(
                    preemption.signum == args.requeue_on, all=False)
                if strategy.is_global_zero:
                    where = f"saved to {args.checkpoint}" if args.checkpoint else "not saved"
                    print(f"preempted after step {state['step']}: checkpoint {where}",
                          file=sys.stderr, flush=True)
                    if requeue:
                        requeue_slurm_job(args.requeue_on)
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


def first_attempt() -> bool:
    """Whether this is the job's first run: not a restart by interlock's launchers or
    torchrun, nor a requeued SLURM job (the test faults fire only in the first run)."""
    return restart_attempt() == 0


def requeue_slurm_job(signum: signal.Signals) -> None:
    """Put this SLURM batch job back in the queue (rank 0, after the checkpoint is
    saved); SLURM then ends this run and starts the batch script again later."""
    name = signum.name
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        print(f"{name} received, but this process is not part of a SLURM job (SLURM_JOB_ID "
              "is unset): nothing requeues it; run it again with --resume to continue",
              file=sys.stderr, flush=True)
        return
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"{name} received, but scontrol requeue {job} could not run ({error}): the "
              "job is not requeued", file=sys.stderr, flush=True)
        return
    if done.returncode != 0:
        print(f"{name} received, but scontrol requeue {job} failed: "
              f"{(done.stderr or done.stdout).strip()} (only a batch job, one submitted "
              "with sbatch --requeue or under JobRequeue=1, can be requeued)",
              file=sys.stderr, flush=True)
        return
    print(f"{name} received: SLURM job {job} requeued (time {time.time():.3f}); its next "
          "run resumes from the checkpoint", file=sys.stderr, flush=True)


def inject_fault(strategy: Strategy, args: argparse.Namespace, step: int) -> None:
    """The hidden test faults: fail or hang one rank before a step's collectives (in
    the first run only, so that a restarted or requeued job gets past them)."""
    if not first_attempt():
        return
    if args.step_sleep:
        time.sleep(args.step_sleep)  # a slow first run, for a signal to land mid-run
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


def restarts(text: str) -> int:
    """A whole number of restarts, 0 to interlock's limit (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_RESTARTS_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 0 to {MAX_RESTARTS_LIMIT}, got {text!r}")
    return value


def signal_name(text: str) -> signal.Signals:
    """A signal given by name (USR1, SIGUSR1) or number (argparse type)."""
    name = text.strip().upper()
    try:
        found = signal.Signals(int(name)) if name.isdigit() else signal.Signals[
            name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown signal {text!r}; e.g. USR1") from None
    if found in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
        raise argparse.ArgumentTypeError(
            f"{found.name} cannot be the requeue signal (SIGTERM already means 'stop')")
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", default="1")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--launcher", default="auto",
                   help="how the processes start (spawn, fork, ... or ray with "
                   "interlock-ray); default: the strategy's own")
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
    p.add_argument("--max-restarts", type=restarts, default=0, metavar="N",
                   help="when a rank fails, restart every rank up to N times and resume "
                   "from the checkpoint (interlock's own launchers; under torchrun use "
                   "torchrun --max-restarts)")
    p.add_argument("--requeue-on", type=signal_name, metavar="SIGNAL",
                   help="in a SLURM batch job: on this signal (e.g. USR1) save, stop, and "
                   "requeue the job with scontrol; needs --checkpoint and --resume")
    p.add_argument("--fail-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--fail-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-before-setup-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    p.add_argument("--step-sleep", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.requeue_on is not None and not (args.checkpoint and args.resume):
        p.error(f"--requeue-on {args.requeue_on.name} needs --checkpoint and --resume: "
                "the requeued job continues from the checkpoint")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        strategy = interlock.resolve(
            accelerator=args.accelerator, devices=args.devices,
            # model parallelism needs to be told how to split this model
            strategy=(ModelParallelStrategy(parallelize_fn=parallelize)
                      if args.strategy == "model_parallel" else args.strategy),
            precision=args.precision, num_nodes=args.num_nodes, launcher=args.launcher,
        )
    except interlock.ResolutionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.pg_timeout is not None and isinstance(strategy, ParallelStrategy):
        strategy.timeout = datetime.timedelta(seconds=args.pg_timeout)
    if args.hang_before_setup_rank >= 0 and "LOCAL_RANK" in os.environ and (
            os.environ.get("RANK") == str(args.hang_before_setup_rank)) and first_attempt():
        # a test fault: a rank re-run by the script launcher (or torchrun) that never
        # connects, like one still importing torch on a busy machine
        print(f"rank {args.hang_before_setup_rank} hangs before setup", file=sys.stderr,
              flush=True)
        while True:
            time.sleep(1.0)
    if (args.requeue_on is not None and not os.environ.get("SLURM_JOB_ID")
            and strategy.is_global_zero):
        print(f"note: --requeue-on {args.requeue_on.name}: not inside a SLURM job, so the "
              "signal only stops the run (saved); nothing requeues it", file=sys.stderr)
    summary = strategy.launch(train, args, max_restarts=args.max_restarts)
    if strategy.is_global_zero:
        for note in strategy.plan.notes if strategy.plan else ():
            print(f"note: {note}", file=sys.stderr)
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
