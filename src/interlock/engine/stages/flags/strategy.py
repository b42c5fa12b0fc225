"""The ``strategy`` flag: a registered name (a preset included), ``"auto"`` or a
`Strategy` instance; withdrawn names and broken entry points refused with the reason."""

from interlock.engine.errors import did_you_mean
from interlock.engine.rules import Decision, Rule, always, refuse
from interlock.engine.stages.flags.draft import (
    FlagsDraft,
    broken_among,
    instance_name,
    norm,
    part_kind,
    refuse_broken,
)
from interlock.engine.tables import WITHDRAWN_ROWS


def _set_strategy_auto(ctx: FlagsDraft) -> str:
    ctx.strategy_input = "auto"
    return "strategy='auto': chosen after the accelerator and devices are known"


def _set_strategy_name(ctx: FlagsDraft) -> str:
    name = norm(ctx.strategy_flag) or ""
    ctx.strategy_input = name
    return f"strategy={ctx.strategy_flag!r} is registered ({ctx.specs[name].factory})"


def _refuse_withdrawn(ctx: FlagsDraft) -> str:
    row = WITHDRAWN_ROWS[norm(ctx.strategy_flag) or ""]
    refuse(
        "unknown-strategy",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"{row.name!r} is not offered: {row.reason}.",
        choices=(row.replacement,),
    )


def _registered_names(ctx: FlagsDraft) -> tuple[str, ...]:
    return tuple(sorted(n for n, s in ctx.specs.items() if s.variant_of is None))


def _refuse_broken_entry_point(ctx: FlagsDraft) -> str:
    return refuse_broken(ctx.broken_entry_points, "strategies", "strategy",
                          ctx.strategy_flag, ("auto", *_registered_names(ctx)))


def _refuse_strategy(ctx: FlagsDraft) -> str:
    value = ctx.strategy_flag
    names = ("auto", *_registered_names(ctx))
    kind = "no strategy is registered under this name" if isinstance(value, str) else (
        f"must be a strategy name, got {type(value).__name__}"
    )
    if isinstance(value, str) and ctx.broken_entry_points:
        kind += " (" + "; ".join(
            f"the {ep.describe()} failed to load and may be the one that provides it"
            for ep in ctx.broken_entry_points
        ) + ")"
    refuse(
        "unknown-strategy",
        flag="strategy",
        value=value,
        reason=f"{kind}.",
        choices=names,
        suggestion=did_you_mean(value, ("auto", *ctx.specs)),
    )


def _set_strategy_instance(ctx: FlagsDraft) -> str:
    name = instance_name(ctx.strategy_flag) or ""
    ctx.strategy_instance = ctx.strategy_flag
    ctx.strategy_input = name
    return f"a strategy instance ({type(ctx.strategy_flag).__name__}, registered as {name!r})"


def _refuse_strategy_instance(ctx: FlagsDraft) -> str:
    name = instance_name(ctx.strategy_flag)
    refuse(
        "unknown-strategy",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"the instance's name {name!r} is not a registered strategy; register a "
        "StrategySpec for its class first.",
        choices=tuple(sorted(n for n, s in ctx.specs.items() if s.variant_of is None)),
    )


STRATEGY_FLAG = Decision(
    id="flags/strategy",
    doc="Look the strategy name up in the registry (case-insensitive), or take a Strategy "
    "instance.",
    rules=(
        Rule(
            id="flags/strategy-instance",
            doc="A Strategy instance: its registry row decides like a name would, and the "
            "parts it was given are used as given.",
            when=lambda c: part_kind(c.strategy_flag) == "strategy"
            and instance_name(c.strategy_flag) in c.specs,
            then=_set_strategy_instance,
        ),
        Rule(
            id="flags/strategy-instance-unregistered",
            doc="A Strategy instance whose name is not registered.",
            when=lambda c: part_kind(c.strategy_flag) == "strategy",
            then=_refuse_strategy_instance,
            refuses="unknown-strategy",
        ),
        Rule(
            id="flags/strategy-auto",
            doc="'auto' defers the choice to the strategy stage.",
            when=lambda c: norm(c.strategy_flag) == "auto",
            then=_set_strategy_auto,
        ),
        Rule(
            id="flags/strategy-name",
            doc="A registered strategy name (built-in or third-party).",
            when=lambda c: norm(c.strategy_flag) in c.specs,
            then=_set_strategy_name,
        ),
        Rule(
            id="flags/strategy-withdrawn",
            doc="A name other tools accept but interlock withdraws on purpose "
            "(for example 'dp'); the replacement is the only choice.",
            when=lambda c: norm(c.strategy_flag) in WITHDRAWN_ROWS,
            then=_refuse_withdrawn,
            refuses="unknown-strategy",
        ),
        Rule(
            id="flags/strategy-broken-entry-point",
            doc="A name that a third-party entry point stands for (the entry point's own "
            "name, or a spec name it returned) when that entry point failed to load: "
            "refused with the entry point's error; every other name still resolves.",
            when=lambda c: broken_among(c.broken_entry_points, c.strategy_flag) is not None,
            then=_refuse_broken_entry_point,
            refuses="broken-entry-point",
        ),
        Rule(
            id="flags/strategy-unknown",
            doc="Anything else.",
            when=always,
            then=_refuse_strategy,
            refuses="unknown-strategy",
        ),
    ),
)
