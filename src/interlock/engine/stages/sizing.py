"""The sizing stage, right after the flags: read the flags that size the memory estimate.

``model=``, ``optimizer=`` and ``micro_batch_size=`` are checked here, right after the
other flags, so that a value of the wrong kind is refused before anything is decided.
The stage runs only when one of them is given: a plan without them has no step of it
in its trace. The estimate itself is the memory stage's, the last.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.errors import did_you_mean
from interlock.engine.limits import int_in, short_repr
from interlock.engine.model import ModelShape
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import Decision, Draft, Rule, Stage, always, refuse, run_stage
from interlock.engine.runner import Step
from interlock.engine.trace import TraceStep

#: the largest micro-batch accepted (samples per rank per forward)
MAX_MICRO_BATCH = 1 << 30


class SizingInput(NamedTuple):
    """What the sizing stage reads: the registry's snapshot (its optimizer rows) and
    the model, optimizer and micro-batch flags as written."""

    parts: PartTables
    model_flag: object = None
    optimizer_flag: object = None
    micro_batch_size_flag: object = None


class Sizing(NamedTuple):
    """The sizing flags, read: the shape (None: no estimate), the optimizer name and the
    micro-batch size as given, and the stage's notes and trace."""

    shape: ModelShape | None
    optimizer: str | None
    micro_batch_size: int | None
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


#: what a plan without sizing flags reads
NOT_SIZED = Sizing(shape=None, optimizer=None, micro_batch_size=None, notes=(), trace=())


