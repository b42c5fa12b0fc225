"""The ``plugins`` flag: one part or a list of them, sorted by the kind each declares."""

from collections.abc import Sequence

from interlock.engine.deprecation import warn_deprecated
from interlock.engine.rules import Decision, Plugins, Rule, always, refuse
from interlock.engine.stages.flags.draft import PLUGIN_KINDS, FlagsDraft, part_kind


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
