"""The memory stage, the last: what each rank holds, and whether it fits.

Runs only when ``plan(model=...)`` gives a `ModelShape`; without one the stage adds
nothing to the plan or its trace. Every figure comes from a row: the precision's
dtypes, the optimizer's state per parameter, the strategy's `MemoryTraits`, and the
accelerator's reserve for its runtime. A setup whose rank needs more than the machine
says it has is refused with ``insufficient-memory``; where the machine's memory is not
known, nothing is refused and the estimate stands alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.machine import Machine
from interlock.engine.memory import (
    NOT_ESTIMATED,
    SHARDING_GROUP,
    Dtypes,
    MemoryEstimate,
    Share,
    activations,
    dtypes,
    format_bytes,
    rank_share,
    strategy_buffers,
)
from interlock.engine.model import ModelShape
from interlock.engine.optimizers import DEFAULT_OPTIMIZER, OptimizerRow
from interlock.engine.parallelism import Parallelism
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import Decision, Draft, Rule, Stage, always, refuse, run_stage
from interlock.engine.runner import Step
from interlock.engine.specs import StrategySpec
from interlock.engine.trace import TraceStep


class MemoryInput(NamedTuple):
    """What the memory stage decides from.

    Attributes:
        machine: the machine planned for (its memory).
        parts: the registry's snapshot (optimizer, precision, accelerator rows).
        shape: the model's shape.
        optimizer: the optimizer flag as written (a name), or None.
        micro_batch_size: samples per rank per forward, or None.
        accelerator: the chosen accelerator.
        spec: the chosen strategy's row (its memory traits).
        precision: the chosen precision.
        degrees: the plan's degrees of parallelism.
        parallel_devices: the devices of one node (a rank each).
    """

    machine: Machine
    parts: PartTables
    shape: ModelShape
    optimizer: str | None
    micro_batch_size: int | None
    accelerator: str
    spec: StrategySpec
    precision: str
    degrees: Parallelism
    parallel_devices: tuple[str, ...]


class MemoryChoice(NamedTuple):
    """The memory stage's result: the estimate, the optimizer row it counted, notes and
    trace."""

    estimate: MemoryEstimate
    optimizer: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class MemoryDraft(Draft):
    """The memory stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({
        "optimizer", "sizes", "share", "buffers", "activation", "estimate"})

    machine: Machine
    parts: PartTables
    shape: ModelShape
    optimizer_input: str | None
    micro_batch_size: int | None
    accelerator: str
    spec: StrategySpec
    precision: str
    degrees: Parallelism
    devices_per_node: int
    # decided
    optimizer: OptimizerRow | None = None
    sizes: Dtypes | None = None
    share: Share | None = None
    buffers: tuple[int, str] = (0, "")
    activation: tuple[int | None, str] = (None, "")
    estimate: MemoryEstimate | None = None

    @property
    def group(self) -> int:
        """The sharding group's size (``dp_shard_cp``)."""
        return self.degrees.group_size("dp_shard_cp")


# ----------------------------------------------------------------------- optimizer


def _given(ctx: MemoryDraft) -> str:
    ctx.optimizer = ctx.parts.optimizers[str(ctx.optimizer_input)]
    return f"optimizer {ctx.optimizer.name!r}: {ctx.optimizer.description}"


def _assumed(ctx: MemoryDraft) -> str:
    ctx.optimizer = ctx.parts.optimizers[DEFAULT_OPTIMIZER]
    ctx.note(f"no optimizer given: the memory estimate assumes {DEFAULT_OPTIMIZER!r} "
             "(pass optimizer= to plan for another)")
    return f"optimizer {DEFAULT_OPTIMIZER!r} assumed: none was given"


MEMORY_OPTIMIZER: Decision[MemoryDraft] = Decision(
    id="memory/optimizer",
    doc="The optimizer's row says what state it keeps per parameter.",
    rules=(
        Rule(id="memory/optimizer-given",
             doc="The optimizer flag names a row (the sizing stage refused any other).",
             when=lambda c: c.optimizer_input is not None, then=_given),
        Rule(id="memory/optimizer-assumed",
             doc=f"No optimizer given: {DEFAULT_OPTIMIZER!r}, said in the notes.",
             when=always, then=_assumed),
    ),
)

# ----------------------------------------------------------------------- model state


