"""The ``precision`` flag: a registered name, or a legacy spelling (``16``,
``"bf16"``) read with a deprecation warning."""

from interlock.engine.errors import did_you_mean
from interlock.engine.registration import suspects
from interlock.engine.rules import Decision, Rule, always, refuse
from interlock.engine.stages.flags.draft import (
    FlagsDraft,
    broken_part_rule,
    is_int,
    norm,
)
from interlock.engine.tables import LEGACY_PRECISIONS


def _legacy_key(value: object) -> int | str | None:
    if is_int(value):
        return value  # type: ignore[return-value]
    return norm(value)


def _set_precision(ctx: FlagsDraft) -> str:
    ctx.precision_input = norm(ctx.precision_flag) or ""
    return f"precision={ctx.precision_flag!r} is a canonical precision"


def _set_precision_legacy(ctx: FlagsDraft) -> str:
    key = _legacy_key(ctx.precision_flag)
    ctx.precision_input = LEGACY_PRECISIONS[key] if key is not None else ""
    ctx.note(
        f"precision={ctx.precision_flag!r} is a legacy alias of {ctx.precision_input!r}; "
        f"pass {ctx.precision_input!r} to say it directly"
    )
    return f"legacy alias {ctx.precision_flag!r} means {ctx.precision_input!r}"


def _refuse_precision(ctx: FlagsDraft) -> str:
    value = ctx.precision_flag
    names = ctx.parts.precision_names
    accepted = names + tuple(str(k) for k in LEGACY_PRECISIONS if isinstance(k, str))
    broken = suspects(ctx.parts.broken["precisions"]) if isinstance(value, str) else ""
    refuse(
        "unknown-precision",
        flag="precision",
        value=value,
        reason="this is neither a precision name nor a legacy alias (16, '16', 'bf16', "
        f"32, '32', 64, '64'){broken}.",
        choices=names,
        suggestion=did_you_mean(value, accepted),
    )


PRECISION_FLAG = Decision(
    id="flags/precision",
    doc="Read the precision; legacy aliases are translated and noted.",
    rules=(
        Rule(
            id="flags/precision-name",
            doc="A canonical precision name (case-insensitive).",
            when=lambda c: norm(c.precision_flag) in c.parts.precisions,
            then=_set_precision,
        ),
        Rule(
            id="flags/precision-legacy",
            doc="A legacy alias (int or str, never float or bool); recorded in notes.",
            when=lambda c: _legacy_key(c.precision_flag) in LEGACY_PRECISIONS,
            then=_set_precision_legacy,
        ),
        broken_part_rule(
            "precisions", "precision",
            "A name an `interlock.precisions` entry point stands for when that entry point "
            "failed to load: refused with the entry point's error.", "precision_names"),
        Rule(
            id="flags/precision-unknown",
            doc="Anything else.",
            when=always,
            then=_refuse_precision,
            refuses="unknown-precision",
        ),
    ),
)
