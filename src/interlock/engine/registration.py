"""How the registry (:mod:`interlock.engine.registry`) refuses a row and loads an
entry point, all or none.

Every kind's entry point group loads the same way: an entry point's object is a row, a
list or tuple of rows, or a callable taking no arguments that returns either; a broken
entry point is recorded with the reason and warned about once, never silently dropped.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

#: ``"package.module:attribute"``, the form of every row's ``factory``.
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: Names of strategies, accelerators, cluster environments and launchers.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

#: The strategy entry point group (the default of `EntryPointStatus.group`).
STRATEGY_GROUP = "interlock.strategies"


class RegistrationError(ValueError):
    """A row (a strategy spec, a precision, an accelerator, ...) that cannot be
    registered, and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EntryPointStatus:
    """What became of one entry point of an ``interlock.*`` group.

    Attributes:
        name: the entry point's name.
        value: what it points at, ``"module:attribute"``.
        distribution: the installed package that declares it, when known.
        strategies: the names it registered (strategy names for
            ``interlock.strategies``, row names for the part groups); for a broken
            entry point, the names it is known to stand for (its own name, and the
            names of the rows it returned before registration failed).
        error: why it failed to load, or None when it loaded.
        group: the entry point group it belongs to.
    """

    name: str
    value: str
    distribution: str | None
    strategies: tuple[str, ...]
    error: str | None = None
    group: str = STRATEGY_GROUP

    @property
    def broken(self) -> bool:
        return self.error is not None

    @property
    def names(self) -> tuple[str, ...]:
        """The row names it registered or stands for (``strategies``, by any group)."""
        return self.strategies

    def describe(self) -> str:
        """``entry point 'name' (module:attribute) of package``, for messages."""
        where = f" of {self.distribution}" if self.distribution else ""
        return f"entry point {self.name!r} ({self.value}){where}"


def scan_entry_points(groups: Sequence[str]) -> dict[str, tuple[EntryPoint, ...]]:
    """The installed entry points of each group, from one scan of the installed
    packages (a scan costs milliseconds; the first `plan()` of a process pays it)."""
    from importlib import metadata

    select = metadata.entry_points().select
    return {group: tuple(select(group=group)) for group in groups}


def load_entry_point(
    ep: EntryPoint,
    *,
    group: str,
    noun: str,
    add: Callable[[list[object], str], None],
) -> EntryPointStatus:
    """Load one entry point and register its rows through ``add``, all or none.

    Never raises for the plugin's faults: a failure to import it, an exception from
    its callable, a malformed row or a name clash comes back as a broken status and is
    warned about (once: each group is loaded once per process).

    Args:
        ep: the entry point.
        group: its group, recorded in the status.
        noun: what its rows are, plural, for the warning (``"precisions"``).
        add: registers the rows, all or none, raising `RegistrationError` with every
            problem otherwise; called with the rows and the entry point's description.
    """
    dist = getattr(ep, "dist", None)
    distribution = getattr(dist, "name", None)
    source = EntryPointStatus(name=ep.name, value=ep.value, distribution=distribution,
                              strategies=(), group=group).describe()
    names: list[str] = []
    try:
        loaded = ep.load()
        result = loaded() if callable(loaded) else loaded
        found = list(result) if isinstance(result, (list, tuple)) else [result]
        names = [n for n in (getattr(r, "name", None) for r in found) if isinstance(n, str)]
        add(found, source)
    except Exception as exc:
        error = str(exc) if isinstance(exc, RegistrationError) else repr(exc)
        warnings.warn(
            f"interlock: {source} failed to load, so the {noun} it provides are "
            f"unavailable (other {noun} are not affected): {error}",
            RuntimeWarning, stacklevel=3,
        )
        return EntryPointStatus(name=ep.name, value=ep.value, distribution=distribution,
                                strategies=tuple(dict.fromkeys((ep.name, *names))),
                                error=error, group=group)
    return EntryPointStatus(name=ep.name, value=ep.value, distribution=distribution,
                            strategies=tuple(names), group=group)


def suspects(broken: Sequence[EntryPointStatus]) -> str:
    """`` (the entry point ... failed to load and may provide it: <error>)`` for each
    broken entry point of the group a missing name would come from; empty when none
    is, so that a refusal of an unknown name points at the plugin that may explain it."""
    if not broken:
        return ""
    return " (" + "; ".join(f"the {ep.describe()} failed to load and may provide it: "
                            f"{ep.error}" for ep in broken) + ")"