def _work_out(ctx: MemoryDraft) -> tuple[Dtypes, Share]:
    row = ctx.parts.precisions[ctx.precision]
    assert ctx.optimizer is not None  # the optimizer decision ran first
    mixed = row.param_dtype == "float32" and row.compute_dtype in ("float16", "bfloat16")
    sizes = dtypes(ctx.shape, param_dtype=row.param_dtype, compute_dtype=row.compute_dtype,
                   mixed=mixed, optimizer=ctx.optimizer, traits=ctx.spec.memory_traits,
                   precision_state=row.state_tensors)
    return sizes, rank_share(ctx.shape, ctx.degrees, ctx.spec.memory_traits)


def _model_state(ctx: MemoryDraft) -> str:
    ctx.sizes, ctx.share = _work_out(ctx)
    assert ctx.optimizer is not None
    state = ctx.optimizer.state_tensors
    per = (f"{state} state tensor{'s' if state != 1 else ''} of "
           f"{ctx.sizes.optimizer} bytes" + (" and a float32 master copy" if
                                              ctx.sizes.master else ""))
    if ctx.sizes.precision_state:
        per += (f", and the precision's {ctx.sizes.precision_state} of "
                f"{ctx.sizes.parameter} bytes")
    return (f"{ctx.sizes.names}; optimizer: {per} per element; {ctx.share.how}")


def _replicated(ctx: MemoryDraft) -> bool:
    return ctx.group <= 1 or not ctx.spec.memory_traits.sharded


MEMORY_MODEL_STATE: Decision[MemoryDraft] = Decision(
    id="memory/model-state",
    doc="Parameters, gradients and optimizer state per rank: the precision's dtypes, the "
    "optimizer's state per element, and the layout: a pipeline stage's layers, "
    "tensor-parallel weights split over tp, and the states the strategy's memory traits "
    f"shard split over {SHARDING_GROUP}.",
    rules=(
        Rule(id="memory/replicated",
             doc="No sharding group (or a strategy that shards nothing): every state "
             "whole on every rank, less what tp and pp split.",
             when=_replicated, then=_model_state),
        Rule(id="memory/sharded",
             doc=f"The states the strategy shards are split over {SHARDING_GROUP}: by rows "
             "and padded (FSDP), or as one flat buffer (ZeRO).",
             when=always, then=_model_state),
    ),
)

# ----------------------------------------------------------------------- buffers


def _buffers(ctx: MemoryDraft) -> str:
    assert ctx.sizes is not None and ctx.share is not None
    data_parallel = ctx.degrees.group_size("dp_cp")
    ctx.buffers = strategy_buffers(ctx.shape, ctx.share, ctx.sizes, ctx.spec.memory_traits,
                                   data_parallel)
    if ctx.buffers[1].startswith(NOT_ESTIMATED):
        ctx.note(ctx.buffers[1])
        return ctx.buffers[1]
    return f"{format_bytes(ctx.buffers[0])}: {ctx.buffers[1]}"


def _buffers_are(kind: str) -> Callable[[MemoryDraft], bool]:
    return lambda c: c.spec.memory_traits.buffers == kind


MEMORY_BUFFERS: Decision[MemoryDraft] = Decision(
    id="memory/buffers",
    doc="What the strategy allocates itself, by its memory traits.",
    rules=tuple(
        Rule(id=f"memory/buffers-{kind.replace('_', '-')}", doc=doc,
             when=_buffers_are(kind) if kind != "none" else always, then=_buffers)
        for kind, doc in (
            ("gradient_buckets", "DDP: flat gradient buckets as large as the gradients "
             "(unless gradient_as_bucket_view)."),
            ("gathered_units", "FSDP: the largest unit gathered in the compute dtype and "
             "the next prefetched, and its unsharded gradients with their reduce-scatter "
             "copy; nothing without data parallelism unless the strategy gathers alone."),
            ("zero_buckets", "DeepSpeed: a reduce and an all-gather bucket."),
            ("none", "Nothing else."),
        )
    ),
)

# ----------------------------------------------------------------------- activations


def _activations(ctx: MemoryDraft) -> str:
    ctx.activation = activations(ctx.shape, ctx.degrees, ctx.micro_batch_size)
    amount, words = ctx.activation
    return words if amount is None else f"{format_bytes(amount)}: {words}"


MEMORY_ACTIVATIONS: Decision[MemoryDraft] = Decision(
    id="memory/activations",
    doc="Activations kept for backward: the shape's bytes per sample (and twice its largest "
    "tensor's, for the gradients in flight when backward starts) times the micro-batch, "
    "split over tp x cp; unknown without both.",
    rules=(
        Rule(id="memory/activations-estimated", doc="Both are given.",
             when=lambda c: c.shape.activation_bytes_per_sample is not None
             and c.micro_batch_size is not None, then=_activations),
        Rule(id="memory/activations-unknown", doc="Otherwise: not estimated.",
             when=always, then=_activations),
    ),
)

