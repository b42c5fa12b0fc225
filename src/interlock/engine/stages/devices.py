"""Stage 3, devices: place the processes of one node on devices, within the bounds on
the geometry.

A registered accelerator's devices are indexed like CUDA's: its ``devices/<name>-*``
rules come from the registry at call time (``parts``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_NUM_NODES,
    MAX_WORLD_SIZE,
    short_repr,
)
from interlock.engine.machine import Machine
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import (
    Decision,
    DevicesRequest,
    PlacedDraft,
    Rule,
    Stage,
    always,
    refuse,
    run_stage,
)
from interlock.engine.runner import Step
from interlock.engine.stages.accelerator import devices_on, machine_fact
from interlock.engine.trace import TraceStep
from interlock.engine.written import NOT_WRITTEN, Written


class DevicesInput(NamedTuple):
    """What the devices stage decides from.

    Attributes:
        machine: the machine planned for.
        parts: the registry's snapshot.
        accelerator: the chosen accelerator.
        devices: the devices request.
        num_nodes: the node count.
    """

    machine: Machine
    parts: PartTables
    accelerator: str
    devices: DevicesRequest
    num_nodes: int


class Placement(NamedTuple):
    """The devices stage's result: the torch device strings of one node."""

    parallel_devices: tuple[str, ...]
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class DevicesDraft(PlacedDraft):
    """The devices stage's draft; ``num_nodes`` is read, ``parallel_devices`` decided."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"parallel_devices"})

    machine: Machine
    parts: PartTables
    accelerator: str
    devices: DevicesRequest
    devices_flag: object = None
    num_nodes_flag: object = None


def indexed(name: str, ids: tuple[int, ...] | range) -> tuple[str, ...]:
    return tuple(f"{name}:{i}" for i in ids)


def _count(ctx: DevicesDraft) -> int:
    return devices_on(ctx.accelerator, ctx.parts, ctx.machine)


def _on(name: str, *kinds: str) -> Callable[[DevicesDraft], bool]:
    return lambda c: c.accelerator == name and c.devices.kind in kinds


def _cpu_processes(ctx: DevicesDraft) -> str:
    n = 1 if ctx.devices.kind == "auto" else ctx.devices.count
    ctx.parallel_devices = ("cpu",) * n
    return f"{n} CPU process{'es' if n != 1 else ''}"


def _refuse_cpu_devices(ctx: DevicesDraft) -> str:
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason="on cpu, devices is the number of processes: an int > 0 or a digit string; "
        "-1 and device ids mean nothing there.",
        choices=("auto", "1", "2"),
    )


def _cuda_auto_interactive(ctx: DevicesDraft) -> str:
    ctx.parallel_devices = ("cuda:0",)
    ctx.note(
        f"devices='auto' in an interactive session uses 1 of {_count(ctx)} CUDA devices; "
        "pass devices=-1 (with strategy='ddp_notebook') to use them all"
    )
    return f"interactive session: 1 of {_count(ctx)} CUDA devices"


def _all_indexed(ctx: DevicesDraft) -> str:
    n = _count(ctx)
    ctx.parallel_devices = indexed(ctx.accelerator, range(n))
    return f"all {n} {ctx.accelerator} devices"


def _count_indexed(ctx: DevicesDraft) -> str:
    ctx.parallel_devices = indexed(ctx.accelerator, range(ctx.devices.count))
    return f"the first {ctx.devices.count} of {_count(ctx)} {ctx.accelerator} devices"


def _ids_indexed(ctx: DevicesDraft) -> str:
    ctx.parallel_devices = indexed(ctx.accelerator, ctx.devices.ids)
    return f"{ctx.accelerator} devices {', '.join(map(str, ctx.devices.ids))}"


def _device_choices(ctx: DevicesDraft) -> tuple[str, ...]:
    n = _count(ctx)
    # every count up to 16, then the full one: a simulated host may have thousands
    counts = [*range(1, min(n, 16) + 1), *([n] if n > 16 else [])]
    return ("auto", "-1", *(str(i) for i in counts))


def _refuse_unavailable_devices(ctx: DevicesDraft) -> str:
    n = _count(ctx)
    row = ctx.parts.accelerators[ctx.accelerator]
    asked = ctx.devices.describe()
    valid_ids = f"ids 0..{n - 1}" if n > 1 else "id 0"
    refuse(
        "devices-unavailable",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"{asked} asked for, but {machine_fact(row, ctx.machine)} ({valid_ids}).",
        choices=_device_choices(ctx),
    )


def _too_many(ctx: DevicesDraft) -> bool:
    n = _count(ctx)
    if ctx.devices.kind == "count":
        return ctx.devices.count > n
    if ctx.devices.kind == "ids":
        return max(ctx.devices.ids) >= n
    return False


def _mps_one(ctx: DevicesDraft) -> str:
    ctx.parallel_devices = ("mps:0",)
    return "the one MPS device"


def _mps_fits(ctx: DevicesDraft) -> bool:
    d = ctx.devices
    return d.kind in ("auto", "all") or (d.kind == "count" and d.count == 1) or d.ids == (0,)


def _xla_fits_one(ctx: DevicesDraft) -> bool:
    return ctx.devices.kind == "count" and ctx.devices.count == 1


def _xla_all(ctx: DevicesDraft) -> bool:
    d = ctx.devices
    return d.kind in ("auto", "all") or (d.kind == "count" and d.count == _count(ctx))


def _xla_index(ctx: DevicesDraft) -> bool:
    return ctx.devices.kind == "ids" and len(ctx.devices.ids) == 1 and not _too_many(ctx)


def _refuse_xla_devices(ctx: DevicesDraft) -> str:
    n = _count(ctx)
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"xla runs on 1 device, on all {n}, or on one index [i]; "
        f"{ctx.devices.describe()} is none of these.",
        choices=("1", str(n), "-1", "[0]"),
    )


def _beyond_on(name: str) -> Callable[[DevicesDraft], bool]:
    return lambda c: c.accelerator == name and _too_many(c)


def _indexed_rules(name: str, beyond: str, every: str) -> tuple[Rule[DevicesDraft], ...]:
    """The rules of an accelerator whose devices are indexed like CUDA's."""
    return (
        Rule(id=f"devices/{name}-unavailable", doc=f"{name}: a count or id beyond {beyond}.",
             when=_beyond_on(name), then=_refuse_unavailable_devices,
             refuses="devices-unavailable"),
        Rule(id=f"devices/{name}-all", doc=f"{name}: 'auto' or -1 is every {every}.",
             when=_on(name, "auto", "all"), then=_all_indexed),
        Rule(id=f"devices/{name}-count", doc=f"{name}: N is devices 0..N-1.",
             when=_on(name, "count"), then=_count_indexed),
        Rule(id=f"devices/{name}-ids", doc=f"{name}: explicit ids.",
             when=_on(name, "ids"), then=_ids_indexed),
    )


