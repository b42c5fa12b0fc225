"""The ``devices`` flag: ``"auto"``, ``-1``, a count, or device indices (a list, or a
string of them), each bounded by what a node can hold."""

import functools
from collections.abc import Sequence

from interlock.engine.limits import MAX_DEVICES_PER_NODE, MAX_DEVICES_TEXT, short_repr
from interlock.engine.rules import Decision, DevicesRequest, Rule, always, refuse
from interlock.engine.stages.flags.draft import FlagsDraft, is_int, norm

#: Decimal digits of the bound on devices per node: a digit string with more
#: significant digits than this is beyond the bound without being read.
_MAX_DIGITS = len(str(MAX_DEVICES_PER_NODE))


def number(text: str) -> int | None:
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
    return tuple((p, number(p)) for p in parts)


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
    if not all(is_int(v) and v >= 0 for v in value):
        return None
    ids = tuple(int(v) for v in value)
    return ids if len(set(ids)) == len(ids) else None


def _digit_count(value: object) -> int | None:
    count = number(value) if isinstance(value, str) else None
    return count if count else None


def _beyond_limit(value: object) -> str | None:
    """Why the devices value is beyond the bound on devices per node, or None.

    Decided from sizes before anything is enumerated: a string's commas are counted
    and a list's length is read before any item is looked at.
    """
    bound = MAX_DEVICES_PER_NODE
    where = "interlock.engine.limits.MAX_DEVICES_PER_NODE"
    if isinstance(value, str) and len(value) > MAX_DEVICES_TEXT:
        return (f"the string has {len(value)} characters; no devices value within the "
                f"bound of {bound} devices per node ({where}) is longer than "
                f"{MAX_DEVICES_TEXT}.")
    count: int | None = None
    if is_int(value):
        count = value  # type: ignore[assignment]
    elif isinstance(value, str):
        count = number(value)
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
        if is_int(read) and read >= bound:  # type: ignore[operator]
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
    if is_int(value):
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
        if not all(is_int(v) for v in value):
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
            "`interlock.engine.limits`), an id list longer than that, an id at or "
            f"above it, or a string longer than {MAX_DEVICES_TEXT} characters; decided "
            "from lengths and digit counts before anything is converted or enumerated.",
            when=lambda c: _beyond_limit(c.devices_flag) is not None,
            then=_refuse_beyond_limit,
            refuses="invalid-devices",
        ),
        Rule(
            id="flags/devices-auto",
            doc="'auto' (case-insensitive).",
            when=lambda c: norm(c.devices_flag) == "auto",
            then=_devices_auto,
        ),
        Rule(
            id="flags/devices-all",
            doc="-1 or '-1': every device of the accelerator.",
            when=lambda c: (is_int(c.devices_flag) and c.devices_flag == -1)
            or norm(c.devices_flag) == "-1",
            then=_devices_all,
        ),
        Rule(
            id="flags/devices-count",
            doc="An int > 0 (bools excluded) or a digit string like '2'.",
            when=lambda c: (is_int(c.devices_flag) and c.devices_flag > 0)  # type: ignore[operator]
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
