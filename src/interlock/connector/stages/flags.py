"""Stage 1, flags: parse every flag into a typed value, or refuse it.

`read_flags` is the stage: the flags as written in, a frozen `Flags` out. Each flag's
own decision also runs alone through `read_flag`, which is how the matrix parses each
distinct value of a flag once.
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, NamedTuple

from interlock.connector.deprecation import warn_deprecated
from interlock.connector.errors import did_you_mean
from interlock.connector.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_DEVICES_TEXT,
    MAX_NUM_NODES,
    short_repr,
)
from interlock.connector.part_tables import PartTables
from interlock.connector.registration import EntryPointStatus, suspects
from interlock.connector.rules import (
    Decision,
    DevicesRequest,
    Draft,
    Plugins,
    Rule,
    Stage,
    Written,
    always,
    refuse,
    run_decision,
    run_stage,
)
from interlock.connector.specs import StrategySpec
from interlock.connector.tables import (
    ACCELERATOR_ALIASES,
    ACCELERATOR_CHOOSERS,
    DEFAULT_PRECISION,
    LEGACY_PRECISIONS,
    WITHDRAWN_ROWS,
)
from interlock.connector.trace import TraceStep

_AUTO = DevicesRequest(kind="auto")
_NO_PLUGINS = Plugins()


@dataclass(slots=True, kw_only=True)
class FlagsDraft(Draft):
    """The flags stage's draft: the flags as written and the registries (read), and
    each flag's typed value (decided)."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({
        "accelerator_input", "accelerator_instance", "strategy_instance", "devices",
        "strategy_input", "explicit_spec", "precision_input", "num_nodes", "plugins",
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
    explicit_spec: StrategySpec | None = None
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
        explicit_spec: the row of the strategy asked for; None for ``"auto"``.
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
    explicit_spec: StrategySpec | None
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


def _norm(value: object) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- accelerator


def _set_accelerator(ctx: FlagsDraft) -> str:
    ctx.accelerator_input = _norm(ctx.accelerator_flag) or ""
    return f"accelerator={ctx.accelerator_flag!r} is a known accelerator input"


def _set_accelerator_alias(ctx: FlagsDraft) -> str:
    name = _norm(ctx.accelerator_flag) or ""
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


def _broken_among(broken: Sequence[EntryPointStatus],
                  value: object) -> EntryPointStatus | None:
    """The broken entry point among ``broken`` that stands for the name ``value``."""
    name = _norm(value)
    return next((ep for ep in broken if name in ep.names), None)


def _broken_part(ctx: FlagsDraft, kind: str, value: object) -> EntryPointStatus | None:
    """The broken entry point of a part group that stands for the name ``value``."""
    return _broken_among(ctx.parts.broken[kind], value)


def _refuse_broken(broken: Sequence[EntryPointStatus], kind: str, flag: str, value: object,
                   choices: Sequence[str]) -> str:
    """The ``broken-entry-point`` refusal of a strategy or part name."""
    ep = _broken_among(broken, value)
    refuse(
        "broken-entry-point",
        flag=flag,
        value=value,
        reason=f"this name belongs to the {ep.describe() if ep else 'entry point'}, which "
        f"failed to load ({ep.error if ep else '?'}); fix or uninstall that package (the "
        f"other {kind} are unaffected).",
        choices=choices,
    )


def _instance_name(obj: object) -> str | None:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) else None


def _set_accelerator_instance(ctx: FlagsDraft) -> str:
    ctx.accelerator_instance = ctx.accelerator_flag
    ctx.accelerator_input = _instance_name(ctx.accelerator_flag) or ""
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
            and _instance_name(c.accelerator_flag) in c.parts.accelerators,
            then=_set_accelerator_instance,
        ),
        Rule(
            id="flags/accelerator-name",
            doc="A canonical accelerator name, 'auto' or 'gpu'.",
            when=lambda c: _norm(c.accelerator_flag) in c.parts.accelerators
            or _norm(c.accelerator_flag) in ACCELERATOR_CHOOSERS,
            then=_set_accelerator,
        ),
        Rule(
            id="flags/accelerator-alias",
            doc="An alias ('tpu' means 'xla'); recorded in notes.",
            when=lambda c: _norm(c.accelerator_flag) in ACCELERATOR_ALIASES,
            then=_set_accelerator_alias,
        ),
        Rule(
            id="flags/accelerator-broken-entry-point",
            doc="A name an `interlock.accelerators` entry point stands for (its own name, "
            "or a row name it returned) when that entry point failed to load: refused "
            "with the entry point's error, like a strategy's.",
            when=lambda c: _broken_part(c, "accelerators", c.accelerator_flag) is not None,
            then=lambda c: _refuse_broken(c.parts.broken["accelerators"], "accelerators",
                                          "accelerator", c.accelerator_flag,
                                          c.parts.accelerator_inputs),
            refuses="broken-entry-point",
        ),
        Rule(
            id="flags/accelerator-unknown",
            doc="Anything else.",
            when=always,
            then=_refuse_accelerator,
            refuses="unknown-accelerator",
        ),
    ),
)

