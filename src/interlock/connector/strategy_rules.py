"""Stages 5-7: the strategy and its launcher, the precision, the plugins.

Which accelerators a strategy runs on and which precisions it takes are read through
the registry snapshot (``ctx.parts``): a spec's own declaration, plus the registered
accelerator and precision rows that name the strategy.
"""

from __future__ import annotations

from collections.abc import Callable

from interlock.connector.rules import (
    Action,
    Context,
    Decision,
    Rule,
    Stage,
    always,
    devices_as_placed,
    refuse,
)
from interlock.connector.specs import StrategySpec
from interlock.connector.tables import INSTALL_HINTS, LauncherRow

# --------------------------------------------------------------------------- choose


def _explicit(ctx: Context) -> str:
    ctx.spec = ctx.explicit_spec
    return f"strategy={ctx.strategy_flag!r} was asked for"


STRATEGY_CHOICE = Decision(
    id="strategy/choose",
    doc="Use the explicit strategy, or choose one for 'auto'.",
    rules=(
        Rule(
            id="strategy/explicit",
            doc="An explicit strategy name.",
            when=lambda c: c.explicit_spec is not None,
            then=_explicit,
        ),
        Rule(
            id="strategy/auto-xla",
            doc="strategy='auto' chooses 'xla' on xla with several devices or nodes.",
            when=lambda c: c.accelerator == "xla" and c.world_size > 1,
            then=lambda c: _choose(c, "xla", "xla with several devices or nodes"),
        ),
        Rule(
            id="strategy/auto-single-xla",
            doc="strategy='auto' chooses 'single_xla' on xla with one device.",
            when=lambda c: c.accelerator == "xla",
            then=lambda c: _choose(c, "single_xla", "xla with one device"),
        ),
        Rule(
            id="strategy/auto-multi-node",
            doc="strategy='auto' chooses 'ddp' when num_nodes > 1.",
            when=lambda c: c.num_nodes > 1,
            then=lambda c: _choose(c, "ddp", f"num_nodes={c.num_nodes}"),
        ),
        Rule(
            id="strategy/auto-single-device",
            doc="strategy='auto' chooses 'single_device' for one device.",
            when=lambda c: c.devices_per_node == 1,
            then=lambda c: _choose(c, "single_device", "one device"),
        ),
        Rule(
            id="strategy/auto-notebook",
            doc="strategy='auto' chooses 'ddp_notebook' for several devices in an "
            "interactive session (its fork launcher works there).",
            when=lambda c: c.machine.interactive,
            then=lambda c: _choose(
                c, "ddp_notebook", f"{c.devices_per_node} devices in an interactive session"
            ),
        ),
        Rule(
            id="strategy/auto-ddp",
            doc="strategy='auto' chooses 'ddp' for several devices.",
            when=always,
            then=lambda c: _choose(c, "ddp", f"{c.devices_per_node} devices"),
        ),
    ),
)


def _choose(ctx: Context, name: str, why: str) -> str:
    ctx.spec = ctx.specs[name]
    return f"strategy='auto' chose {name!r}: {why}"


# --------------------------------------------------------------------------- check


def _strategy_names(ctx: Context) -> tuple[str, ...]:
    return tuple(
        sorted(
            n for n, s in ctx.specs.items()
            if ctx.accelerator in ctx.parts.strategy_accelerators(s) and s.variant_of is None
        )
    )


def _chosen_how(ctx: Context) -> str:
    if ctx.explicit_spec is None:
        return f" (strategy='auto' chose {ctx.chosen_spec.name!r})"
    return ""


def _refuse_accelerator(ctx: Context) -> str:
    spec = ctx.chosen_spec
    substitute = spec.substitutes.get(ctx.accelerator)
    choices = (substitute,) if substitute else _strategy_names(ctx)
    refuse(
        "unsupported-accelerator",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"{spec.name!r}{_chosen_how(ctx)} runs on "
        f"{', '.join(sorted(ctx.parts.strategy_accelerators(spec)))} only, and the accelerator is "
        f"{ctx.accelerator!r} ({ctx.accelerator_reason}).",
        choices=choices,
    )


