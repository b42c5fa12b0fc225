"""Stage 6, precision: choose the precision and check it against the strategy and the
accelerator.

Which precisions a strategy takes is read through the registry snapshot (``parts``): a
spec's own declaration, plus the registered precision rows that name the strategy.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.machine import Machine
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import Decision, Draft, Rule, Stage, always, refuse, run_stage
from interlock.engine.runner import Step
from interlock.engine.specs import StrategySpec
from interlock.engine.trace import TraceStep
from interlock.engine.written import NOT_WRITTEN, Written


class PrecisionInput(NamedTuple):
    """What the precision stage decides from.

    Attributes:
        machine: the machine planned for (its packages).
        parts: the registry's snapshot.
        accelerator: the chosen accelerator.
        spec: the chosen strategy's row.
        strategy_flag: the strategy flag as read (a name asked for, or ``"auto"``).
        precision_flag: the precision flag as read (a canonical name).
        precision_plugin: the precision plugin given, if any.
    """

    machine: Machine
    parts: PartTables
    accelerator: str
    spec: StrategySpec
    strategy_flag: str
    precision_flag: str
    precision_plugin: object | None = None


class PrecisionChoice(NamedTuple):
    """The precision stage's result: the canonical precision name."""

    name: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class PrecisionDraft(Draft):
    """The precision stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"precision"})

    machine: Machine
    parts: PartTables
    accelerator: str
    chosen_spec: StrategySpec
    explicit: bool
    precision_input: str
    precision_plugin: object | None = None
    precision_flag: object = None
    plugins_flag: object = None
    # decided
    precision: str = ""


def _chosen_how(ctx: PrecisionDraft) -> str:
    return "" if ctx.explicit else f" (strategy='auto' chose {ctx.chosen_spec.name!r})"


def _from_plugin(ctx: PrecisionDraft) -> str:
    plugin = ctx.precision_plugin
    ctx.precision = str(getattr(plugin, "precision", ""))
    return f"the precision plugin {type(plugin).__name__} sets {ctx.precision!r}"


def _from_flag(ctx: PrecisionDraft) -> str:
    ctx.precision = ctx.precision_input
    return f"precision {ctx.precision!r} from the flag"


PRECISION_SOURCE = Decision(
    id="precision/source",
    doc="The precision comes from the precision plugin if one is given, else the flag.",
    rules=(
        Rule(
            id="precision/plugin",
            doc="A precision plugin sets the precision.",
            when=lambda c: c.precision_plugin is not None,
            then=_from_plugin,
        ),
        Rule(id="precision/flag", doc="Otherwise the flag.", when=always, then=_from_flag),
    ),
)


def _supported_precisions(ctx: PrecisionDraft) -> tuple[str, ...]:
    spec = ctx.chosen_spec
    parts = ctx.parts
    taken = parts.strategy_precisions(spec) - set(spec.precision_refusals.get(ctx.accelerator, {}))
    on_accelerator = parts.accelerator_precisions[ctx.accelerator]
    return tuple(
        p for p in parts.precision_names
        if p in taken and p in on_accelerator
        and all(r in ctx.machine.packages for r in parts.precisions[p].requires)
    )


def _precision_flag(ctx: PrecisionDraft) -> tuple[str, object]:
    if ctx.precision_plugin is not None:
        return "plugins", ctx.plugins_flag
    return "precision", ctx.precision_flag


def _refuse_by(holder: str) -> Callable[[PrecisionDraft], str]:
    def then(ctx: PrecisionDraft) -> str:
        flag, value = _precision_flag(ctx)
        if holder == "strategy":
            spec = ctx.chosen_spec
            # what the row declares less what it refuses on this accelerator
            refused_here = spec.precision_refusals.get(ctx.accelerator, {})
            taken = ctx.parts.strategy_precisions(spec) - set(refused_here)
            why = f"strategy {spec.name!r}{_chosen_how(ctx)} supports " + ", ".join(
                p for p in ctx.parts.precision_names if p in taken
            ) + (f" on {ctx.accelerator}" if refused_here else "")
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


def _refused_on_accelerator(ctx: PrecisionDraft) -> str | None:
    return ctx.chosen_spec.precision_refusals.get(ctx.accelerator, {}).get(ctx.precision)


def _refuse_on_accelerator(ctx: PrecisionDraft) -> str:
    flag, value = _precision_flag(ctx)
    refuse(
        "unsupported-precision",
        flag=flag,
        value=value,
        reason=f"{ctx.precision!r} is not supported by strategy {ctx.chosen_spec.name!r} "
        f"on {ctx.accelerator}: {_refused_on_accelerator(ctx)}",
        choices=_supported_precisions(ctx),
    )


def _precision_missing(ctx: PrecisionDraft) -> tuple[str, ...]:
    return tuple(p for p in ctx.parts.precisions[ctx.precision].requires
                 if p not in ctx.machine.packages)


def _refuse_precision_missing(ctx: PrecisionDraft) -> str:
    flag, value = _precision_flag(ctx)
    refuse(
        "missing-package",
        flag=flag,
        value=value,
        reason=ctx.parts.not_installed(repr(ctx.precision), _precision_missing(ctx)),
        choices=_supported_precisions(ctx),
    )


PRECISION_CHECK: Decision[PrecisionDraft] = Decision(
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


def choose_precision(inputs: PrecisionInput, written: Written = NOT_WRITTEN) -> PrecisionChoice:
    """The precision stage; ``written`` holds the flags as written, to quote.

    Raises:
        ResolutionError: the strategy or the accelerator does not take the precision,
            or its package is missing.
    """
    draft = PrecisionDraft(machine=inputs.machine, parts=inputs.parts,
                           accelerator=inputs.accelerator, chosen_spec=inputs.spec,
                           explicit=inputs.strategy_flag != "auto",
                           precision_input=inputs.precision_flag,
                           precision_plugin=inputs.precision_plugin,
                           precision_flag=written.precision,
                           plugins_flag=written.plugins)
    trace = run_stage(PRECISION_STAGE, draft, inputs.parts)
    return PrecisionChoice(name=draft.precision, notes=tuple(draft.notes), trace=trace)


STEP = Step("precision", choose_precision, PrecisionInput, writes={"name": "precision"})
