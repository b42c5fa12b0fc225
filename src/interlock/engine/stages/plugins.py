"""Stage 8, plugins: wire the remaining plugins (the checkpoint IO).

A registered checkpoint IO row gets a ``plugins/checkpoint-io-<name>`` rule (taken when
the accelerator's row names it) just before ``plugins/checkpoint-io-torch``.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.part_tables import PartTables
from interlock.engine.rules import Decision, Draft, Rule, Stage, always, run_stage
from interlock.engine.runner import Step
from interlock.engine.tables import CHECKPOINT_IOS, CheckpointIORow
from interlock.engine.trace import TraceStep


class PluginsInput(NamedTuple):
    """What the plugins stage decides from: the registry's snapshot, the
    accelerator and the checkpoint IO plugin given, if any."""

    parts: PartTables
    accelerator: str
    checkpoint_io_plugin: object | None = None


class PluginsChoice(NamedTuple):
    """The plugins stage's result: the checkpoint IO's name."""

    checkpoint_io: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class PluginsDraft(Draft):
    """The plugins stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"checkpoint_io"})

    parts: PartTables
    accelerator: str
    checkpoint_io_plugin: object | None = None
    # decided
    checkpoint_io: str = ""


def _custom_io(ctx: PluginsDraft) -> str:
    ctx.checkpoint_io = type(ctx.checkpoint_io_plugin).__name__
    return f"checkpoint IO from the plugin {ctx.checkpoint_io}"


def _row_io(ctx: PluginsDraft) -> str | None:
    """The checkpoint IO the accelerator's row names."""
    row = ctx.parts.accelerators.get(ctx.accelerator)
    return row.checkpoint_io if row is not None else None


def _default_io(name: str) -> Callable[[PluginsDraft], str]:
    def then(ctx: PluginsDraft) -> str:
        ctx.checkpoint_io = name
        return f"the default {name} checkpoint IO"

    return then


def _io_rule(row: CheckpointIORow, doc: str | None = None) -> Rule[PluginsDraft]:
    name = row.name
    return Rule(
        id=f"plugins/checkpoint-io-{name}",
        doc=doc or f"The accelerator's row names {name} ({row.description}).",
        when=lambda c: _row_io(c) == name,
        then=_default_io(name),
    )


_BUILTIN_IO = {row.name: row for row in CHECKPOINT_IOS}


def _registered_ios(parts: PartTables) -> tuple[Rule[PluginsDraft], ...]:
    return tuple(_io_rule(row) for name, row in parts.checkpoint_ios.items()
                 if name not in _BUILTIN_IO)


PLUGINS_CHOICE = Decision(
    id="plugins/checkpoint-io",
    doc="Choose the checkpoint IO: a plugin, else the one the accelerator's row names "
    "(`AcceleratorRow.checkpoint_io`).",
    rules=(
        Rule(
            id="plugins/checkpoint-io-plugin",
            doc="A checkpoint IO plugin is used as given.",
            when=lambda c: c.checkpoint_io_plugin is not None,
            then=_custom_io,
        ),
        _io_rule(_BUILTIN_IO["xla"], doc="The accelerator's row names xla (the xla "
                 "accelerator): saves through torch_xla."),
        Rule(
            id="plugins/checkpoint-io-torch",
            doc="Otherwise torch.save with atomic writes (the row of cpu, cuda and mps "
            "names torch).",
            when=always,
            then=_default_io("torch"),
        ),
    ),
    registered=_registered_ios,
    registered_before="plugins/checkpoint-io-torch",
)

PLUGINS_STAGE = Stage(
    name="plugins",
    doc="Wire the remaining plugins.",
    decisions=(PLUGINS_CHOICE,),
)


def choose_plugins(inputs: PluginsInput) -> PluginsChoice:
    """The plugins stage."""
    draft = PluginsDraft(parts=inputs.parts, accelerator=inputs.accelerator,
                         checkpoint_io_plugin=inputs.checkpoint_io_plugin)
    trace = run_stage(PLUGINS_STAGE, draft, inputs.parts)
    return PluginsChoice(checkpoint_io=draft.checkpoint_io, notes=tuple(draft.notes),
                         trace=trace)


STEP = Step("plugins", choose_plugins, PluginsInput, writes={})