def _missing(spec: StrategySpec, ctx: Context) -> tuple[str, ...]:
    return tuple(p for p in spec.requires if p not in ctx.machine.packages)


def _refuse_missing(ctx: Context) -> str:
    spec = ctx.chosen_spec
    missing = _missing(spec, ctx)
    refuse(
        "missing-package",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"{spec.name!r} needs {', '.join(missing)}, which is not installed "
        f"(install: {'; '.join(INSTALL_HINTS[p] for p in missing)}).",
        choices=tuple(n for n in _strategy_names(ctx) if not _missing(ctx.specs[n], ctx)),
    )


def _too_many_devices(ctx: Context) -> bool:
    limit = ctx.chosen_spec.max_devices
    return limit is not None and ctx.devices_per_node > limit


def _refuse_devices(ctx: Context) -> str:
    spec = ctx.chosen_spec
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"{spec.name!r} runs on at most {spec.max_devices} device per node, and "
        f"devices={ctx.devices_flag!r} places {ctx.devices_per_node}; use a multi-device "
        "strategy such as 'ddp' for more.",
        choices=tuple(str(i) for i in range(1, min(spec.max_devices or 1, 16) + 1)),
    )


def _auto_devices_over_limit(ctx: Context) -> bool:
    """devices='auto' placed more devices than the chosen row allows, and interlock
    (not a cluster's launcher) decides how many processes there are."""
    return (ctx.devices.kind == "auto" and _too_many_devices(ctx)
            and not ctx.cluster_external)


def _fit_auto_devices(ctx: Context) -> str:
    spec = ctx.chosen_spec
    limit = spec.max_devices or 1
    placed = len(ctx.parallel_devices)
    ctx.parallel_devices = ctx.parallel_devices[:limit]
    used = ", ".join(ctx.parallel_devices)
    ctx.note(
        f"devices='auto' uses {used} of the {placed} {ctx.accelerator} devices: "
        f"{spec.name!r} runs on at most {limit} device{'s' if limit != 1 else ''} per "
        "node; pass devices=-1 with a multi-device strategy such as 'ddp' to use them all"
    )
    return f"devices='auto' placed {placed}; {spec.name!r} takes at most {limit}: {used}"


STRATEGY_DEVICES = Decision(
    id="strategy/auto-devices",
    doc="devices='auto' adapts to a strategy that runs on fewer devices than the machine "
    "has; a devices value the user wrote is never changed.",
    rules=(
        Rule(
            id="strategy/auto-devices-capped",
            doc="devices='auto' placed more devices than the row's max_devices "
            "(single_device on a multi-GPU host, single_xla on a TPU host): the first "
            "max_devices of them are used, and the notes say so. Not under a cluster "
            "that created the processes itself: those processes exist already.",
            when=_auto_devices_over_limit,
            then=_fit_auto_devices,
        ),
        Rule(
            id="strategy/devices-as-placed",
            doc="Otherwise the devices stay as the devices stage placed them.",
            when=always,
            then=devices_as_placed,
        ),
    ),
)


def _refuse_multi_node(ctx: Context) -> str:
    spec = ctx.chosen_spec
    refuse(
        "unsupported-multi-node",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{spec.name!r}{_chosen_how(ctx)} runs on one node only.",
        choices=("1",),
    )


def _supported(ctx: Context) -> str:
    return f"{ctx.chosen_spec.name!r} supports {ctx.accelerator} with this geometry"


STRATEGY_CHECK = Decision(
    id="strategy/check",
    doc="The strategy's row must support the accelerator, packages, device count and nodes.",
    rules=(
        Rule(
            id="strategy/unsupported-accelerator",
            doc="The accelerator is not in the row's accelerators; the row's substitute for "
            "it (fsdp on xla: xla_fsdp) is the choice, else every strategy that runs there.",
            when=lambda c: c.accelerator not in c.parts.strategy_accelerators(c.chosen_spec),
            then=_refuse_accelerator,
            refuses="unsupported-accelerator",
        ),
        Rule(
            id="strategy/missing-package",
            doc="A package the row requires is not installed.",
            when=lambda c: bool(_missing(c.chosen_spec, c)),
            then=_refuse_missing,
            refuses="missing-package",
        ),
        Rule(
            id="strategy/too-many-devices",
            doc="More devices per node than the row allows (single_device, single_xla).",
            when=_too_many_devices,
            then=_refuse_devices,
            refuses="invalid-devices",
        ),
        Rule(
            id="strategy/unsupported-multi-node",
            doc="num_nodes > 1 for a single-node row.",
            when=lambda c: c.num_nodes > 1 and not c.chosen_spec.multi_node,
            then=_refuse_multi_node,
            refuses="unsupported-multi-node",
        ),
        Rule(id="strategy/supported", doc="Otherwise.", when=always, then=_supported),
    ),
)

