"""Stage 5, strategy: choose the strategy, check its row against the machine, and
choose the launcher.

Which accelerators a strategy runs on is read through the registry snapshot
(``parts``): a spec's own declaration, plus the registered accelerator rows that name
the strategy.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.errors import did_you_mean
from interlock.engine.machine import Machine
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import (
    Decision,
    DevicesRequest,
    PlacedDraft,
    Rule,
    Stage,
    always,
    devices_as_placed,
    refuse,
    run_stage,
)
from interlock.engine.runner import Step
from interlock.engine.specs import StrategySpec, with_launcher
from interlock.engine.tables import LauncherRow
from interlock.engine.trace import TraceStep
from interlock.engine.written import NOT_WRITTEN, Written


class StrategyInput(NamedTuple):
    """What the strategy stage decides from.

    Attributes:
        machine: the machine planned for.
        parts: the registry's snapshot.
        specs: the registered strategies (a mapping: this input is not hashable; a memo
            of this stage keys it by the other fields, within one registry version).
        strategy_flag: ``"auto"`` or the registered name asked for.
        accelerator: the chosen accelerator.
        accelerator_reason: why, in words (quoted in refusals).
        devices: the devices request.
        parallel_devices: the devices placed on one node.
        num_nodes: the node count.
        cluster: the cluster environment's name.
        cluster_external: whether the cluster creates the processes.
        cluster_plugin: the cluster environment plugin the caller gave, if any.
        launcher_flag: the launcher flag as given (None or ``"auto"``: the strategy's own);
            read here, where the launcher is decided.
    """

    machine: Machine
    parts: PartTables
    specs: Mapping[str, StrategySpec]
    strategy_flag: str
    accelerator: str
    accelerator_reason: str
    devices: DevicesRequest
    parallel_devices: tuple[str, ...]
    num_nodes: int
    cluster: str
    cluster_external: bool
    cluster_plugin: object = None
    launcher_flag: object = None


class StrategyChoice(NamedTuple):
    """The strategy stage's result.

    Attributes:
        spec: the chosen strategy's row.
        launcher: the launcher's name, ``"external"``, or None (in-process).
        parallel_devices: the devices of one node ('auto' capped to the strategy's
            maximum).
        cluster_environment: the cluster environment the ranks run in: the cluster
            stage's, or the one a launcher that places ranks elsewhere names
            (`LauncherRow.environment`).
    """

    spec: StrategySpec
    launcher: str | None
    parallel_devices: tuple[str, ...]
    cluster_environment: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class StrategyDraft(PlacedDraft):
    """The strategy stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"spec", "launcher", "parallel_devices",
                                                   "cluster_environment"})

    machine: Machine
    parts: PartTables
    specs: Mapping[str, StrategySpec]
    explicit_spec: StrategySpec | None
    accelerator: str
    accelerator_reason: str
    devices: DevicesRequest
    cluster: str
    cluster_external: bool
    cluster_given: bool = False
    launcher_flag: object = None
    strategy_flag: object = None
    devices_flag: object = None
    num_nodes_flag: object = None
    # decided
    spec: StrategySpec | None = None
    launcher: str | None = None
    cluster_environment: str | None = None

    @property
    def chosen_spec(self) -> StrategySpec:
        if self.spec is None:
            raise RuntimeError("internal error: a rule read the strategy before it was chosen")
        return self.spec


# --------------------------------------------------------------------------- choose


def _explicit(ctx: StrategyDraft) -> str:
    ctx.spec = ctx.explicit_spec
    return f"strategy={ctx.strategy_flag!r} was asked for"


