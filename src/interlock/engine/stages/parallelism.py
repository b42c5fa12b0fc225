"""Stage 7, parallelism: the degrees of parallelism and the mesh they make.

What is asked comes from the ``parallelism=`` flag, else from a strategy's older
options (``data_parallel_size`` / ``tensor_parallel_size``), else from the strategy
row's `StrategySpec.default_parallelism`. The degrees must be dimensions the row
accepts (`StrategySpec.parallel_dims`), multiply to the world size, keep tensor-parallel
groups within a node when they fit in one, and suit the accelerator and precision.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.errors import ResolutionError
from interlock.engine.limits import short_repr
from interlock.engine.parallelism import (
    DIMS,
    MeshLayout,
    Parallelism,
    divisors,
    fill,
)
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import (
    Decision,
    Draft,
    Rule,
    Stage,
    always,
    refuse,
    run_stage,
)
from interlock.engine.runner import Step
from interlock.engine.specs import StrategySpec
from interlock.engine.tables import (
    CONTEXT_PARALLEL_ACCELERATORS,
    CONTEXT_PARALLEL_REASON,
    LEGACY_DEGREE_OPTIONS,
    PIPELINE_PRECISION_REASON,
    PIPELINE_PRECISIONS,
)
from interlock.engine.trace import TraceStep


class ParallelismInput(NamedTuple):
    """What the parallelism stage decides from.

    Attributes:
        parts: the registry's snapshot.
        specs: every registered strategy row (for the alternatives a refusal lists).
        spec: the chosen strategy's row.
        accelerator: the chosen accelerator.
        precision: the chosen precision.
        parallel_devices: the devices of one node (a process each).
        num_nodes: the node count.
        parallelism_flag: the ``parallelism=`` flag as written; None when not given.
        strategy_instance: the Strategy object given, if any (its older degree
            options, `given_degrees`, come before the row's).
    """

    parts: PartTables
    specs: Mapping[str, StrategySpec]
    spec: StrategySpec
    accelerator: str
    precision: str
    parallel_devices: tuple[str, ...]
    num_nodes: int
    parallelism_flag: object = None
    strategy_instance: object = None


class ParallelismChoice(NamedTuple):
    """The parallelism stage's result: every degree an int, and the mesh."""

    degrees: Parallelism
    mesh: MeshLayout
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class ParallelismDraft(Draft):
    """The parallelism stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"requested", "degrees"})

    specs: Mapping[str, StrategySpec]
    spec: StrategySpec
    accelerator: str
    precision: str
    devices_per_node: int
    num_nodes: int
    flag: object = None
    legacy: Mapping[str, object]
    legacy_source: str = ""
    # decided
    requested: Parallelism | None = None
    degrees: Parallelism | None = None

    @property
    def world_size(self) -> int:
        return self.devices_per_node * self.num_nodes

    @property
    def where(self) -> str:
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"
        per = f"{self.devices_per_node} device{'s' if self.devices_per_node != 1 else ''}"
        return f"{nodes} x {per}"


def _asked(ctx: ParallelismDraft) -> Parallelism:
    assert ctx.requested is not None  # decided by the first decision
    return ctx.requested


def _resolved(ctx: ParallelismDraft) -> Parallelism:
    assert ctx.degrees is not None  # decided by the degrees decision
    return ctx.degrees


# --------------------------------------------------------------------------- request


def _read_flag(ctx: ParallelismDraft) -> Parallelism | ResolutionError:
    try:
        return Parallelism.from_flag(ctx.flag)
    except ResolutionError as error:
        return error


def _legacy_degrees(ctx: ParallelismDraft) -> dict[str, object]:
    """The older options as dimensions (``"auto"`` ones left out)."""
    return {LEGACY_DEGREE_OPTIONS[k]: v for k, v in ctx.legacy.items()
            if k in LEGACY_DEGREE_OPTIONS and v != "auto"}


def _legacy_request(ctx: ParallelismDraft) -> Parallelism | ResolutionError:
    degrees = _legacy_degrees(ctx)
    # one older degree left 'auto' takes what the other leaves; both given fill it
    auto = [LEGACY_DEGREE_OPTIONS[k] for k, v in ctx.legacy.items() if v == "auto"]
    given: dict[str, object] = {"dp_shard": 1, **degrees}
    if auto and len(degrees) == 1:
        given[auto[0]] = "auto"
    try:
        return Parallelism.from_flag(given)
    except ResolutionError as error:
        return error


def _legacy_text(ctx: ParallelismDraft) -> str:
    return ", ".join(f"{k}={short_repr(v)}" for k, v in ctx.legacy.items())


def _flag_conflicts(ctx: ParallelismDraft) -> bool:
    if ctx.flag is None or not _legacy_degrees(ctx):
        return False
    asked, older = _read_flag(ctx), _legacy_request(ctx)
    if isinstance(asked, ResolutionError) or isinstance(older, ResolutionError):
        return False  # the flag's own refusal, or the older options', comes next
    return asked.degrees() != older.degrees()


def _refuse_conflict(ctx: ParallelismDraft) -> str:
    older = _legacy_request(ctx)
    refuse(
        "conflicting-flags", flag="parallelism", value=ctx.flag,
        reason=f"{ctx.legacy_source} already sets {_legacy_text(ctx)}, which means "
        f"{older.describe() if isinstance(older, Parallelism) else '?'}; give the degrees "
        "in one place.",
        choices=("parallelism=... alone", f"{_legacy_text(ctx)} alone"),
    )


def _raise(result: object) -> str:
    """The action of a refusal whose predicate found ``result`` to be the refusal."""
    raise result if isinstance(result, ResolutionError) else RuntimeError("unreachable")


def _refuse_flag(ctx: ParallelismDraft) -> str:
    return _raise(_read_flag(ctx))


def _set_flag(ctx: ParallelismDraft) -> str:
    asked = _read_flag(ctx)
    assert isinstance(asked, Parallelism)
    ctx.requested = asked
    return f"parallelism={short_repr(ctx.flag)} asks for {asked.describe()}"


def _refuse_legacy(ctx: ParallelismDraft) -> str:
    error = _legacy_request(ctx)
    assert isinstance(error, ResolutionError)
    refuse(error.code, flag="strategy", value=_legacy_text(ctx),
           reason=f"{ctx.legacy_source}: {error.reason}", choices=error.choices)


def _set_legacy(ctx: ParallelismDraft) -> str:
    asked = _legacy_request(ctx)
    assert isinstance(asked, Parallelism)
    ctx.requested = asked
    said = {d: v for d, v in asked.degrees().items() if v != 1}
    ctx.note(f"{_legacy_text(ctx)} ({ctx.legacy_source}) are the older spellings of "
             f"parallelism={said!r}; pass parallelism= to say it directly")
    return f"{ctx.legacy_source} sets {_legacy_text(ctx)}: {asked.describe()}"


def _row_default(ctx: ParallelismDraft) -> str:
    degrees = {dim: ctx.devices_per_node if degree == "node" else degree
               for dim, degree in ctx.spec.default_parallelism.items()}
    ctx.requested = Parallelism.from_flag({"dp_shard": 1, **degrees})
    written = ", ".join(f"{d}={v}" for d, v in ctx.spec.default_parallelism.items())
    return f"not given: {ctx.spec.name!r}'s default ({written or 'one rank'})"


REQUEST = Decision(
    id="parallelism/request",
    doc="What is asked: the parallelism flag, else a strategy's older degree options, "
    "else the strategy row's default degrees.",
    rules=(
        Rule(
            id="parallelism/conflict",
            doc="The flag and a strategy's older options (data_parallel_size, "
            "tensor_parallel_size) both set degrees, differently.",
            when=_flag_conflicts,
            then=_refuse_conflict,
            refuses="conflicting-flags",
        ),
        Rule(
            id="parallelism/flag-unreadable",
            doc="A flag that is not a Parallelism, a mapping of dimensions to degrees or "
            "'dim=degree' text, or has an unknown dimension, a degree that is not an int "
            ">= 1 or 'auto' (-1), or more than one 'auto'.",
            when=lambda c: c.flag is not None
            and isinstance(_read_flag(c), ResolutionError),
            then=_refuse_flag,
            refuses="invalid-parallelism",
        ),
        Rule(
            id="parallelism/flag",
            doc="The flag's degrees (dimensions not given keep Parallelism's defaults: "
            "dp_shard='auto', the others 1).",
            when=lambda c: c.flag is not None,
            then=_set_flag,
        ),
        Rule(
            id="parallelism/legacy-options-unreadable",
            doc="Older degree options that are not ints >= 1 or 'auto'.",
            when=lambda c: bool(_legacy_degrees(c))
            and isinstance(_legacy_request(c), ResolutionError),
            then=_refuse_legacy,
            refuses="invalid-parallelism",
        ),
        Rule(
            id="parallelism/legacy-options",
            doc="A strategy's older options: data_parallel_size means dp_shard and "
            "tensor_parallel_size means tp (one left 'auto' takes what the other leaves); "
            "recorded in notes.",
            when=lambda c: bool(_legacy_degrees(c)),
            then=_set_legacy,
        ),
        Rule(
            id="parallelism/row-default",
            doc="Not given: the strategy row's default_parallelism ('node' is the devices "
            "of one node; dimensions it leaves out are 1).",
            when=always,
            then=_row_default,
        ),
    ),
)

# --------------------------------------------------------------------------- dimensions


def _accepted_dims(spec: StrategySpec) -> frozenset[str]:
    """The dimensions a row runs above 1: those users may set (`parallel_dims`) and
    those of its own default layout (ZeRO shards over every rank: asking DeepSpeed for
    exactly that is no refusal, asking it for anything else is)."""
    own = {d for d, v in spec.default_parallelism.items() if v != 1}
    return spec.parallel_dims | own


def _beyond_row(ctx: ParallelismDraft, degrees: Parallelism) -> list[str]:
    """Dimensions above 1 that the user asked for and the row does not run (the row's
    own default degrees are the strategy's to choose)."""
    if ctx.flag is None and not _legacy_degrees(ctx):
        return []
    accepted = _accepted_dims(ctx.spec)
    return [d for d in DIMS if d not in accepted and getattr(degrees, d) not in (1, "auto")]


def _takers(ctx: ParallelismDraft, dims: set[str]) -> tuple[str, ...]:
    return tuple(sorted(
        name for name, spec in ctx.specs.items()
        if spec.variant_of is None and dims <= _accepted_dims(spec)
        and ctx.accelerator in spec.accelerators
    ))


def _refuse_dimension(ctx: ParallelismDraft, dims: list[str], degrees: Parallelism) -> str:
    accepted = ", ".join(d for d in DIMS if d in _accepted_dims(ctx.spec)) or "none"
    shown = ", ".join(f"{d}={getattr(degrees, d)}" for d in dims)
    refuse(
        "unsupported-parallelism", flag="parallelism", value=_asked(ctx).describe(),
        reason=f"{ctx.spec.name!r} cannot run {shown}: it accepts only these dimensions "
        f"above 1: {accepted}. Strategies that accept {', '.join(dims)} on "
        f"{ctx.accelerator} are the choices.",
        choices=_takers(ctx, set(dims)),
    )


def _accepted(ctx: ParallelismDraft) -> str:
    dims = ", ".join(d for d in DIMS if d in ctx.spec.parallel_dims)
    return f"{ctx.spec.name!r} accepts {dims or 'no dimension'} above 1"


DIMENSIONS = Decision(
    id="parallelism/dimensions",
    doc="Every degree above 1 is of a dimension the strategy row accepts "
    "(StrategySpec.parallel_dims) or of the row's own default layout.",
    rules=(
        Rule(
            id="parallelism/unsupported-dimension",
            doc="A degree above 1 on a dimension the row does not accept: refused, with "
            "the strategies that accept it.",
            when=lambda c: bool(_beyond_row(c, _asked(c))),
            then=lambda c: _refuse_dimension(c, _beyond_row(c, _asked(c)), _asked(c)),
            refuses="unsupported-parallelism",
        ),
        Rule(
            id="parallelism/dimensions-accepted",
            doc="Otherwise the dimensions are the row's.",
            when=always,
            then=_accepted,
        ),
    ),
)

# --------------------------------------------------------------------------- degrees


def _fitted(ctx: ParallelismDraft) -> Parallelism | ResolutionError:
    try:
        return fill(_asked(ctx), ctx.world_size, where=ctx.where)
    except ResolutionError as error:
        return error


def _refuse_fit(ctx: ParallelismDraft) -> str:
    return _raise(_fitted(ctx))


def _set_filled(ctx: ParallelismDraft) -> str:
    fitted = _fitted(ctx)
    assert isinstance(fitted, Parallelism)
    ctx.degrees = fitted
    auto = _asked(ctx).auto
    return (f"{auto}='auto' takes {getattr(fitted, auto)} = {ctx.world_size} ranks / the "
            "others" if auto else f"the degrees multiply to the world size {ctx.world_size}")


DEGREES = Decision(
    id="parallelism/degrees",
    doc="Fill the 'auto' degree and check that the degrees multiply to the world size.",
    rules=(
        Rule(
            id="parallelism/does-not-fit",
            doc="The fixed degrees do not divide the world size (with an 'auto'), or do "
            "not multiply to it (without): refused with the arithmetic and values that "
            "fit.",
            when=lambda c: isinstance(_fitted(c), ResolutionError),
            then=_refuse_fit,
            refuses="invalid-parallelism",
        ),
        Rule(
            id="parallelism/fits",
            doc="Otherwise 'auto' is the world size over the other degrees.",
            when=always,
            then=_set_filled,
        ),
    ),
)

# --------------------------------------------------------------------------- requirements


def _auto_beyond_row(ctx: ParallelismDraft) -> list[str]:
    return _beyond_row(ctx, _resolved(ctx))


def _tp_straddles(ctx: ParallelismDraft) -> bool:
    tp = int(_resolved(ctx).tp)
    return ctx.num_nodes > 1 and tp <= ctx.devices_per_node and ctx.devices_per_node % tp != 0


def _refuse_straddle(ctx: ParallelismDraft) -> str:
    tp = _resolved(ctx).tp
    refuse(
        "invalid-parallelism", flag="parallelism", value=_asked(ctx).describe(),
        reason=f"tp={tp} does not divide the {ctx.devices_per_node} devices of a node, so "
        f"some tensor-parallel groups would span two nodes although a group of {tp} fits "
        "in one; tensor parallel exchanges activations every layer and needs the links "
        "within a node.",
        choices=tuple(f"tp={d}" for d in divisors(ctx.devices_per_node)),
    )


def _refuse_cp(ctx: ParallelismDraft) -> str:
    refuse(
        "unsupported-parallelism", flag="parallelism", value=_asked(ctx).describe(),
        reason=f"cp={_resolved(ctx).cp} on {ctx.accelerator}: {CONTEXT_PARALLEL_REASON}.",
        choices=tuple(sorted(CONTEXT_PARALLEL_ACCELERATORS)),
    )


def _refuse_pp_precision(ctx: ParallelismDraft) -> str:
    refuse(
        "unsupported-precision", flag="precision", value=ctx.precision,
        reason=f"{ctx.precision} with pipeline parallel (pp={_resolved(ctx).pp}): "
        f"{PIPELINE_PRECISION_REASON}.",
        choices=tuple(sorted(PIPELINE_PRECISIONS & ctx.spec.precisions_on(ctx.accelerator))),
    )


def _layout(ctx: ParallelismDraft) -> str:
    return f"mesh {MeshLayout.of(_resolved(ctx)).describe()}"


def _tp_across_nodes(ctx: ParallelismDraft) -> str:
    ctx.note(f"tp={_resolved(ctx).tp} is more than the {ctx.devices_per_node} devices of a "
             "node: tensor-parallel groups span nodes and exchange activations over the "
             "network every layer")
    return _layout(ctx) + "; tensor parallel spans nodes"


REQUIREMENTS = Decision(
    id="parallelism/requirements",
    doc="What the filled-in degrees need of the row, the nodes, the accelerator and the "
    "precision.",
    rules=(
        Rule(
            id="parallelism/auto-unsupported-dimension",
            doc="'auto' filled a dimension the row does not accept with more than 1.",
            when=lambda c: bool(_auto_beyond_row(c)),
            then=lambda c: _refuse_dimension(c, _auto_beyond_row(c), _resolved(c)),
            refuses="unsupported-parallelism",
        ),
        Rule(
            id="parallelism/tp-split-across-nodes",
            doc="On several nodes, a tensor-parallel degree that fits in a node but does "
            "not divide its devices would put some groups on two nodes.",
            when=_tp_straddles,
            then=_refuse_straddle,
            refuses="invalid-parallelism",
        ),
        Rule(
            id="parallelism/cp-accelerator",
            doc="Context parallel on an accelerator whose attention kernels torch's "
            "context parallel cannot split (anything but CUDA).",
            when=lambda c: _resolved(c).cp != 1
            and c.accelerator not in CONTEXT_PARALLEL_ACCELERATORS,
            then=_refuse_cp,
            refuses="unsupported-parallelism",
        ),
        Rule(
            id="parallelism/pp-precision",
            doc="Pipeline parallel with a precision the pipeline schedule cannot train in "
            "(16-mixed: its gradient scaler).",
            when=lambda c: _resolved(c).pp != 1 and c.precision not in PIPELINE_PRECISIONS,
            then=_refuse_pp_precision,
            refuses="unsupported-precision",
        ),
        Rule(
            id="parallelism/tp-across-nodes",
            doc="A tensor-parallel degree larger than a node: allowed (it cannot fit in "
            "one), recorded in notes.",
            when=lambda c: c.num_nodes > 1 and int(_resolved(c).tp) > c.devices_per_node,
            then=_tp_across_nodes,
        ),
        Rule(
            id="parallelism/layout",
            doc=f"Otherwise the mesh is ({', '.join(DIMS)}), {DIMS[-1]} fastest.",
            when=always,
            then=_layout,
        ),
    ),
)

PARALLELISM_STAGE = Stage(
    name="parallelism",
    doc="Decide the degrees of parallelism and the device mesh.",
    decisions=(REQUEST, DIMENSIONS, DEGREES, REQUIREMENTS),
)


def given_degrees(spec: StrategySpec, instance: object = None) -> tuple[dict[str, object], str]:
    """A strategy's older degree options (`LEGACY_DEGREE_OPTIONS`), as given: by the
    strategy instance (its ``degree_options()``), else by the row's options; with who
    gave them, in words (:class:`ParallelismInput`'s ``legacy`` and ``legacy_source``)."""
    reader = getattr(instance, "degree_options", None)
    if callable(reader):
        given = reader()
        if isinstance(given, Mapping):
            options = {k: v for k, v in given.items() if k in LEGACY_DEGREE_OPTIONS}
            if options:
                return options, f"the {type(instance).__name__} instance"
    options = {k: v for k, v in spec.options.items() if k in LEGACY_DEGREE_OPTIONS}
    return options, f"the options of strategy {spec.name!r}"


def choose_parallelism(inputs: ParallelismInput) -> ParallelismChoice:
    """The parallelism stage.

    Raises:
        ResolutionError: ``invalid-parallelism``, ``unsupported-parallelism``,
            ``unsupported-precision`` or ``conflicting-flags``.
    """
    legacy, legacy_source = given_degrees(inputs.spec, inputs.strategy_instance)
    draft = ParallelismDraft(
        specs=inputs.specs, spec=inputs.spec, accelerator=inputs.accelerator,
        precision=inputs.precision, devices_per_node=len(inputs.parallel_devices),
        num_nodes=inputs.num_nodes, flag=inputs.parallelism_flag, legacy=legacy,
        legacy_source=legacy_source,
    )
    trace = run_stage(PARALLELISM_STAGE, draft, inputs.parts)
    degrees = _resolved(draft)
    return ParallelismChoice(degrees=degrees, mesh=MeshLayout.of(degrees),
                             notes=tuple(draft.notes), trace=trace)


STEP = Step("parallelism", choose_parallelism, ParallelismInput, writes={"degrees": "degrees"})
