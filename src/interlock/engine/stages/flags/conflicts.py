"""Flags that set the same thing twice (a precision flag and a precision plugin, an
accelerator and a strategy instance's own), refused; a strategy instance's own parts
taken in place of the flags they replace."""

from collections.abc import Callable
from dataclasses import replace

from interlock.engine.rules import Decision, DevicesRequest, Rule, always, refuse
from interlock.engine.stages.flags.devices import number
from interlock.engine.stages.flags.draft import PLUGIN_KINDS, FlagsDraft, instance_name, norm
from interlock.engine.tables import DEFAULT_PRECISION


def given_parts(ctx: FlagsDraft) -> dict[str, object]:
    """The parts the user set on a strategy instance (accelerator, precision,
    checkpoint_io, cluster_environment, devices)."""
    getter = getattr(ctx.strategy_instance, "given_parts", None)
    parts = getter() if callable(getter) else {}
    return dict(parts) if isinstance(parts, dict) else {}


def _refuse_precision_conflict(ctx: FlagsDraft) -> str:
    plugin_precision = getattr(ctx.plugins.precision, "precision", None)
    refuse(
        "conflicting-flags",
        flag="precision",
        value=ctx.precision_flag,
        reason=f"a precision plugin ({type(ctx.plugins.precision).__name__}, precision "
        f"{plugin_precision!r}) was also given; one of them would be ignored.",
        choices=(f"precision={DEFAULT_PRECISION!r} with the plugin", "no precision plugin"),
    )


#: part on a strategy instance -> (the flag that sets it too, whether that flag is set)
_INSTANCE_CONFLICTS: dict[str, tuple[str, Callable[[FlagsDraft], bool]]] = {
    "accelerator": ("accelerator", lambda c: norm(c.accelerator_flag) != "auto"),
    "devices": ("devices", lambda c: norm(c.devices_flag) != "auto"),
    "precision": ("precision", lambda c: c.precision_input != DEFAULT_PRECISION
                  or c.plugins.precision is not None),
    "checkpoint_io": ("plugins", lambda c: c.plugins.checkpoint_io is not None),
    "cluster_environment": ("plugins", lambda c: c.plugins.cluster_environment is not None),
    "num_nodes": ("num_nodes", lambda c: not (type(c.num_nodes_flag) is int
                                             and c.num_nodes_flag == 1)),
}


def _instance_device_type(ctx: FlagsDraft) -> str | None:
    devices = given_parts(ctx).get("devices")
    if isinstance(devices, tuple) and devices and isinstance(devices[0], str):
        return devices[0].partition(":")[0]
    return None


def _device_type_conflict(ctx: FlagsDraft) -> bool:
    kind = _instance_device_type(ctx)
    return (kind is not None and ctx.accelerator_input in ctx.parts.accelerators
            and kind != ctx.accelerator_input)


def _refuse_device_type(ctx: FlagsDraft) -> str:
    refuse(
        "conflicting-flags",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"the strategy instance ({type(ctx.strategy_instance).__name__}) was given "
        f"{_instance_device_type(ctx)} devices, and the accelerator is "
        f"{ctx.accelerator_input!r}.",
        choices=(f"accelerator={_instance_device_type(ctx)!r}", "no devices on the strategy"),
    )


def _instance_conflict(ctx: FlagsDraft) -> str | None:
    for part in given_parts(ctx):
        if part in _INSTANCE_CONFLICTS and _INSTANCE_CONFLICTS[part][1](ctx):
            return part
    return None


def _refuse_instance_conflict(ctx: FlagsDraft) -> str:
    part = _instance_conflict(ctx) or ""
    flag = _INSTANCE_CONFLICTS[part][0]
    value = {"accelerator": ctx.accelerator_flag, "devices": ctx.devices_flag,
             "precision": ctx.precision_flag, "num_nodes": ctx.num_nodes_flag}.get(
        flag, ctx.plugins_flag)
    refuse(
        "conflicting-flags",
        flag=flag,
        value=value,
        reason=f"the strategy instance ({type(ctx.strategy_instance).__name__}) was given its "
        f"own {part.replace('_', ' ')}, and {flag}= sets it as well; one of them would be "
        "ignored.",
        choices=(f"set the {part.replace('_', ' ')} on the strategy only",
                 f"set it through {flag}= only"),
    )