def _registered_device_rules(parts: PartTables) -> tuple[Rule[DevicesDraft], ...]:
    """A registered accelerator's devices are indexed and placed like CUDA's."""
    return tuple(rule for row in parts.added_accelerators for rule in _indexed_rules(
        row.name, f"the devices in Machine.extra_devices[{row.name!r}]", "device"))


DEVICES_CHOICE = Decision(
    id="devices/place",
    doc="Turn the devices flag into the devices of one node for the chosen accelerator.",
    rules=(
        Rule(
            id="devices/cpu-processes",
            doc="cpu: 'auto' is 1 process; a count N is N processes.",
            when=_on("cpu", "auto", "count"),
            then=_cpu_processes,
        ),
        Rule(
            id="devices/cpu-refused",
            doc="cpu: -1 and id lists are refused (a CPU has no device ids).",
            when=lambda c: c.accelerator == "cpu",
            then=_refuse_cpu_devices,
            refuses="invalid-devices",
        ),
        Rule(
            id="devices/cuda-auto-interactive",
            doc="cuda, 'auto', interactive session, several GPUs: 1 device (noted).",
            when=lambda c: c.accelerator == "cuda" and c.devices.kind == "auto"
            and c.machine.interactive and c.machine.cuda_devices > 1,
            then=_cuda_auto_interactive,
        ),
        *_indexed_rules("cuda", "the visible devices", "visible device"),
        Rule(
            id="devices/mps-one",
            doc="mps: 'auto', -1, 1 or [0] is the one device.",
            when=lambda c: c.accelerator == "mps" and _mps_fits(c),
            then=_mps_one,
        ),
        Rule(
            id="devices/mps-unavailable",
            doc="mps: anything more than its one device.",
            when=lambda c: c.accelerator == "mps",
            then=_refuse_unavailable_devices,
            refuses="devices-unavailable",
        ),
        Rule(
            id="devices/xla-one",
            doc="xla: 1 is the first device.",
            when=lambda c: c.accelerator == "xla" and _xla_fits_one(c),
            then=_count_indexed,
        ),
        Rule(
            id="devices/xla-all",
            doc="xla: 'auto', -1 or the full count is every device.",
            when=lambda c: c.accelerator == "xla" and _xla_all(c),
            then=_all_indexed,
        ),
        Rule(
            id="devices/xla-index",
            doc="xla: [i] is the one device i.",
            when=lambda c: c.accelerator == "xla" and _xla_index(c),
            then=_ids_indexed,
        ),
        Rule(
            id="devices/xla-unavailable",
            doc="xla: a count or index beyond the devices.",
            when=lambda c: c.accelerator == "xla" and _too_many(c),
            then=_refuse_unavailable_devices,
            refuses="devices-unavailable",
        ),
        Rule(
            id="devices/xla-refused",
            doc="xla: other counts and several ids.",
            when=always,
            then=_refuse_xla_devices,
            refuses="invalid-devices",
        ),
    ),
    registered=_registered_device_rules,
    registered_before="devices/mps-one",
)


