"""Stage 7, plugins: wire the remaining plugins (the checkpoint IO)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.connector.parts_registry import PartTables
from interlock.connector.rules import Decision, Draft, Rule, Stage, always, run_stage
from interlock.connector.trace import TraceStep


class PluginsInput(NamedTuple):
    """What the plugins stage decides from: the accelerator and the checkpoint IO
    plugin given, if any."""

    parts: PartTables
    accelerator: str
    checkpoint_io: object | None = None


class PluginsChoice(NamedTuple):
    """The plugins stage's result: the checkpoint IO's name."""

    checkpoint_io: str
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class PluginsDraft(Draft):
    """The plugins stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"checkpoint_io"})

    accelerator: str
    checkpoint_io_plugin: object | None = None
    # decided
    checkpoint_io: str = ""


def _custom_io(ctx: PluginsDraft) -> str:
    ctx.checkpoint_io = type(ctx.checkpoint_io_plugin).__name__
    return f"checkpoint IO from the plugin {ctx.checkpoint_io}"


def _default_io(name: str) -> Callable[[PluginsDraft], str]:
    def then(ctx: PluginsDraft) -> str:
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
            when=lambda c: c.checkpoint_io_plugin is not None,
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


def choose_plugins(inputs: PluginsInput) -> PluginsChoice:
    """The plugins stage."""
    draft = PluginsDraft(accelerator=inputs.accelerator,
                         checkpoint_io_plugin=inputs.checkpoint_io)
    trace = run_stage(PLUGINS_STAGE, draft, inputs.parts)
    return PluginsChoice(checkpoint_io=draft.checkpoint_io, notes=tuple(draft.notes),
                         trace=trace)