# --------------------------------------------------------------------------- launcher


def _launcher_row(ctx: Context) -> LauncherRow | None:
    name = ctx.chosen_spec.launcher
    return ctx.parts.launchers.get(name) if name is not None else None


def _creates_processes(ctx: Context) -> bool:
    row = _launcher_row(ctx)
    return row is not None and (row.launches_single or ctx.devices_per_node > 1)


def _no_launcher(ctx: Context) -> str:
    ctx.launcher = None
    return f"{ctx.chosen_spec.name!r} runs in the calling process"


def _external(ctx: Context) -> str:
    own = ctx.chosen_spec.launcher
    ctx.launcher = "external"
    if own not in (None, "subprocess"):
        ctx.note(
            f"{ctx.chosen_spec.name!r} normally starts its processes with the {own} launcher; "
            f"here {ctx.cluster} created them, so that launcher is not used"
        )
    return f"{ctx.cluster} created the processes"


def _alternatives(
    ctx: Context, ok: Callable[[LauncherRow, Context], bool]
) -> tuple[str, ...]:
    names: list[str] = []
    for name, spec in sorted(ctx.specs.items()):
        if spec.variant_of is not None:
            continue
        if ctx.accelerator not in ctx.parts.strategy_accelerators(spec) or _missing(spec, ctx):
            continue
        if spec.max_devices is not None and ctx.devices_per_node > spec.max_devices:
            continue
        row = ctx.parts.launchers.get(spec.launcher) if spec.launcher else None
        if row is None or ok(row, ctx):
            names.append(name)
    return tuple(names)


def _interactive_ok(row: LauncherRow, ctx: Context) -> bool:
    return row.interactive


def _start_method_ok(row: LauncherRow, ctx: Context) -> bool:
    return row.start_method is None or row.start_method in ctx.machine.start_methods


def _refuse_interactive(ctx: Context) -> str:
    row = _launcher_row(ctx)
    name = row.name if row else "?"
    refuse(
        "interactive-incompatible",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"{ctx.chosen_spec.name!r}{_chosen_how(ctx)} starts processes with the "
        f"{name} launcher, which cannot work from an interactive session (a notebook or "
        "REPL has no script to re-run and its functions cannot be pickled).",
        choices=_alternatives(ctx, _interactive_ok),
    )


def _refuse_start_method(ctx: Context) -> str:
    row = _launcher_row(ctx)
    method = row.start_method if row else "?"
    refuse(
        "start-method-unavailable",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"{ctx.chosen_spec.name!r}{_chosen_how(ctx)} needs the {method!r} start "
        f"method, and this platform offers {', '.join(ctx.machine.start_methods) or 'none'}.",
        choices=_alternatives(
            ctx, lambda r, c: _start_method_ok(r, c) and (_interactive_ok(r, c)
                                                         or not c.machine.interactive)
        ),
    )


def _own_launcher(ctx: Context) -> str:
    ctx.launcher = ctx.chosen_spec.launcher
    return f"{ctx.chosen_spec.name!r} uses the {ctx.launcher} launcher"