# --------------------------------------------------------------------------- strategy


def _set_strategy_auto(ctx: FlagsDraft) -> str:
    ctx.strategy_input = "auto"
    return "strategy='auto': chosen after the accelerator and devices are known"


def _set_strategy_name(ctx: FlagsDraft) -> str:
    name = _norm(ctx.strategy_flag) or ""
    ctx.strategy_input = name
    ctx.explicit_spec = ctx.specs[name]
    return f"strategy={ctx.strategy_flag!r} is registered ({ctx.explicit_spec.factory})"


def _refuse_withdrawn(ctx: FlagsDraft) -> str:
    row = WITHDRAWN_ROWS[_norm(ctx.strategy_flag) or ""]
    refuse(
        "unknown-strategy",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"{row.name!r} is not offered: {row.reason}.",
        choices=(row.replacement,),
    )


def _broken_entry_point(ctx: FlagsDraft) -> EntryPointStatus | None:
    return _broken_among(ctx.broken_entry_points, ctx.strategy_flag)


def _registered_names(ctx: FlagsDraft) -> tuple[str, ...]:
    return tuple(sorted(n for n, s in ctx.specs.items() if s.variant_of is None))


def _refuse_broken_entry_point(ctx: FlagsDraft) -> str:
    return _refuse_broken(ctx.broken_entry_points, "strategies", "strategy",
                          ctx.strategy_flag, ("auto", *_registered_names(ctx)))


def _refuse_strategy(ctx: FlagsDraft) -> str:
    value = ctx.strategy_flag
    names = ("auto", *_registered_names(ctx))
    kind = "no strategy is registered under this name" if isinstance(value, str) else (
        f"must be a strategy name, got {type(value).__name__}"
    )
    if isinstance(value, str) and ctx.broken_entry_points:
        kind += " (" + "; ".join(
            f"the {ep.describe()} failed to load and may be the one that provides it"
            for ep in ctx.broken_entry_points
        ) + ")"
    refuse(
        "unknown-strategy",
        flag="strategy",
        value=value,
        reason=f"{kind}.",
        choices=names,
        suggestion=did_you_mean(value, ("auto", *ctx.specs)),
    )


def _set_strategy_instance(ctx: FlagsDraft) -> str:
    name = _instance_name(ctx.strategy_flag) or ""
    ctx.strategy_instance = ctx.strategy_flag
    ctx.strategy_input = name
    ctx.explicit_spec = ctx.specs[name]
    return f"a strategy instance ({type(ctx.strategy_flag).__name__}, registered as {name!r})"


def _refuse_strategy_instance(ctx: FlagsDraft) -> str:
    name = _instance_name(ctx.strategy_flag)
    refuse(
        "unknown-strategy",
        flag="strategy",
        value=ctx.strategy_flag,
        reason=f"the instance's name {name!r} is not a registered strategy; register a "
        "StrategySpec for its class first.",
        choices=tuple(sorted(n for n, s in ctx.specs.items() if s.variant_of is None)),
    )


