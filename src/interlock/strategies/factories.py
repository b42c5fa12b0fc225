"""A part from its row: the one way every part kind (precision, accelerator, cluster
environment, launcher, checkpoint IO) loads the ``"package.module:Class"`` its row's
``factory`` names. A strategy built from a plan hands over the plan's rows
(`interlock.Plan.rows`); a name is looked up in the registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from interlock.engine.errors import did_you_mean
from interlock.engine.limits import short_repr
from interlock.engine.registry import kind_of, registered
from interlock.engine.registry import load_reference as load_part


class PartRow(Protocol):
    """What building a part reads of its row."""

    @property
    def name(self) -> str: ...

    @property
    def factory(self) -> str: ...


R = TypeVar("R", bound=PartRow)
T = TypeVar("T")


def row_named(row_type: type[R], name: str) -> R:
    """The row of ``row_type``'s kind named ``name`` (built-in or registered).

    Raises:
        ValueError: no row of that kind has that name (naming a close match and the
            choices).
    """
    rows = registered(row_type)
    row = rows.get(name) if isinstance(name, str) else None
    if row is None:
        noun = kind_of(row_type).noun
        if not isinstance(name, str) and hasattr(name, "factory"):  # another kind's row
            article = "an" if noun[0] in "aeiou" else "a"
            raise ValueError(f"expected {article} {noun} row ({row_type.__name__}) or its "
                             f"name, got {type(name).__name__} "
                             f"{short_repr(getattr(name, 'name', ''))}")
        close = did_you_mean(name, rows)
        hint = f" Did you mean {close!r}?" if close else ""
        raise ValueError(f"unknown {noun} {short_repr(name)}.{hint} "
                         f"Choices: {', '.join(rows)}.")
    return row


def part_class(row_type: type[R], row: R | str, base: Callable[..., T]
               ) -> tuple[R, type[T]]:
    """``row`` (a row of ``row_type``, or the name of a registered one) and the class
    its factory names, a subclass of the class ``base`` (typed as a callable: an
    abstract class is no ``type[T]`` to mypy).

    Raises:
        ValueError: no row of that kind has that name.
        ImportError: the factory cannot be imported (naming what to install).
        TypeError: the factory is not a subclass of ``base``.
    """
    if not isinstance(row, row_type):  # a name (anything else is refused as unknown)
        row = row_named(row_type, cast("str", row))
    noun, name = kind_of(row_type).noun, row.name
    cls: Any = load_part(noun, name, row.factory, getattr(row, "requires", ()))
    if not (isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)):
        raise TypeError(f"{noun} {name!r}: its factory {row.factory} is not a subclass of "
                        f"{base.__module__}.{getattr(base, '__qualname__', base)}")
    return row, cast("type[T]", cls)


__all__ = ["PartRow", "load_part", "part_class", "row_named"]