def _refuse_per_node_limit(ctx: DevicesDraft) -> str:
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"the strategy instance was given {ctx.devices_per_node} devices per node, "
        f"beyond the bound of {MAX_DEVICES_PER_NODE} "
        "(interlock.engine.limits.MAX_DEVICES_PER_NODE).",
        choices=("auto", "1"),
    )


def _world_beyond_limit(ctx: DevicesDraft) -> bool:
    return ctx.num_nodes > MAX_NUM_NODES or ctx.world_size > MAX_WORLD_SIZE


def _refuse_world_limit(ctx: DevicesDraft) -> str:
    per_node = ctx.devices_per_node
    if ctx.num_nodes > MAX_NUM_NODES:
        why = (f"{short_repr(ctx.num_nodes)} nodes is beyond the bound of {MAX_NUM_NODES} "
               "(interlock.engine.limits.MAX_NUM_NODES)")
    else:
        why = (f"{per_node} device{'s' if per_node != 1 else ''} per node x "
               f"{ctx.num_nodes} nodes makes a world size of {ctx.world_size}, beyond the "
               f"bound of {MAX_WORLD_SIZE} (interlock.engine.limits.MAX_WORLD_SIZE)")
    refuse(
        "invalid-num-nodes",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{why}; no job has run that many processes.",
        choices=(str(min(MAX_NUM_NODES, MAX_WORLD_SIZE // max(per_node, 1))),),
    )


DEVICES_LIMITS: Decision[DevicesDraft] = Decision(
    id="devices/limits",
    doc="The placed geometry must stay within the bounds of interlock.engine.limits. "
    "The flags are bounded when parsed; this catches the product devices x nodes, and the "
    "parts a strategy instance brought.",
    rules=(
        Rule(
            id="devices/per-node-beyond-limit",
            doc=f"More than {MAX_DEVICES_PER_NODE} devices per node (only a strategy "
            "instance's own devices can place that many).",
            when=lambda c: c.devices_per_node > MAX_DEVICES_PER_NODE,
            then=_refuse_per_node_limit,
            refuses="invalid-devices",
        ),
        Rule(
            id="devices/world-size-beyond-limit",
            doc=f"devices x num_nodes above {MAX_WORLD_SIZE}, or more than {MAX_NUM_NODES} "
            "nodes from a strategy instance.",
            when=_world_beyond_limit,
            then=_refuse_world_limit,
            refuses="invalid-num-nodes",
        ),
        Rule(
            id="devices/within-limits",
            doc="Otherwise.",
            when=always,
            then=lambda c: f"world size {c.world_size} is within the bound of "
            f"{MAX_WORLD_SIZE}",
        ),
    ),
)

DEVICES_STAGE = Stage(
    name="devices",
    doc="Place the processes of one node on devices, within the bounds on the geometry.",
    decisions=(DEVICES_CHOICE, DEVICES_LIMITS),
)


def place_devices(inputs: DevicesInput, written: Written = NOT_WRITTEN) -> Placement:
    """The devices stage; ``written`` holds the flags as written, to quote.

    Raises:
        ResolutionError: the request does not fit the accelerator or the machine, or the
            geometry is beyond the bounds.
    """
    draft = DevicesDraft(machine=inputs.machine, parts=inputs.parts,
                         accelerator=inputs.accelerator, devices=inputs.devices,
                         num_nodes=inputs.num_nodes, devices_flag=written.devices,
                         num_nodes_flag=written.num_nodes)
    trace = run_stage(DEVICES_STAGE, draft, inputs.parts)
    return Placement(parallel_devices=draft.parallel_devices, notes=tuple(draft.notes),
                     trace=trace)


STEP = Step("devices", place_devices, DevicesInput,
            writes={"parallel_devices": "parallel_devices"})
