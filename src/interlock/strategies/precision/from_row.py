"""`plugin_from_row`: a precision's own plugin, built from its registered row.

Every precision plugin is built here from its row's ``factory``, built-in or
registered; a strategy family with a plugin of its own (FSDP's) wraps the one this
returns, so a registered precision reaches it unchanged.
"""

from __future__ import annotations

from interlock.engine.tables import PrecisionRow
from interlock.strategies.factories import part_class
from interlock.strategies.precision.base import Precision


def plugin_from_row(name: str | PrecisionRow, device_type: str) -> Precision:
    """The plugin a precision's row (or a registered row's name) names, for
    ``device_type``.

    Raises:
        ValueError: ``name`` is not a registered precision.
        TypeError: the row's factory is not a `Precision` subclass.
        ImportError: the factory cannot be imported (naming what to install).
    """
    row, cls = part_class(PrecisionRow, name, Precision)
    return cls.for_precision(row.name, device_type)