@dataclass(slots=True, kw_only=True)
class SizingDraft(Draft):
    """The sizing stage's draft: the flags as written; it decides nothing but refusals
    and notes."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset()

    model: object
    optimizer: object
    micro_batch_size: object
    optimizers: Mapping[str, object]


def _refuse_model(ctx: SizingDraft) -> str:
    refuse("invalid-model", flag="model", value=ctx.model,
           reason=f"expected an interlock.ModelShape, got {type(ctx.model).__name__}: build "
           "one with interlock.ModelShape(parameters=...) or measure a module with "
           "interlock.model_shape(module).")


SIZING_MODEL: Decision[SizingDraft] = Decision(
    id="sizing/model",
    doc="The model flag is a ModelShape, or None (no estimate).",
    rules=(
        Rule(id="sizing/model-shape", doc="A ModelShape: the plan estimates memory.",
             when=lambda c: isinstance(c.model, ModelShape),
             then=lambda c: f"model={c.model!r}"),
        Rule(id="sizing/no-model", doc="None: nothing is estimated.",
             when=lambda c: c.model is None, then=lambda c: "no model: nothing estimated"),
        Rule(id="sizing/model-invalid", doc="Anything else is refused.", when=always,
             then=_refuse_model, refuses="invalid-model"),
    ),
)


def _optimizer_invalid(ctx: SizingDraft) -> bool:
    return ctx.optimizer is not None and not isinstance(ctx.optimizer, str)


def _refuse_optimizer_kind(ctx: SizingDraft) -> str:
    refuse("unknown-optimizer", flag="optimizer", value=ctx.optimizer,
           reason=f"the optimizer flag is a name (such as 'adamw'), got "
           f"{type(ctx.optimizer).__name__}: the estimate needs only what state it keeps.",
           choices=tuple(ctx.optimizers))


def _refuse_unknown(ctx: SizingDraft) -> str:
    names = tuple(ctx.optimizers)
    refuse("unknown-optimizer", flag="optimizer", value=ctx.optimizer,
           reason=f"{ctx.optimizer!r} is not an optimizer interlock knows; register its row "
           "with interlock.register(OptimizerRow(...)) to plan for it.",
           choices=names, suggestion=did_you_mean(ctx.optimizer, names))


def _unused(ctx: SizingDraft) -> str:
    ctx.note("optimizer and micro_batch_size size the memory estimate, which needs model= "
             "(an interlock.ModelShape): without it nothing is estimated")
    return "given without model=: nothing is estimated"


SIZING_OPTIMIZER: Decision[SizingDraft] = Decision(
    id="sizing/optimizer",
    doc="The optimizer flag is the name of an optimizer row (checked again by the memory "
    "stage, which reads the row).",
    rules=(
        Rule(id="sizing/optimizer-invalid", doc="Not a name.", when=_optimizer_invalid,
             then=_refuse_optimizer_kind, refuses="unknown-optimizer"),
        Rule(id="sizing/optimizer-unknown", doc="A name no optimizer row has.",
             when=lambda c: c.optimizer is not None and c.optimizer not in c.optimizers,
             then=_refuse_unknown, refuses="unknown-optimizer"),
        Rule(id="sizing/optimizer-name", doc="A known name, or None (the memory stage "
             "then assumes the default).", when=always,
             then=lambda c: "no optimizer given" if c.optimizer is None
             else f"optimizer={c.optimizer!r} is an optimizer row"),
    ),
)


def _micro_batch_invalid(ctx: SizingDraft) -> bool:
    size = ctx.micro_batch_size
    return size is not None and not int_in(size, 1, MAX_MICRO_BATCH)


def _refuse_micro_batch(ctx: SizingDraft) -> str:
    size = ctx.micro_batch_size
    refuse("invalid-model", flag="micro_batch_size", value=size,
           reason=f"the micro-batch size is the samples each rank runs per forward: an int "
           f"from 1 to {MAX_MICRO_BATCH:,}, got {type(size).__name__} {short_repr(size)}.")


SIZING_MICRO_BATCH: Decision[SizingDraft] = Decision(
    id="sizing/micro-batch",
    doc="The micro-batch size is an int from 1, or None; with no model the sizing flags "
    "are noted as unused.",
    rules=(
        Rule(id="sizing/micro-batch-invalid", doc="Not an int from 1.",
             when=_micro_batch_invalid, then=_refuse_micro_batch, refuses="invalid-model"),
        Rule(id="sizing/unused", doc="Given without a model: noted, nothing estimated.",
             when=lambda c: c.model is None, then=_unused),
        Rule(id="sizing/micro-batch-size", doc="Otherwise.", when=always,
             then=lambda c: "no micro-batch size" if c.micro_batch_size is None
             else f"micro_batch_size={c.micro_batch_size}"),
    ),
)

SIZING_STAGE: Stage[SizingDraft] = Stage(
    name="sizing",
    doc="Read model=, optimizer= and micro_batch_size= (only when one is given).",
    decisions=(SIZING_MODEL, SIZING_OPTIMIZER, SIZING_MICRO_BATCH),
)


def read_sizing(inputs: SizingInput) -> Sizing:
    """The sizing stage, when any of its flags is given; `NOT_SIZED` otherwise.

    Raises:
        ResolutionError: ``invalid-model`` (a model that is not a `ModelShape`, a
            micro-batch that is not an int from 1) or ``unknown-optimizer``.
    """
    model, optimizer, micro_batch_size = (inputs.model_flag, inputs.optimizer_flag,
                                          inputs.micro_batch_size_flag)
    if model is None and optimizer is None and micro_batch_size is None:
        return NOT_SIZED
    draft = SizingDraft(model=model, optimizer=optimizer, micro_batch_size=micro_batch_size,
                        optimizers=inputs.parts.optimizers)
    trace = run_stage(SIZING_STAGE, draft, inputs.parts)
    return Sizing(shape=model if isinstance(model, ModelShape) else None,
                  optimizer=optimizer if isinstance(optimizer, str) else None,
                  micro_batch_size=micro_batch_size if isinstance(micro_batch_size, int)
                  else None, notes=tuple(draft.notes), trace=trace)


STEP = Step("sizing", read_sizing, SizingInput,
            writes={"shape": "shape", "optimizer": "optimizer",
                    "micro_batch_size": "micro_batch_size"})