LAUNCHER_CHOICE = Decision(
    id="strategy/launcher",
    doc="Choose how processes come into being, and check the launcher can work here.",
    rules=(
        Rule(
            id="launcher/none",
            doc="A strategy without a launcher runs in the calling process.",
            when=lambda c: c.chosen_spec.launcher is None,
            then=_no_launcher,
        ),
        Rule(
            id="launcher/external",
            doc="The cluster environment created the processes (torchrun, srun, mpirun, "
            "jsrun, Kubeflow); a spawn/fork launcher the strategy would use is noted as "
            "not used.",
            when=lambda c: c.cluster_external,
            then=_external,
        ),
        Rule(
            id="launcher/interactive-incompatible",
            doc="The launcher would start processes from an interactive session and cannot "
            "(subprocess, spawn, forkserver).",
            when=lambda c: c.machine.interactive and _creates_processes(c)
            and not _interactive_ok(_launcher_row(c), c),  # type: ignore[arg-type]
            then=_refuse_interactive,
            refuses="interactive-incompatible",
        ),
        Rule(
            id="launcher/start-method-unavailable",
            doc="The launcher needs a start method the platform lacks (fork on Windows).",
            when=lambda c: _creates_processes(c)
            and not _start_method_ok(_launcher_row(c), c),  # type: ignore[arg-type]
            then=_refuse_start_method,
            refuses="start-method-unavailable",
        ),
        Rule(
            id="launcher/own",
            doc="Otherwise the strategy's own launcher.",
            when=always,
            then=_own_launcher,
        ),
    ),
)

STRATEGY_STAGE = Stage(
    name="strategy",
    doc="Choose the strategy, check its row against the machine, choose the launcher.",
    decisions=(STRATEGY_CHOICE, STRATEGY_DEVICES, STRATEGY_CHECK, LAUNCHER_CHOICE),
)

# --------------------------------------------------------------------------- precision


def _from_plugin(ctx: Context) -> str:
    plugin = ctx.plugins.precision
    ctx.precision = str(getattr(plugin, "precision", ""))
    return f"the precision plugin {type(plugin).__name__} sets {ctx.precision!r}"


def _from_flag(ctx: Context) -> str:
    ctx.precision = ctx.precision_input
    return f"precision {ctx.precision!r} from the flag"


PRECISION_SOURCE = Decision(
    id="precision/source",
    doc="The precision comes from the precision plugin if one is given, else the flag.",
    rules=(
        Rule(
            id="precision/plugin",
            doc="A precision plugin sets the precision.",
            when=lambda c: c.plugins.precision is not None,
            then=_from_plugin,
        ),
        Rule(id="precision/flag", doc="Otherwise the flag.", when=always, then=_from_flag),
    ),
)


def _supported_precisions(ctx: Context) -> tuple[str, ...]:
    spec = ctx.chosen_spec
    parts = ctx.parts
    taken = parts.strategy_precisions(spec) - set(spec.precision_refusals.get(ctx.accelerator, {}))
    on_accelerator = parts.accelerator_precisions[ctx.accelerator]
    return tuple(
        p for p in parts.precision_names
        if p in taken and p in on_accelerator
        and all(r in ctx.machine.packages for r in parts.precisions[p].requires)
    )


def _precision_flag(ctx: Context) -> tuple[str, object]:
    if ctx.plugins.precision is not None:
        return "plugins", ctx.plugins_flag
    return "precision", ctx.precision_flag


def _refuse_by(holder: str) -> Action:
    def then(ctx: Context) -> str:
        flag, value = _precision_flag(ctx)
        if holder == "strategy":
            spec = ctx.chosen_spec
            taken = ctx.parts.strategy_precisions(spec)
            why = f"strategy {spec.name!r}{_chosen_how(ctx)} supports " + ", ".join(
                p for p in ctx.parts.precision_names if p in taken
            )
        else:
            runs = ctx.parts.accelerator_precisions[ctx.accelerator]
            why = f"the {ctx.accelerator} accelerator supports " + ", ".join(
                p for p in ctx.parts.precision_names if p in runs
            )
        refuse(
            "unsupported-precision",
            flag=flag,
            value=value,
            reason=f"{ctx.precision!r} is not supported: {why}.",
            choices=_supported_precisions(ctx),
        )

    return then


def _refused_on_accelerator(ctx: Context) -> str | None:
    return ctx.chosen_spec.precision_refusals.get(ctx.accelerator, {}).get(ctx.precision)