STRATEGY_FLAG = Decision(
    id="flags/strategy",
    doc="Look the strategy name up in the registry (case-insensitive), or take a Strategy "
    "instance.",
    rules=(
        Rule(
            id="flags/strategy-instance",
            doc="A Strategy instance: its registry row decides like a name would, and the "
            "parts it was given are used as given.",
            when=lambda c: part_kind(c.strategy_flag) == "strategy"
            and _instance_name(c.strategy_flag) in c.specs,
            then=_set_strategy_instance,
        ),
        Rule(
            id="flags/strategy-instance-unregistered",
            doc="A Strategy instance whose name is not registered.",
            when=lambda c: part_kind(c.strategy_flag) == "strategy",
            then=_refuse_strategy_instance,
            refuses="unknown-strategy",
        ),
        Rule(
            id="flags/strategy-auto",
            doc="'auto' defers the choice to the strategy stage.",
            when=lambda c: _norm(c.strategy_flag) == "auto",
            then=_set_strategy_auto,
        ),
        Rule(
            id="flags/strategy-name",
            doc="A registered strategy name (built-in or third-party).",
            when=lambda c: _norm(c.strategy_flag) in c.specs,
            then=_set_strategy_name,
        ),
        Rule(
            id="flags/strategy-withdrawn",
            doc="A name other tools accept but interlock withdraws on purpose "
            "(for example 'dp'); the replacement is the only choice.",
            when=lambda c: _norm(c.strategy_flag) in WITHDRAWN_ROWS,
            then=_refuse_withdrawn,
            refuses="unknown-strategy",
        ),
        Rule(
            id="flags/strategy-broken-entry-point",
            doc="A name that a third-party entry point stands for (the entry point's own "
            "name, or a spec name it returned) when that entry point failed to load: "
            "refused with the entry point's error; every other name still resolves.",
            when=lambda c: _broken_entry_point(c) is not None,
            then=_refuse_broken_entry_point,
            refuses="broken-entry-point",
        ),
        Rule(
            id="flags/strategy-unknown",
            doc="Anything else.",
            when=always,
            then=_refuse_strategy,
            refuses="unknown-strategy",
        ),
    ),
)

# --------------------------------------------------------------------------- precision


def _legacy_key(value: object) -> int | str | None:
    if _is_int(value):
        return value  # type: ignore[return-value]
    return _norm(value)


def _set_precision(ctx: FlagsDraft) -> str:
    ctx.precision_input = _norm(ctx.precision_flag) or ""
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
            when=lambda c: _norm(c.precision_flag) in c.parts.precisions,
            then=_set_precision,
        ),
        Rule(
            id="flags/precision-legacy",
            doc="A legacy alias (int or str, never float or bool); recorded in notes.",
            when=lambda c: _legacy_key(c.precision_flag) in LEGACY_PRECISIONS,
            then=_set_precision_legacy,
        ),
        Rule(
            id="flags/precision-broken-entry-point",
            doc="A name an `interlock.precisions` entry point stands for when that entry "
            "point failed to load: refused with the entry point's error.",
            when=lambda c: _broken_part(c, "precisions", c.precision_flag) is not None,
            then=lambda c: _refuse_broken(c.parts.broken["precisions"], "precisions",
                                          "precision", c.precision_flag,
                                          c.parts.precision_names),
            refuses="broken-entry-point",
        ),
        Rule(
            id="flags/precision-unknown",
            doc="Anything else.",
            when=always,
            then=_refuse_precision,
            refuses="unknown-precision",
        ),
    ),
)

# --------------------------------------------------------------------------- devices


#: Decimal digits of the bound on devices per node: a digit string with more
#: significant digits than this is beyond the bound without being read.
_MAX_DIGITS = len(str(MAX_DEVICES_PER_NODE))


def _number(text: str) -> int | None:
    """The value of an ASCII digit string (surrounding spaces allowed), or None.

    A string with more significant digits than any device count or id can have is
    read as one past the bound, without converting it: Python refuses ints past
    4,300 digits, and the rule that refuses counts beyond the bound runs first.
    """
    text = text.strip()
    # isascii(): str.isdigit() also accepts superscripts and other scripts' digits
    if not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0")
    if len(significant) > _MAX_DIGITS:
        return MAX_DEVICES_PER_NODE + 1
    return int(significant or "0")


@functools.lru_cache(maxsize=8)
def _id_items(text: str) -> tuple[tuple[str, int | None], ...] | None:
    """The items of "0,1" or "1," (a trailing comma ends the list), each as written and
    as read (None when not a number), or None when the string is no comma list or
    has more items than a node can have devices. Cached: three rules read the same
    string, and an id list may be thousands of items long."""
    if "," not in text or text.count(",") > MAX_DEVICES_PER_NODE:
        return None
    parts = [p.strip() for p in text.split(",")]
    if parts[-1] == "":
        parts.pop()
    return tuple((p, _number(p)) for p in parts)