STRATEGY_CHOICE: Decision[StrategyDraft] = Decision(
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
            "interactive session (its fork launcher works there), unless a launcher is "
            "asked for.",
            when=lambda c: c.machine.interactive and _launcher_asked(c) is None,
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


def _choose(ctx: StrategyDraft, name: str, why: str) -> str:
    ctx.spec = ctx.specs[name]
    return f"strategy='auto' chose {name!r}: {why}"


# --------------------------------------------------------------------------- launcher flag


def _launcher_asked(ctx: StrategyDraft) -> object:
    """The launcher flag, None when it leaves the choice to the strategy."""
    value = ctx.launcher_flag
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    return value.strip().lower() if isinstance(value, str) else value


def _launcher_names(ctx: StrategyDraft) -> tuple[str, ...]:
    return tuple(n for n in ctx.parts.launchers if n != "external")


def _refuse_unknown_launcher(ctx: StrategyDraft) -> str:
    value = ctx.launcher_flag
    known = _launcher_names(ctx)
    kind = ("no launcher is registered under this name" if isinstance(value, str)
            else f"must be a launcher name, got {type(value).__name__}")
    if _launcher_asked(ctx) == "external":
        kind = ("'external' means the processes were created outside interlock (torchrun, "
                "srun, mpirun); the cluster environment decides it, not a flag")
    refuse(
        "unknown-launcher",
        flag="launcher",
        value=value,
        reason=f"{kind}.",
        choices=("auto", *known),
        suggestion=did_you_mean(value, known),
    )


def _refuse_launcher(ctx: StrategyDraft) -> str:
    spec = ctx.chosen_spec
    asked = _launcher_asked(ctx)
    takes = sorted(ctx.parts.strategy_launchers(spec))
    if spec.launcher is None:
        why = f"{spec.name!r}{_chosen_how(ctx)} runs in the calling process"
    elif spec.preset_of is not None and not spec.launchers:
        why = (f"{spec.name!r}{_chosen_how(ctx)} is {spec.preset_of!r} under the "
               f"{spec.launcher} launcher; ask for strategy={spec.preset_of!r} with "
               f"launcher={asked!r} instead")
    else:
        why = (f"{spec.name!r}{_chosen_how(ctx)} runs under "
               f"{', '.join(takes)} only")
    users = tuple(sorted(n for n, s in ctx.specs.items()
                         if s.variant_of is None and s.preset_of is None
                         and asked in ctx.parts.strategy_launchers(s)
                         and ctx.accelerator in ctx.parts.strategy_accelerators(s)))
    refuse(
        "unsupported-launcher",
        flag="launcher",
        value=ctx.launcher_flag,
        reason=f"launcher {asked!r} is not supported: {why}.",
        choices=(*(f"launcher={n!r}" for n in takes),
                 *(f"strategy={n!r}" for n in users)),
    )


def _take_launcher(ctx: StrategyDraft) -> str:
    spec = ctx.chosen_spec
    asked = str(_launcher_asked(ctx))
    if spec.launcher != asked:
        ctx.spec = with_launcher(spec, ctx.parts.launchers[asked])
    return f"launcher={asked!r} was asked for; {spec.name!r} runs under it"


LAUNCHER_FLAG: Decision[StrategyDraft] = Decision(
    id="strategy/launcher-flag",
    doc="The launcher flag: 'auto' (the default) keeps the strategy's own launcher; a "
    "launcher name must be one the strategy runs under (its row's launcher and "
    "launchers, and launcher rows that name it).",
    rules=(
        Rule(
            id="launcher-flag/auto",
            doc="No launcher asked for: the strategy's own.",
            when=lambda c: _launcher_asked(c) is None,
            then=lambda c: "launcher='auto': the strategy's own launcher",
        ),
        Rule(
            id="launcher-flag/unknown",
            doc="Not a registered launcher's name ('external' is the cluster's to decide).",
            when=lambda c: _launcher_asked(c) not in _launcher_names(c),
            then=_refuse_unknown_launcher,
            refuses="unknown-launcher",
        ),
        Rule(
            id="launcher-flag/unsupported",
            doc="A launcher the strategy does not run under (a preset that pins another "
            "launcher, or a strategy that runs in the calling process).",
            when=lambda c: _launcher_asked(c) not in c.parts.strategy_launchers(c.chosen_spec),
            then=_refuse_launcher,
            refuses="unsupported-launcher",
        ),
        Rule(
            id="launcher-flag/take",
            doc="The strategy runs under the launcher asked for: the plan's row is the "
            "strategy's with that launcher.",
            when=always,
            then=_take_launcher,
        ),
    ),
)


# --------------------------------------------------------------------------- check


def _strategy_names(ctx: StrategyDraft) -> tuple[str, ...]:
    return tuple(
        sorted(
            n for n, s in ctx.specs.items()
            if ctx.accelerator in ctx.parts.strategy_accelerators(s) and s.variant_of is None
        )
    )


def _chosen_how(ctx: StrategyDraft) -> str:
    if ctx.explicit_spec is None:
        return f" (strategy='auto' chose {ctx.chosen_spec.name!r})"
    return ""


def _refuse_accelerator(ctx: StrategyDraft) -> str:
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


def _missing(spec: StrategySpec, ctx: StrategyDraft) -> tuple[str, ...]:
    return tuple(p for p in spec.requires if p not in ctx.machine.packages)


def _refuse_missing(ctx: StrategyDraft) -> str:
    spec = ctx.chosen_spec
    refuse(
        "missing-package",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=ctx.parts.not_installed(repr(spec.name), _missing(spec, ctx)),
        choices=tuple(n for n in _strategy_names(ctx) if not _missing(ctx.specs[n], ctx)),
    )


def _too_many_devices(ctx: StrategyDraft) -> bool:
    limit = ctx.chosen_spec.max_devices
    return limit is not None and ctx.devices_per_node > limit


def _refuse_devices(ctx: StrategyDraft) -> str:
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


def _auto_devices_over_limit(ctx: StrategyDraft) -> bool:
    """devices='auto' placed more devices than the chosen row allows, and interlock
    (not a cluster's launcher) decides how many processes there are."""
    return (ctx.devices.kind == "auto" and _too_many_devices(ctx)
            and not ctx.cluster_external)


def _fit_auto_devices(ctx: StrategyDraft) -> str:
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


STRATEGY_DEVICES: Decision[StrategyDraft] = Decision(
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


def _refuse_multi_node(ctx: StrategyDraft) -> str:
    spec = ctx.chosen_spec
    refuse(
        "unsupported-multi-node",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{spec.name!r}{_chosen_how(ctx)} runs on one node only.",
        choices=("1",),
    )


def _supported(ctx: StrategyDraft) -> str:
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


def _launcher_row(ctx: StrategyDraft) -> LauncherRow | None:
    name = ctx.chosen_spec.launcher
    return ctx.parts.launchers.get(name) if name is not None else None


def _creates_processes(ctx: StrategyDraft) -> bool:
    row = _launcher_row(ctx)
    return row is not None and (row.launches_single or ctx.devices_per_node > 1)


def _no_launcher(ctx: StrategyDraft) -> str:
    ctx.launcher = None
    return f"{ctx.chosen_spec.name!r} runs in the calling process"


def _external(ctx: StrategyDraft) -> str:
    own = ctx.chosen_spec.launcher
    ctx.launcher = "external"
    if own not in (None, "subprocess"):
        ctx.note(
            f"{ctx.chosen_spec.name!r} normally starts its processes with the {own} launcher; "
            f"here {ctx.cluster} created them, so that launcher is not used"
        )
    return f"{ctx.cluster} created the processes"


def _alternatives(
    ctx: StrategyDraft, ok: Callable[[LauncherRow, StrategyDraft], bool]
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


def _interactive_ok(row: LauncherRow, ctx: StrategyDraft) -> bool:
    return row.interactive


def _start_method_ok(row: LauncherRow, ctx: StrategyDraft) -> bool:
    return row.start_method is None or row.start_method in ctx.machine.start_methods


def _refuse_interactive(ctx: StrategyDraft) -> str:
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


def _refuse_start_method(ctx: StrategyDraft) -> str:
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


def _places_elsewhere(ctx: StrategyDraft) -> bool:
    row = _launcher_row(ctx)
    return row is not None and row.environment is not None


def _owner_of_cluster(ctx: StrategyDraft) -> LauncherRow | None:
    """The launcher whose ranks run in the given cluster environment plugin's cluster,
    when that is another launcher than the strategy's."""
    if not ctx.cluster_given:
        return None
    own = ctx.chosen_spec.launcher
    return next((row for row in ctx.parts.launchers.values()
                 if row.environment == ctx.cluster and row.name != own), None)


def _refuse_foreign_environment(ctx: StrategyDraft) -> str:
    owner = _owner_of_cluster(ctx)
    assert owner is not None
    users = tuple(sorted(n for n, spec in ctx.specs.items()
                         if spec.launcher == owner.name and spec.variant_of is None))
    if owner.name in ctx.parts.strategy_launchers(ctx.chosen_spec):
        users = (f"launcher={owner.name!r}", *users)
    refuse(
        "conflicting-flags",
        flag="plugins",
        value=ctx.cluster,
        reason=f"the {ctx.cluster} cluster environment is where the {owner.name} launcher "
        f"runs its ranks, and {ctx.chosen_spec.name!r}{_chosen_how(ctx)} starts its "
        f"processes with the {ctx.chosen_spec.launcher} launcher, in which that "
        "environment would not know their ranks.",
        choices=users,
    )


def _refuse_environment_conflict(ctx: StrategyDraft) -> str:
    row = _launcher_row(ctx)
    assert row is not None and row.environment is not None
    refuse(
        "conflicting-flags",
        flag="plugins",
        value=ctx.cluster,
        reason=f"{ctx.chosen_spec.name!r}{_chosen_how(ctx)} starts its ranks with the "
        f"{row.name} launcher, which runs them in the {row.environment} cluster "
        f"environment, and the plugins give the {ctx.cluster} cluster environment.",
        choices=(f"drop the {ctx.cluster} plugin",
                 f"pass a {row.environment} cluster environment plugin"),
    )


def _placement_words(row: LauncherRow, ctx: StrategyDraft) -> str:
    if row.placement is None:
        return ""
    try:
        words = row.placement(accelerator=ctx.accelerator,
                              devices_per_node=ctx.devices_per_node,
                              num_nodes=ctx.num_nodes)
    except Exception as exc:  # a plugin's function: its failure is not the plan's
        return (f"; the {row.name} launcher's placement description failed "
                f"({type(exc).__name__}: {exc})")
    return f"; {words}" if isinstance(words, str) and words.strip() else ""


def _own_environment(ctx: StrategyDraft) -> str:
    row = _launcher_row(ctx)
    assert row is not None and row.environment is not None
    ctx.launcher = row.name
    ctx.cluster_environment = row.environment
    where = ("" if ctx.cluster == row.environment
             else f", not in this process's ({ctx.cluster})")
    return (f"{ctx.chosen_spec.name!r} uses the {row.name} launcher, whose ranks run in "
            f"the {row.environment} cluster environment{where}"
            + _placement_words(row, ctx))


def _own_launcher(ctx: StrategyDraft) -> str:
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
            id="launcher/foreign-environment",
            doc="A cluster environment plugin of the kind another launcher runs its ranks "
            "in (`LauncherRow.environment`, the Ray environment say) was given to a "
            "strategy that does not use that launcher.",
            when=lambda c: _owner_of_cluster(c) is not None,
            then=_refuse_foreign_environment,
            refuses="conflicting-flags",
        ),
        Rule(
            id="launcher/environment-conflict",
            doc="The launcher runs its ranks in a cluster environment of its own "
            "(`LauncherRow.environment`, Ray's say) and a cluster environment plugin "
            "names another.",
            when=lambda c: _places_elsewhere(c) and c.cluster_given
            and c.cluster != _launcher_row(c).environment,  # type: ignore[union-attr]
            then=_refuse_environment_conflict,
            refuses="conflicting-flags",
        ),
        Rule(
            id="launcher/own-environment",
            doc="The launcher places its ranks on a cluster of its own: the plan's cluster "
            "environment is the one its row names, and the trace says how devices and "
            "nodes map onto that cluster (`LauncherRow.placement`).",
            when=_places_elsewhere,
            then=_own_environment,
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
    decisions=(STRATEGY_CHOICE, LAUNCHER_FLAG, STRATEGY_DEVICES, STRATEGY_CHECK,
               LAUNCHER_CHOICE),
)


def choose_strategy(inputs: StrategyInput, written: Written = NOT_WRITTEN) -> StrategyChoice:
    """The strategy stage; ``written`` holds the flags as written, to quote.

    Raises:
        ResolutionError: the strategy does not run on this accelerator, geometry or
            machine, or no launcher can start its processes here.
    """
    draft = StrategyDraft(
        machine=inputs.machine, parts=inputs.parts, specs=inputs.specs,
        explicit_spec=(None if inputs.strategy_flag == "auto"
                       else inputs.specs[inputs.strategy_flag]),
        accelerator=inputs.accelerator, accelerator_reason=inputs.accelerator_reason,
        devices=inputs.devices, parallel_devices=inputs.parallel_devices,
        num_nodes=inputs.num_nodes, cluster=inputs.cluster,
        cluster_external=inputs.cluster_external, cluster_given=inputs.cluster_plugin is not None,
        launcher_flag=inputs.launcher_flag, strategy_flag=written.strategy,
        devices_flag=written.devices, num_nodes_flag=written.num_nodes,
    )
    trace = run_stage(STRATEGY_STAGE, draft, inputs.parts)
    return StrategyChoice(spec=draft.chosen_spec, launcher=draft.launcher,
                          parallel_devices=draft.parallel_devices,
                          cluster_environment=draft.cluster_environment or inputs.cluster,
                          notes=tuple(draft.notes), trace=trace)


STEP = Step("strategy", choose_strategy, StrategyInput,
            writes={"spec": "spec", "launcher": "launcher",
                    "parallel_devices": "parallel_devices",
                    "cluster_environment": "cluster_environment"})
