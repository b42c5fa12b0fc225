"""The flags stage itself: its decisions in order, `read_flags` over all of them,
`read_flag` over one alone (how the matrix parses each distinct value of a flag once),
and `seeds`, what the stage hands to the runner's later steps."""

from collections.abc import Mapping
from typing import Literal

from interlock.engine.machine import Machine
from interlock.engine.part_tables import PartTables
from interlock.engine.registration import EntryPointStatus
from interlock.engine.rules import Decision, Stage, run_decision, run_stage
from interlock.engine.runner import Facts, written_seeds
from interlock.engine.specs import StrategySpec
from interlock.engine.stages.flags.accelerator import ACCELERATOR_FLAG
from interlock.engine.stages.flags.conflicts import CONFLICTS, INSTANCE_PARTS
from interlock.engine.stages.flags.devices import DEVICES_FLAG
from interlock.engine.stages.flags.draft import Flags, FlagsDraft
from interlock.engine.stages.flags.num_nodes import NUM_NODES_FLAG
from interlock.engine.stages.flags.plugins import PLUGINS_FLAG
from interlock.engine.stages.flags.precision import PRECISION_FLAG
from interlock.engine.stages.flags.strategy import STRATEGY_FLAG
from interlock.engine.trace import TraceStep
from interlock.engine.written import Written

FLAGS_STAGE = Stage(
    name="flags",
    doc="Parse each flag into a typed value; refuse what cannot be parsed.",
    decisions=(
        ACCELERATOR_FLAG,
        DEVICES_FLAG,
        STRATEGY_FLAG,
        PRECISION_FLAG,
        NUM_NODES_FLAG,
        PLUGINS_FLAG,
        CONFLICTS,
        INSTANCE_PARTS,
    ),
)


def read_flags(
    written: Written,
    *,
    specs: Mapping[str, StrategySpec],
    parts: PartTables,
    broken_entry_points: tuple[EntryPointStatus, ...] = (),
) -> Flags:
    """The flags stage: every flag parsed, conflicts refused, a strategy instance's own
    parts taken in.

    Raises:
        ResolutionError: a flag cannot be parsed, or two of them set the same thing.
    """
    draft = FlagsDraft(
        specs=specs, parts=parts, broken_entry_points=broken_entry_points,
        accelerator_flag=written.accelerator, devices_flag=written.devices,
        strategy_flag=written.strategy, precision_flag=written.precision,
        num_nodes_flag=written.num_nodes, plugins_flag=written.plugins,
    )
    return _flags(draft, written, run_stage(FLAGS_STAGE, draft, parts), instances=True)


def _flags(draft: FlagsDraft, written: Written, trace: tuple[TraceStep, ...], *,
           instances: bool) -> Flags:
    """The stage's result from its draft; without ``instances``, with no accelerator or
    strategy instance (`read_flag` leaves them out)."""
    return Flags(
        written=written,
        accelerator=draft.accelerator_input,
        accelerator_instance=draft.accelerator_instance if instances else None,
        strategy=draft.strategy_input,
        strategy_instance=draft.strategy_instance if instances else None,
        devices=draft.devices,
        precision=draft.precision_input,
        num_nodes=draft.num_nodes,
        plugins=draft.plugins,
        notes=tuple(draft.notes),
        trace=trace,
    )


#: The flags `read_flag` parses alone: (its decision, the draft field it reads).
OneFlag = Literal["accelerator", "devices", "strategy", "precision", "num_nodes"]
_ONE_FLAG: dict[str, tuple[Decision[FlagsDraft], str]] = {
    "accelerator": (ACCELERATOR_FLAG, "accelerator_flag"),
    "devices": (DEVICES_FLAG, "devices_flag"),
    "strategy": (STRATEGY_FLAG, "strategy_flag"),
    "precision": (PRECISION_FLAG, "precision_flag"),
    "num_nodes": (NUM_NODES_FLAG, "num_nodes_flag"),
}


def read_flag(
    flag: OneFlag,
    value: object,
    *,
    specs: Mapping[str, StrategySpec],
    parts: PartTables,
    broken_entry_points: tuple[EntryPointStatus, ...] = (),
) -> Flags:
    """One flag's own decision alone; the other flags keep their defaults.

    Raises:
        ResolutionError: the value cannot be parsed.
    """
    decision, source = _ONE_FLAG[flag]
    draft = FlagsDraft(specs=specs, parts=parts, broken_entry_points=broken_entry_points,
                       **{source: value})  # type: ignore[arg-type]
    trace: list[TraceStep] = []
    run_decision(FLAGS_STAGE.name, decision, draft, parts, trace)
    return _flags(draft, Written(**{flag: value}), tuple(trace), instances=False)


def seeds(flags: Flags, *, machine: Machine, parts: PartTables,
          specs: Mapping[str, StrategySpec]) -> Facts:
    """The facts the later stages start from (`runner.SEEDS`): the constants of the run,
    the flags this stage parses as it parsed them, and the others as written."""
    plugins = flags.plugins
    facts: Facts = {
        "machine": machine, "parts": parts, "specs": specs,
        "accelerator_flag": flags.accelerator, "devices": flags.devices,
        "strategy_flag": flags.strategy, "precision_flag": flags.precision,
        "num_nodes": flags.num_nodes, "strategy_instance": flags.strategy_instance,
        "cluster_plugin": plugins.cluster_environment, "precision_plugin": plugins.precision,
        "checkpoint_io_plugin": plugins.checkpoint_io,
    }
    return written_seeds(flags.written, facts)
