"""Stage 2, accelerator: choose the accelerator from the flag and the machine.

The rows come from the registry at call time (``parts``): a registered
accelerator gets an ``accelerator/auto-<name>`` rule just before ``accelerator/auto-cpu``
(see `interlock.engine.registry` for why there).
"""

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.machine import Machine
from interlock.engine.part_tables import PartTables
from interlock.engine.rules import Decision, Draft, Rule, Stage, always, refuse, run_stage
from interlock.engine.runner import Step
from interlock.engine.tables import (
    ACCELERATOR_CHOOSERS,
    EXTRA_DEVICES_FACT,
    AcceleratorRow,
)
from interlock.engine.trace import TraceStep
from interlock.engine.written import NOT_WRITTEN, Written


class AcceleratorInput(NamedTuple):
    """What the accelerator stage decides from.

    Attributes:
        machine: the machine planned for.
        parts: the registry's snapshot.
        accelerator_flag: the accelerator flag as read (a canonical name, ``"auto"``,
            ``"gpu"``).
    """

    machine: Machine
    parts: PartTables
    accelerator_flag: str


class AcceleratorChoice(NamedTuple):
    """The accelerator stage's result: the accelerator, why, notes and trace."""

    name: str
    reason: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class AcceleratorDraft(Draft):
    """The accelerator stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"accelerator", "accelerator_reason"})

    machine: Machine
    parts: PartTables
    accelerator_input: str
    accelerator_flag: object
    # decided
    accelerator: str = ""
    accelerator_reason: str = ""


_FACT_WORDS = {
    "cuda_devices": "CUDA devices",
    "mps_available": "Apple MPS devices",
    "xla_devices": "XLA devices",
}


def device_count(row: AcceleratorRow, machine: Machine) -> int | None:
    """Devices of this kind on the machine; None for the CPU (any number)."""
    if row.machine_fact is None:
        return None
    if row.machine_fact == EXTRA_DEVICES_FACT:
        return machine.extra_devices.get(row.name, 0)
    return int(getattr(machine, row.machine_fact))


def devices_on(accelerator: str, parts: PartTables, machine: Machine) -> int:
    """Devices of the accelerator named ``accelerator`` on ``machine`` (0 for the CPU,
    where devices counts processes)."""
    return device_count(parts.accelerators[accelerator], machine) or 0


def _missing_packages(row: AcceleratorRow, ctx: AcceleratorDraft) -> tuple[str, ...]:
    return tuple(p for p in row.requires if p not in ctx.machine.packages)


def _installed(row: AcceleratorRow, machine: Machine) -> bool:
    """Whether ``machine`` has every package ``row`` requires (most rows require none:
    that case makes no generator, and `available_on` tests it inline)."""
    return not row.requires or all(p in machine.packages for p in row.requires)


def available_on(row: AcceleratorRow, machine: Machine) -> bool:
    """Whether ``machine`` can run the accelerator of ``row``: it has every package the
    row requires, and devices of its kind (the CPU always has)."""
    if row.requires and not all(p in machine.packages for p in row.requires):
        return False
    return device_count(row, machine) != 0


def _available(name: str, ctx: AcceleratorDraft) -> bool:
    return available_on(ctx.parts.accelerators[name], ctx.machine)


def _available_names(ctx: AcceleratorDraft) -> tuple[str, ...]:
    return tuple(n for n in ctx.parts.accelerator_names if _available(n, ctx))


def machine_fact(row: AcceleratorRow, machine: Machine) -> str:
    """The machine fact behind an accelerator's availability, in words."""
    if row.machine_fact is None:
        return "the CPU is always available"
    if isinstance(getattr(machine, row.machine_fact), bool):
        available = getattr(machine, row.machine_fact)
        return f"{_FACT_WORDS[row.machine_fact]} {'are' if available else 'are not'} available"
    words = _FACT_WORDS.get(row.machine_fact, f"{row.name} devices")
    return f"this machine has {device_count(row, machine)} {words}"


def _explicit(ctx: AcceleratorDraft) -> bool:
    return ctx.accelerator_input in ctx.parts.accelerators


def _refuse_missing(ctx: AcceleratorDraft) -> str:
    row = ctx.parts.accelerators[ctx.accelerator_input]
    refuse(
        "missing-package",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=ctx.parts.not_installed(f"the {row.name} accelerator", _missing_packages(row, ctx)),
        choices=_available_names(ctx),
    )


def _refuse_unavailable(ctx: AcceleratorDraft) -> str:
    row = ctx.parts.accelerators[ctx.accelerator_input]
    refuse(
        "accelerator-unavailable",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"{machine_fact(row, ctx.machine)}.",
        choices=_available_names(ctx),
    )


