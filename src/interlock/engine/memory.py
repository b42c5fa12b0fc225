"""Memory as a plan-time fact: what one rank holds, from the rows the plan chose.

`estimate` is pure arithmetic over a `ModelShape`, the precision's row (the dtypes),
the optimizer's row (the state per parameter), the strategy's `MemoryTraits` (what it
shards, what it offloads, what it allocates itself) and the plan's degrees of
parallelism. The memory stage (`interlock.engine.stages.memory`) runs it, records
each figure's rule in the trace, and refuses a setup that does not fit.

Every figure is for the rank that holds the most: pipeline stage 0 when stages are
uneven (it takes the extra layer), the first shard when a tensor's rows do not divide
evenly (FSDP pads the last shards, so every rank's storage is that size).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from interlock.engine.limits import int_in, short_repr
from interlock.engine.model import DTYPE_BYTES, MAX_BYTES, ModelShape
from interlock.engine.optimizers import OptimizerRow
from interlock.engine.parallelism import FLATTENED, Parallelism

#: the sharding group in words (``"dp_shard x cp"``): what sharded states are split over
SHARDING_GROUP = " x ".join(FLATTENED["dp_shard_cp"][0])

#: how the words of a figure left out of the estimate begin
NOT_ESTIMATED = "FSDP's gathered units are not estimated:"

#: the states a strategy may shard or offload
STATES: tuple[str, ...] = ("parameters", "gradients", "optimizer")

#: what a strategy allocates beside the model's state (`MemoryTraits.buffers`)
BufferKind = Literal["none", "gradient_buckets", "gathered_units", "zero_buckets"]
BUFFER_KINDS: tuple[str, ...] = ("none", "gradient_buckets", "gathered_units",
                                 "zero_buckets")

GiB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTraits:
    """How a strategy holds a model: a strategy row's memory facts (``StrategySpec.memory``).

    Attributes:
        sharded: the states split over the sharding group (``dp_shard x cp``) when it
            has more than one rank: FSDP and ZeRO-3 shard all three, ZeRO-2 gradients
            and optimizer state, ZeRO-1 optimizer state only. Without a sharding group
            every state is whole on every rank (DDP, one device).
        split: how a sharded tensor is split: ``"rows"`` (each tensor by its first
            dimension, the last shards padded: FSDP) or ``"flat"`` (all tensors as one
            flat buffer cut in equal parts: ZeRO).
        offloaded: the states kept in host memory (or on NVMe) between uses instead of
            on the device.
        offload_to: where offloaded states live, ``"host"`` or ``"nvme"``.
        master_weights: the optimizer keeps float32 copies of the parameters (of its
            share of them) and its state in float32, whatever the parameters' dtype
            (DeepSpeed's ZeRO optimizer).
        buffers: what the strategy allocates itself: ``"gradient_buckets"`` (DDP's flat
            gradient buckets, as large as the gradients), ``"gathered_units"`` (FSDP:
            the largest unit's parameters gathered, the next one prefetched, and its
            unsharded gradients with their reduce-scatter copy), ``"zero_buckets"``
            (DeepSpeed's reduce and all-gather buckets of ``bucket_elements`` each) or
            ``"none"``.
        bucket_elements: the elements of one ZeRO bucket (``reduce_bucket_size``).
        gathers_alone: ``gathered_units`` are allocated on every layout, one rank and
            replicas only included (an ``FSDPStrategy`` shards over a mesh of one and
            still gathers); False: only when there is data parallelism to shard over
            (a ``model_parallel`` user function applies FSDP only then).
    """

    sharded: frozenset[str] = frozenset(STATES)
    split: Literal["rows", "flat"] = "rows"
    offloaded: frozenset[str] = frozenset()
    offload_to: Literal["host", "nvme"] = "host"
    master_weights: bool = False
    buffers: BufferKind = "gathered_units"
    bucket_elements: int = 0
    gathers_alone: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharded", frozenset(self.sharded))
        object.__setattr__(self, "offloaded", frozenset(self.offloaded))

    def problems(self) -> list[str]:
        """What is wrong with these traits (empty when nothing is)."""
        found = []
        for name in ("sharded", "offloaded"):
            unknown = sorted(set(getattr(self, name)) - set(STATES))
            if unknown:
                found.append(f"memory.{name} has {unknown}; the states are "
                             f"{', '.join(STATES)}")
        if self.split not in ("rows", "flat"):
            found.append(f"memory.split must be 'rows' or 'flat', got {self.split!r}")
        if self.offload_to not in ("host", "nvme"):
            found.append(f"memory.offload_to must be 'host' or 'nvme', got "
                         f"{self.offload_to!r}")
        if not isinstance(self.master_weights, bool) or not isinstance(self.gathers_alone,
                                                                         bool):
            found.append("memory.master_weights and memory.gathers_alone must be bools")
        if self.buffers not in BUFFER_KINDS:
            found.append(f"memory.buffers must be one of {', '.join(BUFFER_KINDS)}, got "
                         f"{self.buffers!r}")
        if not int_in(self.bucket_elements, 0, MAX_BYTES):
            found.append(f"memory.bucket_elements must be an int >= 0, got "
                         f"{short_repr(self.bucket_elements)}")
        return found


#: the traits of a strategy that keeps everything whole on every rank (DDP)
REPLICATED = MemoryTraits(sharded=frozenset(), buffers="gradient_buckets")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """What one rank holds, in bytes (`interlock.Plan.memory`).

    Attributes:
        parameter_bytes: the rank's own parameter tensors (local shards only), frozen
            ones included.
        gradient_bytes: its gradient tensors.
        optimizer_state_bytes: its optimizer state (float32 master weights included
            where the strategy keeps them).
        module_buffer_bytes: the module's buffers (running statistics), held whole.
        buffer_bytes: what the strategy allocates itself (gradient buckets, gathered
            units and their unsharded gradients, ZeRO buckets).
        activation_bytes: activations kept for the backward pass, or None when the shape
            or the micro-batch size does not say.
        device_bytes: what must fit on one device: the model state not offloaded, the
            module's and the strategy's buffers and the activations when known.
        host_bytes: the state offloaded to host memory (per rank).
        offloaded: the states kept off the device.
        offload_to: where they are kept (``"host"`` or ``"nvme"``).
        rank: which rank the figures are for, in words.
        unknown: what the estimate leaves out for want of a fact, in words (the
            gathered units of a shape without ``largest_unit``).
        master_bytes: of ``optimizer_state_bytes``, the float32 master copies of the
            parameters (a strategy with ``MemoryTraits.master_weights``).
        device_limit: the bytes a rank may use on its device (its memory less the
            runtime's reserve; on the CPU, the host's share per rank), None when unknown.
        host_limit: the host memory one rank may use for offloaded state, None when
            unknown.
    """

    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    module_buffer_bytes: int
    buffer_bytes: int
    activation_bytes: int | None
    device_bytes: int
    host_bytes: int
    offloaded: tuple[str, ...] = ()
    offload_to: str = "host"
    rank: str = "every rank"
    device_limit: int | None = None
    host_limit: int | None = None
    unknown: tuple[str, ...] = ()
    master_bytes: int = 0

    @property
    def model_state_bytes(self) -> int:
        """Parameters, gradients and optimizer state: the rank's own tensors."""
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    def fits(self) -> bool:
        """Whether it fits where the limits are known (unknown limits refuse nothing)."""
        return ((self.device_limit is None or self.device_bytes <= self.device_limit)
                and (self.host_limit is None or self.host_bytes <= self.host_limit))

    def breakdown(self) -> tuple[str, ...]:
        """The figures, one line each, for `Plan.explain`."""
        where = (f" (offloaded to {self.offload_to}: {', '.join(self.offloaded)})"
                 if self.offloaded else "")
        lines = [
            f"parameters       {format_bytes(self.parameter_bytes)}",
            f"gradients        {format_bytes(self.gradient_bytes)}",
            f"optimizer state  {format_bytes(self.optimizer_state_bytes)}",
            f"model state      {format_bytes(self.model_state_bytes)}{where}",
            f"module buffers   {format_bytes(self.module_buffer_bytes)}",
            f"strategy buffers {format_bytes(self.buffer_bytes)}"
            + "".join(f" (not counted: {what})" for what in self.unknown),
            "activations      " + ("not estimated (give the shape's "
                                   "activation_bytes_per_sample and micro_batch_size)"
                                   if self.activation_bytes is None
                                   else format_bytes(self.activation_bytes)),
            f"on the device    {format_bytes(self.device_bytes)}"
            + (f" of {format_bytes(self.device_limit)} usable" if self.device_limit
               is not None else " (the device's memory is not known: nothing refused)"),
        ]
        if self.offloaded:
            lines.append(f"in host memory   {format_bytes(self.host_bytes)}"
                         + (f" of {format_bytes(self.host_limit)} usable"
                            if self.host_limit is not None else ""))
        return tuple(lines)

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly view."""
        return {
            "parameter_bytes": self.parameter_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "model_state_bytes": self.model_state_bytes,
            "module_buffer_bytes": self.module_buffer_bytes,
            "buffer_bytes": self.buffer_bytes,
            "activation_bytes": self.activation_bytes,
            "device_bytes": self.device_bytes,
            "host_bytes": self.host_bytes,
            "offloaded": list(self.offloaded),
            "offload_to": self.offload_to,
            "rank": self.rank,
            "device_limit": self.device_limit,
            "host_limit": self.host_limit,
            "unknown": list(self.unknown),
            "master_bytes": self.master_bytes,
        }


# ------------------------------------------------------------------------ byte sizes

_UNITS: Mapping[str, int] = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``"80GiB"``, ``"141 GB"``, ``"24g"`` (GiB), ``"1.5TiB"`` or a plain number of bytes.

    Raises:
        ValueError: not a size, or beyond an exabyte.
    """
    found = _SIZE.match(text.lower()) if isinstance(text, str) and len(text) < 64 else None
    if found is None or found.group(2) not in _UNITS:
        raise ValueError(f"{short_repr(text)} is not a size: write a number with a unit, "
                         "such as 80GiB, 141GB or 512MiB (k, m, g, t mean KiB, MiB, GiB, TiB)")
    value = float(found.group(1)) * _UNITS[found.group(2)]
    if not 1 <= value <= MAX_BYTES:
        raise ValueError(f"{text!r} is not a memory size from 1 byte to an exabyte")
    return int(value)


def format_bytes(count: int) -> str:
    """A size for people, in one binary unit: ``"13.0 GiB"``, ``"512 B"``."""
    if count < 1024:
        return f"{count} B"
    for size, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if count >= size:
            return f"{count / size:.1f} {unit}" if count / size >= 10 else \
                f"{count / size:.2f} {unit}"
    return f"{count} B"  # pragma: no cover - unreachable


# ------------------------------------------------------------------------ arithmetic


class Dtypes(NamedTuple):
    """The dtypes a precision stores, computes, gathers and reduces in, by bytes."""

    parameter: int
    compute_gather: int
    reduce: int
    optimizer: int
    master: int
    names: str
    #: state tensors per element the precision keeps beside the optimizer's (its row's)
    precision_state: int = 0


def dtypes(shape: ModelShape, *, param_dtype: str, compute_dtype: str, mixed: bool,
           optimizer: OptimizerRow, traits: MemoryTraits, precision_state: int = 0) -> Dtypes:
    """The element sizes under a precision row: a row that stores parameters in a dtype
    other than float32 casts the model to it; 32-true and the mixed precisions keep the
    shape's own dtype."""
    stored = param_dtype if param_dtype != "float32" else shape.dtype
    size = DTYPE_BYTES.get(stored, 4)
    # ZeRO keeps float32 partitions of its own even of float32 parameters
    master = 4 if traits.master_weights else 0
    gather = DTYPE_BYTES.get(compute_dtype, size) if mixed else size
    state = (DTYPE_BYTES.get(optimizer.state_dtype, size) if optimizer.state_dtype
             else (4 if master else size))
    names = f"parameters and gradients in {stored}"
    if mixed:
        names += f", gathered in {compute_dtype}, reduced in float32"
    return Dtypes(parameter=size, compute_gather=min(gather, size),
                  reduce=4 if mixed else size, optimizer=state, master=master, names=names,
                  precision_state=precision_state)


def pipeline_stages(shape: ModelShape, stages: int) -> tuple[int, ...]:
    """The trainable elements of each pipeline stage: the default split's runs of
    consecutive layers (as even a count of layers as can be, earlier stages one more:
    `interlock.strategies.pipeline.split_sequential`), or equal shares when the shape
    lists no layers."""
    if stages <= 1:
        return (shape.parameters,)
    if len(shape.layers) < stages:
        share = math.ceil(shape.parameters / stages)
        return tuple(min(share, max(0, shape.parameters - s * share)) for s in range(stages))
    size, extra = divmod(len(shape.layers), stages)
    found, start = [], 0
    for s in range(stages):
        count = size + (1 if s < extra else 0)
        found.append(sum(shape.layers[start:start + count]))
        start += count
    return tuple(found)


class Share(NamedTuple):
    """The elements one rank holds of each state, and how that was worked out."""

    parameters: int
    frozen: int
    gradients: int
    optimizer: int
    tensors: int
    stage: int
    stage_frozen: int
    split: float
    rank: str
    how: str


def rank_share(shape: ModelShape, degrees: Parallelism, traits: MemoryTraits) -> Share:
    """The elements of each state the largest rank holds under ``degrees``."""
    pp, tp = int(degrees.pp), int(degrees.tp)
    group = degrees.group_size("dp_shard_cp")
    stages = pipeline_stages(shape, pp)
    stage = max(stages)
    how: list[str] = []
    rank = "every rank"
    if pp > 1:
        rank = "pipeline stage 0 (the largest)" if stages[0] == stage else \
            f"pipeline stage {stages.index(stage)} (the largest)"
        how.append(f"pp={pp}: the largest stage holds {stage:,} of "
                   f"{shape.parameters:,} trainable elements"
                   + ("" if len(shape.layers) >= pp else " (equal stages assumed: the "
                      "shape lists no layers)"))
    fraction = stage / shape.parameters
    frozen = math.ceil(shape.frozen_parameters / pp)
    tensors = math.ceil(shape.tensor_count / pp)
    whole = stage
    if tp > 1 and shape.tensor_parallel:
        split = math.ceil(shape.tensor_parallel * fraction)
        stage = stage - split + math.ceil(split / tp)
        how.append(f"tp={tp}: {split:,} elements of tensor-parallel weights split {tp} "
                   "ways")
    elif tp > 1:
        how.append(f"tp={tp}: nothing split (the shape names no tensor_parallel weights)")
    exact = pp == 1 and tp == 1 and bool(shape.tensor_rows)

    def local(count: int, state: str) -> int:
        if group <= 1 or state not in traits.sharded:
            return count
        if traits.split == "rows" and exact and count == shape.parameters:
            return sum(math.ceil(rows / group) * (size // rows)
                       for rows, size in shape.tensor_rows)
        return math.ceil(count / group)

    if group > 1 and traits.sharded:
        split_how = ("each tensor by rows, padded" if traits.split == "rows" and exact
                     else "in equal parts")
        how.append(f"{', '.join(s for s in STATES if s in traits.sharded)} sharded over "
                   f"{SHARDING_GROUP} = {group} ranks, {split_how}")
    return Share(parameters=local(stage, "parameters"),
                 frozen=local(frozen, "parameters") if frozen else 0,
                 gradients=local(stage, "gradients"), optimizer=local(stage, "optimizer"),
                 tensors=tensors, stage=stage, stage_frozen=frozen,
                 split=stage / whole if whole else 1.0, rank=rank,
                 how="; ".join(how) or "every state whole on every rank")


def strategy_buffers(shape: ModelShape, share: Share, sizes: Dtypes, traits: MemoryTraits,
                     data_parallel: int) -> tuple[int, str]:
    """What the strategy allocates itself, and the rule's words (which begin with
    `NOT_ESTIMATED` when a fact it needs is missing)."""
    if traits.buffers == "gradient_buckets":
        total = share.gradients * sizes.parameter
        return total, "DDP's gradient buckets: the gradients' size again"
    if traits.buffers == "gathered_units" and (data_parallel > 1 or traits.gathers_alone):
        if shape.largest_unit is None:
            return 0, (f"{NOT_ESTIMATED} the shape gives no "
                       "largest_unit (the whole model when only the root is sharded, "
                       "FSDPStrategy's default; the largest layer when each is wrapped)")
        model = share.stage + share.stage_frozen
        # a unit's tensor-parallel weights are split as the stage's are
        unit = min(math.ceil(shape.largest_unit * share.split), model)
        gathered = unit * sizes.compute_gather * (2 if unit < model else 1)
        reduced = unit * (sizes.compute_gather + sizes.reduce)
        words = ("the largest unit gathered and the next prefetched" if unit < model
                 else "the whole model gathered at once (one unit: wrap layers as units "
                 "to gather less)")
        return gathered + reduced, (f"{words}, {unit:,} elements, and its unsharded "
                                    "gradients with their reduce-scatter copy")
    if traits.buffers == "zero_buckets":
        bucket = min(traits.bucket_elements or shape.parameters, shape.parameters)
        return bucket * (sizes.parameter * 2), (f"ZeRO's reduce and all-gather buckets, "
                                                f"{bucket:,} elements each")
    return 0, "none"


def activations(shape: ModelShape, degrees: Parallelism,
                micro_batch_size: int | None) -> tuple[int | None, str]:
    """Activations kept for the backward pass (with the gradients in flight at its start
    where the shape says its largest tensor), and the rule's words."""
    per_sample = shape.activation_bytes_per_sample
    if per_sample is None or micro_batch_size is None:
        missing = [n for n, v in (("the shape's activation_bytes_per_sample", per_sample),
                                  ("micro_batch_size", micro_batch_size)) if v is None]
        return None, f"not estimated: {' and '.join(missing)} not given"
    split = int(degrees.tp) * int(degrees.cp)
    largest = shape.largest_activation_bytes_per_sample or 0
    total = math.ceil((per_sample + 2 * largest) * micro_batch_size / split)
    words = f"{per_sample:,} bytes per sample"
    if largest:
        words += (f" and twice the largest, {largest:,} (the gradients in flight when the "
                  "backward pass starts)")
    words += f" x micro-batch {micro_batch_size}"
    if split > 1:
        words += f", split over tp x cp = {split}"
    if int(degrees.pp) > 1:
        words += (" (a pipeline stage keeps 1/pp of the layers' activations for up to pp "
                  "micro-batches in flight: the same total)")
    return total, words


__all__ = [
    "BUFFER_KINDS",
    "REPLICATED",
    "STATES",
    "GiB",
    "MemoryEstimate",
    "MemoryTraits",
    "format_bytes",
    "parse_bytes",
]
