"""``Plan.memory`` against what one CUDA device really holds while training.

A small causal transformer language model (``--layers`` blocks of width ``--width``,
``--heads`` heads, a vocabulary of ``--vocab``, sequences of ``--seq`` tokens) is
trained with AdamW through ``interlock.resolve(accelerator=args.device, devices=1,
strategy="single_device", precision=P, model=shape, optimizer="adamw",
micro_batch_size=B)``, for each precision P of ``--precisions``:

1. ``interlock.model_shape(WithLoss(model), sample=batch)`` measures the model and the
   activations per sample from one forward of a micro-batch on the device, the loss
   included (the device's own kernels; under ``torch.autocast`` for ``bf16-mixed``, on
   a bfloat16 copy for ``bf16-true``);
2. the plan's ``Plan.memory`` (model state, buffers, activations, ``device_bytes``);
3. ``--steps`` training steps of micro-batch B through the strategy
   (``setup_module``, ``setup_optimizer``, ``backward``, ``optimizer_step``, gradients
   set to None after each step); the peak statistics are reset after the first step
   (which creates the optimizer state), so the peak is a steady step's.

Reported per precision: ``torch.cuda.max_memory_allocated()`` over the steady steps
against ``device_bytes`` (the ratio, and whether it is within 10 %), and the allocated
bytes between steps (gradients set to None) against the parameters, the optimizer
state and the buffers. Needs one CUDA device
(``--device cpu`` runs the same code path with tiny sizes and no memory figures, to
check the script itself).

Usage::

    python benchmarks/bench_memory_cuda.py --json memory-cuda.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import interlock


class Block(nn.Module):
    """Pre-norm attention (fused scaled-dot-product, causal) and a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, width))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm2(x))))
        return out


class LM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(self.blocks(self.embed(tokens)
                                                            + self.position)))
        return out


class WithLoss(nn.Module):
    """The model and its loss in one forward, so that measuring it counts what the loss
    keeps for the backward pass too (the logits in float32, their log-softmax)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def measure(args: argparse.Namespace, precision: str) -> dict[str, Any]:
    cuda = args.device == "cuda"

    def allocated() -> int:
        return torch.cuda.memory_allocated() if cuda else 0

    if cuda:
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    before = allocated()
    model = LM(args.vocab, args.width, args.layers, args.heads, args.seq).to(args.device)
    # measured at the micro-batch the plan is for: what does not grow with the batch
    # (autocast's half-precision weight copies) is then counted once
    tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1))
    sample = tokens.to(args.device)
    if precision == "bf16-mixed":
        with torch.autocast(args.device, dtype=torch.bfloat16):
            activations = interlock.model_shape(WithLoss(model), sample=sample)
    elif precision == "bf16-true":
        activations = interlock.model_shape(
            WithLoss(copy.deepcopy(model).to(torch.bfloat16)), sample=sample)
    else:
        activations = interlock.model_shape(WithLoss(model), sample=sample)
    del sample
    if cuda:
        torch.cuda.empty_cache()
    shape = dataclasses.replace(
        interlock.model_shape(model),
        activation_bytes_per_sample=activations.activation_bytes_per_sample,
        largest_activation_bytes_per_sample=activations.largest_activation_bytes_per_sample)
    strategy = interlock.resolve(accelerator=args.device, devices=1, strategy="single_device",
                                 precision=precision, model=shape, optimizer="adamw",
                                 micro_batch_size=args.micro_batch)
    assert strategy.plan is not None and strategy.plan.memory is not None
    memory = strategy.plan.memory

    def train(strategy: Any) -> dict[str, int]:
        module = strategy.setup_module(WithLoss(model))
        optimizer = strategy.setup_optimizer(torch.optim.AdamW(module.parameters(), lr=1e-4))
        between = 0
        for step in range(args.steps):
            batch = strategy.batch_to_device(tokens)
            loss = module(batch)
            strategy.backward(loss)
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            del loss, batch
            if cuda:
                torch.cuda.synchronize()
            between = allocated() - before
            if step == 0 and cuda:
                torch.cuda.reset_peak_memory_stats()
        peak = torch.cuda.max_memory_allocated() - before if cuda else 0
        return {"peak": peak, "between": between}

    held = strategy.launch(train)
    peak, between = held["peak"], held["between"]
    return {
        "precision": precision,
        "parameters": shape.parameters,
        "activation_bytes_per_sample": shape.activation_bytes_per_sample,
        "largest_activation_bytes_per_sample": shape.largest_activation_bytes_per_sample,
        "plan": memory.to_dict(),
        "max_memory_allocated": peak,
        "allocated_between_steps": between,
        "peak_over_device_bytes": round(peak / memory.device_bytes, 4),
        "breakdown": list(memory.breakdown()),
        "within_10_percent": abs(peak / memory.device_bytes - 1) <= 0.10,
        # between steps the gradients are gone (set to None)
        "between_over_parameters_and_optimizer_state": round(
            between / (memory.parameter_bytes + memory.optimizer_state_bytes
                       + memory.module_buffer_bytes + memory.buffer_bytes), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precisions", default="32-true,bf16-mixed,bf16-true")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__,
               "settings": {k: v for k, v in vars(args).items() if k != "json"},
               "runs": runs}
    for precision in args.precisions.split(","):
        run = measure(args, precision)
        runs.append(run)
        gib = 2**30
        plan = run["plan"]
        print(f"{precision:>11}: peak {run['max_memory_allocated'] / gib:.3f} GiB, plan "
              f"device_bytes {plan['device_bytes'] / gib:.3f} GiB (model state "
              f"{plan['model_state_bytes'] / gib:.3f}, buffers "
              f"{plan['buffer_bytes'] / gib:.3f}, activations "
              f"{plan['activation_bytes'] / gib:.3f}); peak/plan "
              f"{run['peak_over_device_bytes']}; between steps "
              f"{run['allocated_between_steps'] / gib:.3f} GiB "
              f"({run['between_over_parameters_and_optimizer_state']} of parameters, "
              "optimizer state and buffers)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