def _choose_explicit(ctx: AcceleratorDraft) -> str:
    ctx.accelerator = ctx.accelerator_input
    ctx.accelerator_reason = f"accelerator={ctx.accelerator_flag!r} was asked for"
    return f"{ctx.accelerator!r} was asked for and is available"


def _chooser_rule(chooser: str, name: str, doc: str | None = None) -> Rule[AcceleratorDraft]:
    def then(ctx: AcceleratorDraft) -> str:
        row = ctx.parts.accelerators[name]
        ctx.accelerator = name
        why = "always available" if row.machine_fact is None else (
            f"{machine_fact(row, ctx.machine)}" + (f" and {', '.join(row.requires)} is installed"
                                    if row.requires else "")
        )
        ctx.accelerator_reason = f"accelerator={ctx.accelerator_flag!r} chose {name!r}: {why}"
        if chooser != "auto":
            ctx.note(f"accelerator={ctx.accelerator_flag!r} chose {name!r} ({why})")
        return f"{chooser!r} chose {name!r}: {why}"

    order = ", ".join(ACCELERATOR_CHOOSERS[chooser])
    return Rule(
        id=f"accelerator/{chooser}-{name}",
        doc=doc or f"accelerator='{chooser}' takes {name} when available (order: {order}).",
        when=lambda c: c.accelerator_input == chooser and _available(name, c),
        then=then,
    )


def _refuse_chooser(ctx: AcceleratorDraft) -> str:
    facts = "; ".join(
        machine_fact(ctx.parts.accelerators[n], ctx.machine)
        for n in ctx.parts.chooser_order(ctx.accelerator_input)
    )
    refuse(
        "accelerator-unavailable",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"no device it can pick is present: {facts}.",
        choices=_available_names(ctx),
    )


def _registered_choosers(parts: PartTables) -> tuple[Rule[AcceleratorDraft], ...]:
    return tuple(
        _chooser_rule("auto", row.name, doc=f"accelerator='auto' takes the registered "
                      f"accelerator {row.name} when available (after the built-in device "
                      "kinds, before cpu).")
        for row in parts.added_accelerators
    )


ACCELERATOR_CHOICE = Decision(
    id="accelerator/choose",
    doc="Pick the accelerator: an explicit one must be present; 'auto' and 'gpu' pick "
    "by preference.",
    rules=(
        Rule(
            id="accelerator/explicit-missing-package",
            doc="An explicit accelerator whose package is not installed (xla without "
            "torch_xla).",
            when=lambda c: _explicit(c)
            and not _installed(c.parts.accelerators[c.accelerator_input], c.machine),
            then=_refuse_missing,
            refuses="missing-package",
        ),
        Rule(
            id="accelerator/explicit-unavailable",
            doc="An explicit accelerator the machine has no device of.",
            when=lambda c: _explicit(c) and not _available(c.accelerator_input, c),
            then=_refuse_unavailable,
            refuses="accelerator-unavailable",
        ),
        Rule(
            id="accelerator/explicit",
            doc="An explicit accelerator that is present.",
            when=_explicit,
            then=_choose_explicit,
        ),
        *(
            _chooser_rule(chooser, name)
            for chooser, order in ACCELERATOR_CHOOSERS.items()
            for name in order
        ),
        Rule(
            id="accelerator/none-available",
            doc="'gpu' on a machine without MPS or CUDA.",
            when=always,
            then=_refuse_chooser,
            refuses="accelerator-unavailable",
        ),
    ),
    registered=_registered_choosers,
    registered_before="accelerator/auto-cpu",
)

ACCELERATOR_STAGE = Stage(
    name="accelerator",
    doc="Choose the accelerator from the flag and the machine.",
    decisions=(ACCELERATOR_CHOICE,),
)


def choose_accelerator(
    inputs: AcceleratorInput, written: Written = NOT_WRITTEN
) -> AcceleratorChoice:
    """The accelerator stage; ``written`` holds the flags as written, to quote.

    Raises:
        ResolutionError: the accelerator asked for is missing or lacks its package, or
            'gpu' finds no device.
    """
    draft = AcceleratorDraft(machine=inputs.machine, parts=inputs.parts,
                             accelerator_input=inputs.accelerator_flag,
                             accelerator_flag=written.accelerator)
    trace = run_stage(ACCELERATOR_STAGE, draft, inputs.parts)
    return AcceleratorChoice(name=draft.accelerator, reason=draft.accelerator_reason,
                             notes=tuple(draft.notes), trace=trace)


STEP = Step("accelerator", choose_accelerator, AcceleratorInput,
            writes={"name": "accelerator", "reason": "accelerator_reason"})
