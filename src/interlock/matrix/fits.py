"""What fits: reference models x strategies and layouts x reference machines, each
cell what `interlock.plan(model=...)` says one device holds, or its refusal.

Rendered into ``docs/memory-fits.md`` (``python -m interlock.matrix.fits``, and ``nox -s
matrix -- --update``) and, for the first machine, a section of the compatibility
pages; a test fails when the committed page differs from what the engine says.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from interlock.engine.errors import ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.memory import GiB, format_bytes
from interlock.engine.model import ModelShape
from interlock.engine.planner import plan

FITS_PATH = Path("docs") / "memory-fits.md"
#: the precision and optimizer every cell is planned with: the usual training setup
PRECISION, OPTIMIZER = "bf16-mixed", "adamw"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceModel:
    """A decoder-only transformer sized by its parameters and layers."""

    name: str
    parameters: int
    layers: int

    def shape(self) -> ModelShape:
        """Its shape: equal layers, each an FSDP unit and split by tensor parallel (the
        embeddings and norms are folded into the layers: a few percent)."""
        per_layer = self.parameters // self.layers
        total = per_layer * self.layers
        return ModelShape(parameters=total, layers=(per_layer,) * self.layers,
                          largest_unit=per_layer, tensor_parallel=total)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceMachine:
    """One node: its accelerator, how many ranks it runs, its memory."""

    name: str
    accelerator: str
    devices: int
    machine: Machine


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """A strategy, and the degrees it runs with (None: its own default)."""

    label: str
    strategy: str
    parallelism: str | None = None


MODELS: tuple[ReferenceModel, ...] = (
    ReferenceModel(name="1B", parameters=1_000_000_000, layers=16),
    ReferenceModel(name="7B", parameters=7_000_000_000, layers=32),
    ReferenceModel(name="70B", parameters=70_000_000_000, layers=80),
    ReferenceModel(name="405B", parameters=405_000_000_000, layers=126),
)

_PACKAGES = frozenset({"deepspeed"})
MACHINES: tuple[ReferenceMachine, ...] = (
    ReferenceMachine(name="8 x 80 GiB GPUs", accelerator="cuda", devices=8, machine=Machine(
        cuda_devices=8, device_memory=80 * GiB, host_memory=2048 * GiB, packages=_PACKAGES)),
    ReferenceMachine(name="8 x 141 GiB GPUs", accelerator="cuda", devices=8, machine=Machine(
        cuda_devices=8, device_memory=141 * GiB, host_memory=2048 * GiB,
        packages=_PACKAGES)),
    ReferenceMachine(name="a workstation, 2 x 24 GiB GPUs", accelerator="cuda", devices=2,
                     machine=Machine(cuda_devices=2, device_memory=24 * GiB,
                                     host_memory=128 * GiB, packages=_PACKAGES)),
    ReferenceMachine(name="a CPU host of 512 GiB, 8 ranks", accelerator="cpu", devices=8,
                     machine=Machine(host_memory=512 * GiB, packages=_PACKAGES)),
)

LAYOUTS: tuple[Layout, ...] = (
    Layout(label="ddp", strategy="ddp"),
    Layout(label="fsdp", strategy="fsdp"),
    Layout(label="fsdp_cpu_offload", strategy="fsdp_cpu_offload"),
    Layout(label="model_parallel tp=2 x dp_shard", strategy="model_parallel",
           parallelism="tp=2,dp_shard=auto"),
    Layout(label="model_parallel pp=2 x dp_shard", strategy="model_parallel",
           parallelism="pp=2,dp_shard=auto"),
    Layout(label="deepspeed_stage_3", strategy="deepspeed_stage_3"),
    Layout(label="deepspeed_stage_3_offload", strategy="deepspeed_stage_3_offload"),
)


def cell(model: ReferenceModel, machine: ReferenceMachine, layout: Layout) -> str:
    """What one device holds, ``"✗ N GiB"`` where that is more than it has, or the
    code of another refusal."""
    flags = {"accelerator": machine.accelerator, "devices": machine.devices,
             "strategy": layout.strategy, "precision": PRECISION,
             "parallelism": layout.parallelism, "model": model.shape(),
             "optimizer": OPTIMIZER}
    try:
        found = plan(machine=machine.machine, **flags)  # type: ignore[arg-type]
    except ResolutionError as error:
        if error.code != "insufficient-memory":
            return f"`{error.code}`"
        unbounded = dataclasses.replace(machine.machine, device_memory=None,
                                        host_memory=None)
        memory = plan(machine=unbounded, **flags).memory  # type: ignore[arg-type]
        assert memory is not None
        where = "" if error.rule == "memory/device-exceeded" else " (host)"
        need = memory.device_bytes if not where else memory.host_bytes
        return f"✗ {format_bytes(need)}{where}"
    assert found.memory is not None
    text = format_bytes(found.memory.device_bytes)
    if found.memory.host_bytes:
        text += f" + {format_bytes(found.memory.host_bytes)} host"
    return text


def table(machine: ReferenceMachine) -> tuple[list[str], list[list[str]]]:
    """One machine's table: headers, and a row per model."""
    headers = ["model", *(f"`{layout.label}`" for layout in LAYOUTS)]
    rows = [[model.name, *(cell(model, machine, layout) for layout in LAYOUTS)]
            for model in MODELS]
    return headers, rows


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub table."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(row) + " |" for row in rows)]


INTRO = (
    "Each cell is what `interlock.plan(model=..., optimizer='adamw', precision="
    "'bf16-mixed')` says one device holds for that model, strategy and layout on that "
    "machine (one node): float32 parameters, gradients and AdamW state (16 bytes per "
    "parameter, divided as the layout shards them), the module's and the strategy's "
    "buffers; `+ N host` is state offloaded to host memory per rank; `✗ N` is a plan "
    "refused with `insufficient-memory`, N what a device (or the host) would need; "
    "another code is a refusal for another reason. Activations are not counted (they "
    "depend on the batch and sequence: give `ModelShape.activation_bytes_per_sample` "
    "and `micro_batch_size`). Each model is a stack of equal layers, each its own FSDP "
    "unit and split by tensor parallel; DeepSpeed is taken as installed. How each "
    "figure is worked out: [memory.md](memory.md)."
)


def render_markdown() -> str:
    """The text of docs/memory-fits.md."""
    out = ["# What fits", "",
           "<!-- Generated by `python -m interlock.matrix.fits` from the engine's own "
           "answers.", "     Do not edit by hand: a test fails when this file differs "
           "from the code. -->", "", INTRO, ""]
    for machine in MACHINES:
        out += [f"## {machine.name}", ""]
        out += markdown_table(*table(machine))
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/memory-fits.md under ROOT (default: the current directory)."""
    from interlock.engine.docs import checkout_root
    from interlock.output_files import write_text

    root = checkout_root(None if argv is None else list(argv),
                         "python -m interlock.matrix.fits", "docs/memory-fits.md")

    path = write_text(root / FITS_PATH, render_markdown())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