# ----------------------------------------------------------------------- placement


def _limits(ctx: MemoryDraft) -> tuple[int | None, int | None, str]:
    """The usable bytes per rank on its device and in host memory, and in words."""
    machine, per_node = ctx.machine, max(1, ctx.devices_per_node)
    reserve = ctx.parts.accelerators[ctx.accelerator].memory_reserve
    # what each rank's process keeps of host memory: the cpu row's reserve
    process = ctx.parts.accelerators["cpu"].memory_reserve
    host = machine.host_memory
    host_share = None if host is None else max(0, host // per_node - process)
    if ctx.accelerator == "cpu":
        if host is None or host_share is None:
            return None, None, "the host's memory is not known"
        return host_share, None, (f"the host's {format_bytes(host)} shared by {per_node} "
                                  f"rank{'s' if per_node != 1 else ''}, less "
                                  f"{format_bytes(process)} each for the process itself")
    device = machine.device_memory
    words = ("the device's memory is not known" if device is None else
             f"a {ctx.accelerator} device's {format_bytes(device)} less the "
             f"{format_bytes(reserve)} its runtime keeps")
    return (None if device is None else max(0, device - reserve)), host_share, words


def _place(ctx: MemoryDraft) -> str:
    assert ctx.sizes is not None and ctx.share is not None
    share, sizes, traits = ctx.share, ctx.sizes, ctx.spec.memory_traits
    assert ctx.optimizer is not None
    parameter = (share.parameters + share.frozen) * sizes.parameter
    gradient = share.gradients * sizes.parameter
    optimizer = (share.optimizer * (ctx.optimizer.state_tensors * sizes.optimizer
                                    + sizes.precision_state * sizes.parameter
                                    + sizes.master)
                 + share.tensors * ctx.optimizer.scalar_bytes)
    by_state = {"parameters": parameter, "gradients": gradient, "optimizer": optimizer}
    # on the CPU the device is host memory: offloading moves nothing out of it
    offloaded = (() if ctx.accelerator == "cpu"
                 else tuple(s for s in by_state if s in traits.offloaded))
    off = sum(by_state[s] for s in offloaded)
    activation = ctx.activation[0]
    device_limit, host_limit, _ = _limits(ctx)
    ctx.estimate = MemoryEstimate(
        parameter_bytes=parameter, gradient_bytes=gradient, optimizer_state_bytes=optimizer,
        module_buffer_bytes=ctx.shape.buffer_bytes, buffer_bytes=ctx.buffers[0],
        activation_bytes=activation,
        device_bytes=(parameter + gradient + optimizer - off + ctx.shape.buffer_bytes
                      + ctx.buffers[0] + (activation or 0)),
        host_bytes=off if traits.offload_to == "host" else 0,
        offloaded=offloaded, offload_to=traits.offload_to, rank=share.rank,
        device_limit=device_limit, host_limit=host_limit if offloaded else None,
        unknown=(("FSDP's gathered units: give ModelShape.largest_unit",)
                 if ctx.buffers[1].startswith(NOT_ESTIMATED) else ()),
        master_bytes=share.optimizer * sizes.master)
    if offloaded:
        return (f"{', '.join(offloaded)} ({format_bytes(off)}) kept in "
                f"{'host memory' if traits.offload_to == 'host' else 'NVMe files'}; "
                f"{format_bytes(ctx.estimate.device_bytes)} on the device")
    return f"{format_bytes(ctx.estimate.device_bytes)} on the device, nothing offloaded"


MEMORY_PLACEMENT: Decision[MemoryDraft] = Decision(
    id="memory/placement",
    doc="Where the state lives: offloaded states in host memory (or NVMe), the rest on "
    "the device with the buffers and activations.",
    rules=(
        Rule(id="memory/offloaded",
             doc="The strategy offloads some states (off the CPU: there, host memory is "
             "the device's).",
             when=lambda c: bool(c.spec.memory_traits.offloaded) and c.accelerator != "cpu",
             then=_place),
        Rule(id="memory/on-device", doc="Everything on the device.", when=always,
             then=_place),
    ),
)

# ----------------------------------------------------------------------- fit


def _estimate(ctx: MemoryDraft) -> MemoryEstimate:
    assert ctx.estimate is not None
    return ctx.estimate


def _device_exceeded(ctx: MemoryDraft) -> bool:
    e = _estimate(ctx)
    return e.device_limit is not None and e.device_bytes > e.device_limit


def _host_exceeded(ctx: MemoryDraft) -> bool:
    e = _estimate(ctx)
    return e.host_limit is not None and e.host_bytes > e.host_limit


def _parts_text(e: MemoryEstimate) -> str:
    pieces = [("parameters", e.parameter_bytes), ("gradients", e.gradient_bytes),
              ("optimizer state", e.optimizer_state_bytes),
              ("module buffers", e.module_buffer_bytes),
              ("strategy buffers", e.buffer_bytes), ("activations", e.activation_bytes or 0)]
    named = {"parameters": "parameters", "gradients": "gradients",
             "optimizer state": "optimizer"}
    return ", ".join(f"{name} {format_bytes(size)}" for name, size in pieces
                     if size and named.get(name) not in e.offloaded)


def _refuse_fit(where: str) -> Callable[[MemoryDraft], str]:
    def then(ctx: MemoryDraft) -> str:
        e = _estimate(ctx)
        _, _, words = _limits(ctx)
        if where == "device":
            need, limit = e.device_bytes, e.device_limit
            what = (f"each rank needs {format_bytes(need)} on its {ctx.accelerator} device "
                    f"({_parts_text(e)})")
            has = (f"{words}: {format_bytes(limit or 0)} usable" if ctx.accelerator != "cpu"
                   else f"{words}: {format_bytes(limit or 0)} per rank")
        else:
            need, limit = e.host_bytes, e.host_limit
            what = (f"each rank offloads {format_bytes(need)} to host memory "
                    f"({', '.join(e.offloaded)})")
            host = ctx.machine.host_memory or 0
            has = (f"the host's {format_bytes(host)} shared by {ctx.devices_per_node} "
                   f"ranks leaves {format_bytes(limit or 0)} each")
        refuse("insufficient-memory", flag="model", value=ctx.shape,
               reason=f"{ctx.spec.name!r} with {ctx.precision} does not fit: {what}, but "
               f"{has} ({e.rank}; short by {format_bytes(need - (limit or 0))}).")
    return then


MEMORY_FIT: Decision[MemoryDraft] = Decision(
    id="memory/fit",
    doc="A rank that needs more than its device (or, for offloaded state, the host) has "
    "is refused; where the machine's memory is not known nothing is refused.",
    rules=(
        Rule(id="memory/device-exceeded",
             doc="More than the device's memory less the runtime's reserve (on the CPU: "
             "the host's memory shared by the node's ranks, less their processes' own).",
             when=_device_exceeded, then=_refuse_fit("device"),
             refuses="insufficient-memory"),
        Rule(id="memory/host-exceeded",
             doc="Offloaded state beyond the host memory each rank has.",
             when=_host_exceeded, then=_refuse_fit("host"),
             refuses="insufficient-memory"),
        Rule(id="memory/limit-unknown",
             doc="The machine does not say how much memory it has: the estimate only.",
             when=lambda c: _estimate(c).device_limit is None,
             then=lambda c: f"{_limits(c)[2]}: nothing refused"),
        Rule(id="memory/fits", doc="Otherwise it fits.", when=always,
             then=lambda c: f"fits: {format_bytes(_estimate(c).device_bytes)} of "
             f"{format_bytes(_estimate(c).device_limit or 0)} usable ({_limits(c)[2]})"),
    ),
)

MEMORY_STAGE: Stage[MemoryDraft] = Stage(
    name="memory",
    doc="What each rank holds, from the model's shape, and whether it fits.",
    decisions=(MEMORY_OPTIMIZER, MEMORY_MODEL_STATE, MEMORY_BUFFERS, MEMORY_ACTIVATIONS,
               MEMORY_PLACEMENT, MEMORY_FIT),
)


def estimate_memory(inputs: MemoryInput) -> MemoryChoice:
    """The memory stage.

    Raises:
        ResolutionError: ``insufficient-memory`` (without choices: the planner adds
            those that fit).
    """
    draft = MemoryDraft(machine=inputs.machine, parts=inputs.parts, shape=inputs.shape,
                        optimizer_input=inputs.optimizer,
                        micro_batch_size=inputs.micro_batch_size,
                        accelerator=inputs.accelerator, spec=inputs.spec,
                        precision=inputs.precision, degrees=inputs.degrees,
                        devices_per_node=len(inputs.parallel_devices))
    trace = run_stage(MEMORY_STAGE, draft, inputs.parts)
    assert draft.estimate is not None and draft.optimizer is not None  # always set
    return MemoryChoice(estimate=draft.estimate, optimizer=draft.optimizer.name,
                        notes=tuple(draft.notes), trace=trace)


STEP = Step("memory", estimate_memory, MemoryInput, writes={}, when="shape")
