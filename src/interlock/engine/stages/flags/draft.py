"""What the flags stage reads and decides (`FlagsDraft`), what it returns (`Flags`), and
the helpers every flag's decision shares: names normalised, parts told apart by their
class attribute, broken entry points found and refused."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.part_tables import PartTables
from interlock.engine.registration import EntryPointStatus
from interlock.engine.rules import DevicesRequest, Draft, Plugins, Rule, refuse
from interlock.engine.specs import StrategySpec
from interlock.engine.tables import DEFAULT_PRECISION
from interlock.engine.trace import TraceStep
from interlock.engine.written import Written

_AUTO = DevicesRequest(kind="auto")
_NO_PLUGINS = Plugins()


@dataclass(slots=True, kw_only=True)
class FlagsDraft(Draft):
    """The flags stage's draft: the flags as written and the registries (read), and
    each flag's typed value (decided)."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({
        "accelerator_input", "accelerator_instance", "strategy_instance", "devices",
        "strategy_input", "precision_input", "num_nodes", "plugins",
    })

    specs: Mapping[str, StrategySpec]
    parts: PartTables
    broken_entry_points: tuple[EntryPointStatus, ...] = ()
    accelerator_flag: object = "auto"
    devices_flag: object = "auto"
    strategy_flag: object = "auto"
    precision_flag: object = DEFAULT_PRECISION
    num_nodes_flag: object = 1
    plugins_flag: object = None
    # decided
    accelerator_input: str = ""
    accelerator_instance: object | None = None
    strategy_instance: object | None = None
    devices: DevicesRequest = _AUTO
    strategy_input: str = ""
    precision_input: str = ""
    num_nodes: int = 1
    plugins: Plugins = _NO_PLUGINS


class Flags(NamedTuple):
    """The flags stage's result: every flag as a typed value.

    Attributes:
        written: the flags as the caller wrote them (quoted by later refusals).
        accelerator: a canonical accelerator name, ``"auto"`` or ``"gpu"``.
        accelerator_instance: the Accelerator object given, if any.
        strategy: a registered strategy name or ``"auto"``.
        strategy_instance: the Strategy object given, if any.
        devices: the devices request.
        precision: a canonical precision name.
        num_nodes: the node count.
        plugins: the plugin objects by kind (a strategy instance's own parts included).
        notes: what the caller should be told (aliases used).
        trace: the rules applied.
    """

    written: Written
    accelerator: str
    accelerator_instance: object | None
    strategy: str
    strategy_instance: object | None
    devices: DevicesRequest
    precision: str
    num_nodes: int
    plugins: Plugins
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


PLUGIN_KINDS: tuple[str, ...] = ("precision", "checkpoint_io", "cluster_environment")


def part_kind(obj: object) -> str | None:
    """The runtime part an object is (``"accelerator"``, ``"strategy"``), or None.

    The engine never imports the runtime: parts declare themselves with a class
    attribute, as plugins do.
    """
    kind = getattr(type(obj), "interlock_part_kind", None)
    return kind if isinstance(kind, str) else None


def norm(value: object) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def broken_among(broken: Sequence[EntryPointStatus],
                  value: object) -> EntryPointStatus | None:
    """The broken entry point among ``broken`` that stands for the name ``value``."""
    name = norm(value)
    return next((ep for ep in broken if name in ep.names), None)


def broken_part_rule(kind: str, flag: str, doc: str, choices: str) -> Rule[FlagsDraft]:
    """The rule refusing a ``flag`` value that an entry point of the ``kind`` part group
    stands for when that entry point failed to load (``choices``: the `PartTables`
    attribute the refusal offers)."""
    field = f"{flag}_flag"
    return Rule(
        id=f"flags/{flag}-broken-entry-point",
        doc=doc,
        when=lambda c: broken_among(c.parts.broken[kind], getattr(c, field)) is not None,
        then=lambda c: refuse_broken(c.parts.broken[kind], kind, flag, getattr(c, field),
                                      getattr(c.parts, choices)),
        refuses="broken-entry-point",
    )


def refuse_broken(broken: Sequence[EntryPointStatus], kind: str, flag: str, value: object,
                   choices: Sequence[str]) -> str:
    """The ``broken-entry-point`` refusal of a strategy or part name."""
    ep = broken_among(broken, value)
    refuse(
        "broken-entry-point",
        flag=flag,
        value=value,
        reason=f"this name belongs to the {ep.describe() if ep else 'entry point'}, which "
        f"failed to load ({ep.error if ep else '?'}); fix or uninstall that package (the "
        f"other {kind} are unaffected).",
        choices=choices,
    )


def instance_name(obj: object) -> str | None:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) else None
