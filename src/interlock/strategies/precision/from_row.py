"""`plugin_from_row`: a precision's own plugin, built from its registered row.

Every precision plugin is built here from its row's ``factory``, built-in or
registered; a strategy family with a plugin of its own (FSDP's) wraps the one this
returns, so a registered precision reaches it unchanged.
"""

from __future__ import annotations

from interlock.connector.registry import registered
from interlock.connector.tables import PrecisionRow
from interlock.strategies.factories import load_part
from interlock.strategies.precision.base import Precision


def plugin_from_row(name: str, device_type: str) -> Precision:
    """The plugin the row of precision ``name`` names, for ``device_type``.

    Raises:
        ValueError: ``name`` is not a registered precision.
        TypeError: the row's factory is not a `Precision` subclass.
        ImportError: the factory cannot be imported (naming what to install).
    """
    row = registered(PrecisionRow).get(name)
    if row is None:
        raise ValueError(
            f"precision {name!r}: expected a canonical precision, one of "
            f"{', '.join(map(repr, registered(PrecisionRow)))}"
        )
    cls = load_part("precision", name, row.factory, row.requires)
    if not (isinstance(cls, type) and issubclass(cls, Precision)):
        raise TypeError(
            f"precision {name!r}: its factory {row.factory} is not a subclass of "
            "interlock.strategies.precision.Precision"
        )
    return cls.for_precision(name, device_type)