def _no_conflict(ctx: FlagsDraft) -> str:
    return "no two flags set the same thing"


CONFLICTS = Decision(
    id="flags/conflicts",
    doc="Two flags, or a flag and a strategy instance's own part, must not set the same "
    "thing: the engine refuses rather than let one silently win.",
    rules=(
        Rule(
            id="flags/strategy-instance-conflict",
            doc="A part given to the strategy instance (accelerator, devices, num_nodes, "
            "precision, checkpoint IO, cluster environment) is also set by a flag or plugin.",
            when=lambda c: _instance_conflict(c) is not None,
            then=_refuse_instance_conflict,
            refuses="conflicting-flags",
        ),
        Rule(
            id="flags/strategy-instance-device-type",
            doc="The strategy instance's devices are of another kind than the accelerator "
            "asked for.",
            when=_device_type_conflict,
            then=_refuse_device_type,
            refuses="conflicting-flags",
        ),
        Rule(
            id="flags/precision-and-plugin",
            doc="A precision plugin together with a non-default precision= is refused "
            "rather than one silently winning.",
            when=lambda c: c.plugins.precision is not None
            and c.precision_input != DEFAULT_PRECISION,
            then=_refuse_precision_conflict,
            refuses="conflicting-flags",
        ),
        Rule(id="flags/no-conflict", doc="Otherwise.", when=always, then=_no_conflict),
    ),
)


def _adopt_instance_parts(ctx: FlagsDraft) -> str:
    parts = given_parts(ctx)
    taken = []
    accelerator = parts.get("accelerator")
    if accelerator is not None:
        ctx.accelerator_instance = accelerator
        ctx.accelerator_input = instance_name(accelerator) or ""
        taken.append(f"accelerator {ctx.accelerator_input!r}")
    kind = _instance_device_type(ctx)
    if kind is not None and accelerator is None and kind in ctx.parts.accelerators:
        ctx.accelerator_input = kind  # the instance's devices say which accelerator
    nodes = parts.get("num_nodes")
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        ctx.num_nodes = nodes
        taken.append(f"num_nodes {nodes}")
    devices = parts.get("devices")
    if isinstance(devices, tuple) and devices:
        indices = [number(d.partition(":")[2]) if ":" in d else None for d in devices]
        if all(i is not None for i in indices):
            ctx.devices = DevicesRequest(kind="ids", ids=tuple(i or 0 for i in indices))
        else:
            ctx.devices = DevicesRequest(kind="count", count=len(devices))
        taken.append(f"devices {', '.join(devices)}")
    for kind in PLUGIN_KINDS:
        obj = parts.get(kind)
        if obj is not None:
            ctx.plugins = replace(ctx.plugins, **{kind: obj})
            taken.append(f"{kind.replace('_', ' ')} {type(obj).__name__}")
    return "from the strategy instance: " + (", ".join(taken) or "no parts")


INSTANCE_PARTS: Decision[FlagsDraft] = Decision(
    id="flags/strategy-instance-parts",
    doc="The parts a strategy instance was given stand in for the flags they replace, "
    "and are checked by the later stages like flags are.",
    rules=(
        Rule(
            id="flags/adopt-instance-parts",
            doc="Take the instance's accelerator (or its devices' kind), devices, num_nodes, "
            "precision, checkpoint IO and cluster environment.",
            when=lambda c: c.strategy_instance is not None,
            then=_adopt_instance_parts,
        ),
        Rule(id="flags/no-instance", doc="No strategy instance.", when=always,
             then=lambda c: "no strategy instance"),
    ),
)
