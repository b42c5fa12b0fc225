"""The ``accelerator`` flag: a registered name, an alias, ``"auto"`` or an
`Accelerator` instance."""

from interlock.engine.errors import did_you_mean
from interlock.engine.registration import suspects
from interlock.engine.rules import Decision, Rule, always, refuse
from interlock.engine.stages.flags.draft import (
    FlagsDraft,
    broken_part_rule,
    instance_name,
    norm,
    part_kind,
)
from interlock.engine.tables import ACCELERATOR_ALIASES, ACCELERATOR_CHOOSERS


def _set_accelerator(ctx: FlagsDraft) -> str:
    ctx.accelerator_input = norm(ctx.accelerator_flag) or ""
    return f"accelerator={ctx.accelerator_flag!r} is a known accelerator input"


def _set_accelerator_alias(ctx: FlagsDraft) -> str:
    name = norm(ctx.accelerator_flag) or ""
    ctx.accelerator_input = ACCELERATOR_ALIASES[name]
    ctx.note(f"accelerator={ctx.accelerator_flag!r} is an alias of {ctx.accelerator_input!r}")
    return f"{name!r} is an alias of {ctx.accelerator_input!r}"


def _refuse_accelerator(ctx: FlagsDraft) -> str:
    value = ctx.accelerator_flag
    kind = "is not a known accelerator" if isinstance(value, str) else (
        f"must be a string, got {type(value).__name__}"
    )
    if isinstance(value, str):
        kind += suspects(ctx.parts.broken["accelerators"])
    inputs = ctx.parts.accelerator_inputs
    refuse(
        "unknown-accelerator",
        flag="accelerator",
        value=value,
        reason=f"{value!r} {kind}.",
        choices=inputs,
        suggestion=did_you_mean(value, inputs),
    )

def _set_accelerator_instance(ctx: FlagsDraft) -> str:
    ctx.accelerator_instance = ctx.accelerator_flag
    ctx.accelerator_input = instance_name(ctx.accelerator_flag) or ""
    return f"an accelerator instance ({type(ctx.accelerator_flag).__name__}, " \
        f"{ctx.accelerator_input!r})"


ACCELERATOR_FLAG = Decision(
    id="flags/accelerator",
    doc="Read the accelerator name (case-insensitive), or take an Accelerator instance.",
    rules=(
        Rule(
            id="flags/accelerator-instance",
            doc="An Accelerator instance whose name is a canonical accelerator; it is used "
            "as given when the strategy is built.",
            when=lambda c: part_kind(c.accelerator_flag) == "accelerator"
            and instance_name(c.accelerator_flag) in c.parts.accelerators,
            then=_set_accelerator_instance,
        ),
        Rule(
            id="flags/accelerator-name",
            doc="A canonical accelerator name, 'auto' or 'gpu'.",
            when=lambda c: norm(c.accelerator_flag) in c.parts.accelerators
            or norm(c.accelerator_flag) in ACCELERATOR_CHOOSERS,
            then=_set_accelerator,
        ),
        Rule(
            id="flags/accelerator-alias",
            doc="An alias ('tpu' means 'xla'); recorded in notes.",
            when=lambda c: norm(c.accelerator_flag) in ACCELERATOR_ALIASES,
            then=_set_accelerator_alias,
        ),
        broken_part_rule(
            "accelerators", "accelerator",
            "A name an `interlock.accelerators` entry point stands for (its own name, or a "
            "row name it returned) when that entry point failed to load: refused with the "
            "entry point's error, like a strategy's.", "accelerator_inputs"),
        Rule(
            id="flags/accelerator-unknown",
            doc="Anything else.",
            when=always,
            then=_refuse_accelerator,
            refuses="unknown-accelerator",
        ),
    ),
)