def _id_string(value: object) -> tuple[int, ...] | None:
    """Parse "0,1" or "1," into ids; None when the string is not such a list."""
    items = _id_items(value) if isinstance(value, str) else None
    if not items or any(n is None for _, n in items):
        return None
    ids = tuple(n for _, n in items if n is not None)
    return ids if len(set(ids)) == len(ids) else None


def _id_sequence(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_DEVICES_PER_NODE:
        return None
    if not all(_is_int(v) and v >= 0 for v in value):
        return None
    ids = tuple(int(v) for v in value)
    return ids if len(set(ids)) == len(ids) else None


def _digit_count(value: object) -> int | None:
    count = _number(value) if isinstance(value, str) else None
    return count if count else None


def _beyond_limit(value: object) -> str | None:
    """Why the devices value is beyond the bound on devices per node, or None.

    Decided from sizes before anything is enumerated: a string's commas are counted
    and a list's length is read before any item is looked at.
    """
    bound = MAX_DEVICES_PER_NODE
    where = "interlock.connector.limits.MAX_DEVICES_PER_NODE"
    if isinstance(value, str) and len(value) > MAX_DEVICES_TEXT:
        return (f"the string has {len(value)} characters; no devices value within the "
                f"bound of {bound} devices per node ({where}) is longer than "
                f"{MAX_DEVICES_TEXT}.")
    count: int | None = None
    if _is_int(value):
        count = value  # type: ignore[assignment]
    elif isinstance(value, str):
        count = _number(value)
    if count is not None and count > bound:
        return (f"{short_repr(value)} devices per node is beyond the bound of {bound} "
                f"({where}); no node has that many devices or CPU cores.")
    pairs: Sequence[tuple[object, object]] = ()  # (id as written, id as read)
    items = -1
    if isinstance(value, str) and "," in value:
        text = value.strip()
        items = text.count(",") + (0 if text.endswith(",") else 1)
        pairs = _id_items(value) or ()
    elif isinstance(value, (list, tuple)):
        items = len(value)
        pairs = [(v, v) for v in value] if items <= bound else ()
    if items > bound:
        return (f"the id list has {items} items, beyond the bound of {bound} devices per "
                f"node ({where}).")
    for written, read in pairs:
        if _is_int(read) and read >= bound:  # type: ignore[operator]
            return (f"device id {short_repr(written)} is beyond the highest id a node can "
                    f"have ({bound - 1}; {where}).")
    return None


def _set_devices(request: DevicesRequest) -> str:
    return f"devices parsed as {request.describe()}"


def _devices_auto(ctx: FlagsDraft) -> str:
    ctx.devices = DevicesRequest(kind="auto")
    return "devices='auto': the count follows from the accelerator"


def _devices_all(ctx: FlagsDraft) -> str:
    ctx.devices = DevicesRequest(kind="all")
    return f"devices={ctx.devices_flag!r} means every device"


def _devices_count(ctx: FlagsDraft) -> str:
    value = ctx.devices_flag
    count = value if isinstance(value, int) else _digit_count(value)
    ctx.devices = DevicesRequest(kind="count", count=int(count or 0))
    return _set_devices(ctx.devices)


def _devices_ids(ctx: FlagsDraft) -> str:
    ids = _id_string(ctx.devices_flag) or _id_sequence(ctx.devices_flag) or ()
    ctx.devices = DevicesRequest(kind="ids", ids=ids)
    return _set_devices(ctx.devices)


DEVICES_FORMS: tuple[str, ...] = (
    "'auto'",
    "an int > 0 (how many)",
    "-1 or '-1' (all)",
    "a digit string like '2'",
    "an id list like '0,1', '1,' or [0, 1]",
)


def _devices_problem(value: object) -> str:
    if isinstance(value, bool):
        return "a bool is not a device count."
    if isinstance(value, float):
        return "a float is not a device count; pass an int."
    if _is_int(value):
        return "0 devices cannot run anything." if value == 0 else (
            "negative counts other than -1 (all devices) mean nothing."
        )
    if isinstance(value, str):
        text = value.strip()
        if text in ("0", ""):
            return "0 devices cannot run anything." if text == "0" else "the string is empty."
        if "," in text:
            parts = [p.strip() for p in text.rstrip(",").split(",")]
            if len(set(parts)) != len(parts):
                return "the id list repeats a device."
        return "the string is neither 'auto', a count, '-1', nor a comma-separated id list."
    if isinstance(value, (list, tuple)):
        if not value:
            return "an empty list selects no device."
        if not all(_is_int(v) for v in value):
            return "device ids must be ints."
        if any(v < 0 for v in value):
            return "device ids cannot be negative."
        return "the id list repeats a device."
    return f"a {type(value).__name__} is not a devices value."


def _refuse_devices(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=_devices_problem(ctx.devices_flag) + " Accepted forms: "
        + ", ".join(DEVICES_FORMS) + ".",
    )


def _refuse_beyond_limit(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=_beyond_limit(ctx.devices_flag) or "",
        choices=("auto", "1"),
    )


DEVICES_FLAG = Decision(
    id="flags/devices",
    doc="Parse the devices flag into auto, all, a count or a list of ids.",
    rules=(
        Rule(
            id="flags/devices-beyond-limit",
            doc=f"A count above {MAX_DEVICES_PER_NODE} (the bound on devices per node, "
            "`interlock.connector.limits`), an id list longer than that, an id at or "
            f"above it, or a string longer than {MAX_DEVICES_TEXT} characters; decided "
            "from lengths and digit counts before anything is converted or enumerated.",
            when=lambda c: _beyond_limit(c.devices_flag) is not None,
            then=_refuse_beyond_limit,
            refuses="invalid-devices",
        ),
        Rule(
            id="flags/devices-auto",
            doc="'auto' (case-insensitive).",
            when=lambda c: _norm(c.devices_flag) == "auto",
            then=_devices_auto,
        ),
        Rule(
            id="flags/devices-all",
            doc="-1 or '-1': every device of the accelerator.",
            when=lambda c: (_is_int(c.devices_flag) and c.devices_flag == -1)
            or _norm(c.devices_flag) == "-1",
            then=_devices_all,
        ),
        Rule(
            id="flags/devices-count",
            doc="An int > 0 (bools excluded) or a digit string like '2'.",
            when=lambda c: (_is_int(c.devices_flag) and c.devices_flag > 0)  # type: ignore[operator]
            or _digit_count(c.devices_flag) is not None,
            then=_devices_count,
        ),
        Rule(
            id="flags/devices-ids",
            doc="'0,1' or '1,' (a trailing comma makes one id), or a non-empty list or "
            "tuple of distinct ints >= 0.",
            when=lambda c: _id_string(c.devices_flag) is not None
            or _id_sequence(c.devices_flag) is not None,
            then=_devices_ids,
        ),
        Rule(
            id="flags/devices-invalid",
            doc="Anything else: 0, '0', [], '[]', bools, floats, other negatives, "
            "duplicate ids, unparsable strings.",
            when=always,
            then=_refuse_devices,
            refuses="invalid-devices",
        ),
    ),
)

# --------------------------------------------------------------------------- num_nodes


def _set_num_nodes(ctx: FlagsDraft) -> str:
    ctx.num_nodes = int(ctx.num_nodes_flag)  # type: ignore[call-overload]
    return f"num_nodes={ctx.num_nodes}"


def _refuse_num_nodes(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-num-nodes",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason="num_nodes must be an int >= 1 (not a bool, float or string); got "
        + (f"{ctx.num_nodes_flag}." if _is_int(ctx.num_nodes_flag)
           else f"a {type(ctx.num_nodes_flag).__name__}."),
        choices=("1", "2"),
    )


def _nodes_beyond_limit(ctx: FlagsDraft) -> bool:
    value = ctx.num_nodes_flag
    return _is_int(value) and value > MAX_NUM_NODES  # type: ignore[operator]


def _refuse_nodes_beyond_limit(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-num-nodes",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{short_repr(ctx.num_nodes_flag)} nodes is beyond the bound of "
        f"{MAX_NUM_NODES} (interlock.connector.limits.MAX_NUM_NODES); no machine has that "
        "many nodes.",
        choices=("1", "2"),
    )


NUM_NODES_FLAG = Decision(
    id="flags/num_nodes",
    doc=f"num_nodes must be an int from 1 to {MAX_NUM_NODES}.",
    rules=(
        Rule(
            id="flags/num-nodes-beyond-limit",
            doc=f"An int above {MAX_NUM_NODES}, the bound on nodes "
            "(`interlock.connector.limits`).",
            when=_nodes_beyond_limit,
            then=_refuse_nodes_beyond_limit,
            refuses="invalid-num-nodes",
        ),
        Rule(
            id="flags/num-nodes-int",
            doc="An int >= 1 (bools excluded).",
            when=lambda c: _is_int(c.num_nodes_flag) and c.num_nodes_flag >= 1,  # type: ignore[operator]
            then=_set_num_nodes,
        ),
        Rule(
            id="flags/num-nodes-invalid",
            doc="Anything else.",
            when=always,
            then=_refuse_num_nodes,
            refuses="invalid-num-nodes",
        ),
    ),
)

# --------------------------------------------------------------------------- plugins


def plugin_kind(obj: object) -> str | None:
    """The kind a plugin object declares (``interlock_part_kind``, as every part), or
    None if it declares none we know. A class that declares only the marker's former
    name, ``interlock_plugin_kind``, is still read, with a deprecation warning."""
    kind = part_kind(obj)
    if kind is None:
        kind = getattr(type(obj), "interlock_plugin_kind", None)
        if kind in PLUGIN_KINDS:
            warn_deprecated(f"the class attribute interlock_plugin_kind (declared by "
                            f"{type(obj).__qualname__})", replacement="interlock_part_kind",
                            since="0.2.0")
    return kind if kind in PLUGIN_KINDS else None


def _plugin_list(value: object) -> list[object] | None:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return None
    if isinstance(value, Sequence):
        return list(value)
    return [value]


def _sorted_plugins(ctx: FlagsDraft) -> Plugins | str:
    """The plugins sorted by kind, or why the plugins flag is unusable."""
    items = _plugin_list(ctx.plugins_flag)
    if items is None:
        return "a string is not a plugin; pass precision='...' for a precision, or a plugin object"
    by_kind: dict[str, object] = {}
    for obj in items:
        kind = plugin_kind(obj)
        if kind is None:
            return (f"{obj!r} is not a precision, checkpoint IO or cluster environment plugin "
                    "(its class declares no interlock_part_kind)")
        if kind in by_kind:
            return f"two {kind.replace('_', ' ')} plugins were given; pass one"
        if kind == "precision" and (
            getattr(obj, "precision", None) not in ctx.parts.precisions
        ):
            return (f"precision plugin {obj!r} declares precision "
                    f"{getattr(obj, 'precision', None)!r}, which is not a canonical precision")
        if kind == "cluster_environment" and not (
            isinstance(getattr(obj, "name", None), str)
            and isinstance(getattr(obj, "creates_processes_externally", None), bool)
        ):
            return (f"cluster environment plugin {obj!r} must have a str 'name' and a bool "
                    "'creates_processes_externally'")
        by_kind[kind] = obj
    return Plugins(**by_kind)


def _set_plugins(ctx: FlagsDraft) -> str:
    sorted_plugins = _sorted_plugins(ctx)
    if not isinstance(sorted_plugins, Plugins):
        raise RuntimeError("internal error: plugins sorted after they were refused")
    ctx.plugins = sorted_plugins
    given = sorted_plugins.given()
    if not given:
        return "no plugins"
    return "plugins: " + ", ".join(
        f"{plugin_kind(p)}={type(p).__name__}" for p in given
    )


def _refuse_plugins(ctx: FlagsDraft) -> str:
    refuse(
        "invalid-plugin",
        flag="plugins",
        value=ctx.plugins_flag,
        reason=f"{_sorted_plugins(ctx)}.",
        choices=PLUGIN_KINDS,
    )


PLUGINS_FLAG = Decision(
    id="flags/plugins",
    doc="Sort plugin objects by the kind their class declares: at most one precision, "
    "one checkpoint IO and one cluster environment plugin.",
    rules=(
        Rule(
            id="flags/plugins-sorted",
            doc="Every object declares a known kind, each kind at most once.",
            when=lambda c: c.plugins_flag is None or isinstance(_sorted_plugins(c), Plugins),
            then=_set_plugins,
        ),
        Rule(
            id="flags/plugins-invalid",
            doc="Anything else (strings, unknown objects, duplicates).",
            when=always,
            then=_refuse_plugins,
            refuses="invalid-plugin",
        ),
    ),
)

# --------------------------------------------------------------------------- conflicts


def given_parts(ctx: FlagsDraft) -> dict[str, object]:
    """The parts the user set on a strategy instance (accelerator, precision,
    checkpoint_io, cluster_environment, devices)."""
    getter = getattr(ctx.strategy_instance, "given_parts", None)
    parts = getter() if callable(getter) else {}
    return dict(parts) if isinstance(parts, dict) else {}


def _refuse_precision_conflict(ctx: FlagsDraft) -> str:
    plugin_precision = getattr(ctx.plugins.precision, "precision", None)
    refuse(
        "conflicting-flags",
        flag="precision",
        value=ctx.precision_flag,
        reason=f"a precision plugin ({type(ctx.plugins.precision).__name__}, precision "
        f"{plugin_precision!r}) was also given; one of them would be ignored.",
        choices=(f"precision={DEFAULT_PRECISION!r} with the plugin", "no precision plugin"),
    )


#: part on a strategy instance -> (the flag that sets it too, whether that flag is set)
_INSTANCE_CONFLICTS: dict[str, tuple[str, Callable[[FlagsDraft], bool]]] = {
    "accelerator": ("accelerator", lambda c: _norm(c.accelerator_flag) != "auto"),
    "devices": ("devices", lambda c: _norm(c.devices_flag) != "auto"),
    "precision": ("precision", lambda c: c.precision_input != DEFAULT_PRECISION
                  or c.plugins.precision is not None),
    "checkpoint_io": ("plugins", lambda c: c.plugins.checkpoint_io is not None),
    "cluster_environment": ("plugins", lambda c: c.plugins.cluster_environment is not None),
    "num_nodes": ("num_nodes", lambda c: not (type(c.num_nodes_flag) is int
                                             and c.num_nodes_flag == 1)),
}


def _instance_device_type(ctx: FlagsDraft) -> str | None:
    devices = given_parts(ctx).get("devices")
    if isinstance(devices, tuple) and devices and isinstance(devices[0], str):
        return devices[0].partition(":")[0]
    return None


def _device_type_conflict(ctx: FlagsDraft) -> bool:
    kind = _instance_device_type(ctx)
    return (kind is not None and ctx.accelerator_input in ctx.parts.accelerators
            and kind != ctx.accelerator_input)


def _refuse_device_type(ctx: FlagsDraft) -> str:
    refuse(
        "conflicting-flags",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"the strategy instance ({type(ctx.strategy_instance).__name__}) was given "
        f"{_instance_device_type(ctx)} devices, and the accelerator is "
        f"{ctx.accelerator_input!r}.",
        choices=(f"accelerator={_instance_device_type(ctx)!r}", "no devices on the strategy"),
    )


def _instance_conflict(ctx: FlagsDraft) -> str | None:
    for part in given_parts(ctx):
        if part in _INSTANCE_CONFLICTS and _INSTANCE_CONFLICTS[part][1](ctx):
            return part
    return None


def _refuse_instance_conflict(ctx: FlagsDraft) -> str:
    part = _instance_conflict(ctx) or ""
    flag = _INSTANCE_CONFLICTS[part][0]
    value = {"accelerator": ctx.accelerator_flag, "devices": ctx.devices_flag,
             "precision": ctx.precision_flag, "num_nodes": ctx.num_nodes_flag}.get(
        flag, ctx.plugins_flag)
    refuse(
        "conflicting-flags",
        flag=flag,
        value=value,
        reason=f"the strategy instance ({type(ctx.strategy_instance).__name__}) was given its "
        f"own {part.replace('_', ' ')}, and {flag}= sets it as well; one of them would be "
        "ignored.",
        choices=(f"set the {part.replace('_', ' ')} on the strategy only",
                 f"set it through {flag}= only"),
    )


def _no_conflict(ctx: FlagsDraft) -> str:
    return "no two flags set the same thing"


CONFLICTS = Decision(
    id="flags/conflicts",
    doc="Two flags, or a flag and a strategy instance's own part, must not set the same "
    "thing: the engine refuses rather than let one silently win.",
    rules=(
        Rule(
            id="flags/strategy-instance-conflict",
            doc="A part given to the strategy instance (accelerator, devices, num_nodes, "
            "precision, checkpoint IO, cluster environment) is also set by a flag or plugin.",
            when=lambda c: _instance_conflict(c) is not None,
            then=_refuse_instance_conflict,
            refuses="conflicting-flags",
        ),
        Rule(
            id="flags/strategy-instance-device-type",
            doc="The strategy instance's devices are of another kind than the accelerator "
            "asked for.",
            when=_device_type_conflict,
            then=_refuse_device_type,
            refuses="conflicting-flags",
        ),
        Rule(
            id="flags/precision-and-plugin",
            doc="A precision plugin together with a non-default precision= is refused "
            "rather than one silently winning.",
            when=lambda c: c.plugins.precision is not None
            and c.precision_input != DEFAULT_PRECISION,
            then=_refuse_precision_conflict,
            refuses="conflicting-flags",
        ),
        Rule(id="flags/no-conflict", doc="Otherwise.", when=always, then=_no_conflict),
    ),
)


def _adopt_instance_parts(ctx: FlagsDraft) -> str:
    parts = given_parts(ctx)
    taken = []
    accelerator = parts.get("accelerator")
    if accelerator is not None:
        ctx.accelerator_instance = accelerator
        ctx.accelerator_input = _instance_name(accelerator) or ""
        taken.append(f"accelerator {ctx.accelerator_input!r}")
    kind = _instance_device_type(ctx)
    if kind is not None and accelerator is None and kind in ctx.parts.accelerators:
        ctx.accelerator_input = kind  # the instance's devices say which accelerator
    nodes = parts.get("num_nodes")
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        ctx.num_nodes = nodes
        taken.append(f"num_nodes {nodes}")
    devices = parts.get("devices")
    if isinstance(devices, tuple) and devices:
        indices = [_number(d.partition(":")[2]) if ":" in d else None for d in devices]
        if all(i is not None for i in indices):
            ctx.devices = DevicesRequest(kind="ids", ids=tuple(i or 0 for i in indices))
        else:
            ctx.devices = DevicesRequest(kind="count", count=len(devices))
        taken.append(f"devices {', '.join(devices)}")
    for kind in PLUGIN_KINDS:
        obj = parts.get(kind)
        if obj is not None:
            ctx.plugins = replace(ctx.plugins, **{kind: obj})
            taken.append(f"{kind.replace('_', ' ')} {type(obj).__name__}")
    return "from the strategy instance: " + (", ".join(taken) or "no parts")


INSTANCE_PARTS: Decision[FlagsDraft] = Decision(
    id="flags/strategy-instance-parts",
    doc="The parts a strategy instance was given stand in for the flags they replace, "
    "and are checked by the later stages like flags are.",
    rules=(
        Rule(
            id="flags/adopt-instance-parts",
            doc="Take the instance's accelerator (or its devices' kind), devices, num_nodes, "
            "precision, checkpoint IO and cluster environment.",
            when=lambda c: c.strategy_instance is not None,
            then=_adopt_instance_parts,
        ),
        Rule(id="flags/no-instance", doc="No strategy instance.", when=always,
             then=lambda c: "no strategy instance"),
    ),
)

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
    trace = run_stage(FLAGS_STAGE, draft, parts)
    return Flags(
        written=written,
        accelerator=draft.accelerator_input,
        accelerator_instance=draft.accelerator_instance,
        strategy=draft.strategy_input,
        strategy_instance=draft.strategy_instance,
        explicit_spec=draft.explicit_spec,
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
    return Flags(
        written=Written(**{flag: value}),
        accelerator=draft.accelerator_input,
        accelerator_instance=None,
        strategy=draft.strategy_input,
        strategy_instance=None,
        explicit_spec=draft.explicit_spec,
        devices=draft.devices,
        precision=draft.precision_input,
        num_nodes=draft.num_nodes,
        plugins=draft.plugins,
        notes=tuple(draft.notes),
        trace=tuple(trace),
    )