def _refuse_on_accelerator(ctx: Context) -> str:
    flag, value = _precision_flag(ctx)
    refuse(
        "unsupported-precision",
        flag=flag,
        value=value,
        reason=f"{ctx.precision!r} is not supported by strategy {ctx.chosen_spec.name!r} "
        f"on {ctx.accelerator}: {_refused_on_accelerator(ctx)}",
        choices=_supported_precisions(ctx),
    )


def _precision_missing(ctx: Context) -> tuple[str, ...]:
    return tuple(p for p in ctx.parts.precisions[ctx.precision].requires
                 if p not in ctx.machine.packages)


def _refuse_precision_missing(ctx: Context) -> str:
    flag, value = _precision_flag(ctx)
    missing = _precision_missing(ctx)
    refuse(
        "missing-package",
        flag=flag,
        value=value,
        reason=f"{ctx.precision!r} needs {', '.join(missing)}, which is not installed "
        f"(install: {'; '.join(INSTALL_HINTS[p] for p in missing)}).",
        choices=_supported_precisions(ctx),
    )


PRECISION_CHECK = Decision(
    id="precision/check",
    doc="The precision must be supported by the strategy's row and by the accelerator, and "
    "its packages must be installed.",
    rules=(
        Rule(
            id="precision/unsupported-by-strategy",
            doc="Not among the strategy row's precisions.",
            when=lambda c: c.precision not in c.parts.strategy_precisions(c.chosen_spec),
            then=_refuse_by("strategy"),
            refuses="unsupported-precision",
        ),
        Rule(
            id="precision/refused-by-strategy-on-accelerator",
            doc="The strategy's row refuses it on this accelerator, with the reason "
            "(DeepSpeed's CPU accelerator has no float16).",
            when=lambda c: _refused_on_accelerator(c) is not None,
            then=_refuse_on_accelerator,
            refuses="unsupported-precision",
        ),
        Rule(
            id="precision/unsupported-by-accelerator",
            doc="Not among the accelerator's precisions (mps: no 64-true; "
            "transformer-engine: cuda only).",
            when=lambda c: c.precision not in c.parts.accelerator_precisions[c.accelerator],
            then=_refuse_by("accelerator"),
            refuses="unsupported-precision",
        ),
        Rule(
            id="precision/missing-package",
            doc="A package the precision needs is not installed (transformer_engine).",
            when=lambda c: bool(_precision_missing(c)),
            then=_refuse_precision_missing,
            refuses="missing-package",
        ),
        Rule(
            id="precision/supported",
            doc="Otherwise.",
            when=always,
            then=lambda c: f"{c.precision!r} is supported by {c.chosen_spec.name!r} on "
            f"{c.accelerator}",
        ),
    ),
)

PRECISION_STAGE = Stage(
    name="precision",
    doc="Choose the precision and check it against the strategy and accelerator.",
    decisions=(PRECISION_SOURCE, PRECISION_CHECK),
)

# --------------------------------------------------------------------------- plugins


def _custom_io(ctx: Context) -> str:
    ctx.checkpoint_io = type(ctx.plugins.checkpoint_io).__name__
    return f"checkpoint IO from the plugin {ctx.checkpoint_io}"


def _default_io(name: str) -> Action:
    def then(ctx: Context) -> str:
        ctx.checkpoint_io = name
        return f"the default {name} checkpoint IO"

    return then


PLUGINS_CHOICE = Decision(
    id="plugins/checkpoint-io",
    doc="Choose the checkpoint IO.",
    rules=(
        Rule(
            id="plugins/checkpoint-io-plugin",
            doc="A checkpoint IO plugin is used as given.",
            when=lambda c: c.plugins.checkpoint_io is not None,
            then=_custom_io,
        ),
        Rule(
            id="plugins/checkpoint-io-xla",
            doc="xla saves through torch_xla.",
            when=lambda c: c.accelerator == "xla",
            then=_default_io("xla"),
        ),
        Rule(
            id="plugins/checkpoint-io-torch",
            doc="Otherwise torch.save with atomic writes.",
            when=always,
            then=_default_io("torch"),
        ),
    ),
)

PLUGINS_STAGE = Stage(
    name="plugins",
    doc="Wire the remaining plugins.",
    decisions=(PLUGINS_CHOICE,),
)
