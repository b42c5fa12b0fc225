"""Precision plugins: how a strategy casts modules, inputs and outputs, and steps.

``precision_for`` builds the plugin for a canonical precision name. Nothing here
imports ``transformer_engine`` until a Transformer Engine plugin is created.
"""

from __future__ import annotations

from interlock.engine.registry import registered
from interlock.engine.tables import STRATEGY_PRECISION_PLUGINS, AcceleratorRow, PrecisionRow
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.double import DoublePrecision
from interlock.strategies.precision.from_row import plugin_from_row
from interlock.strategies.precision.half import HalfPrecision
from interlock.strategies.precision.mixed import MixedPrecision
from interlock.strategies.precision.transformer_engine import (
    MissingPackageError,
    TransformerEnginePrecision,
)
from interlock.strategies.precision.true import TruePrecision
from interlock.strategies.precision.utils import apply_to_tensors, check_one_of

__all__ = [
    "DoublePrecision",
    "HalfPrecision",
    "MissingPackageError",
    "MixedPrecision",
    "Precision",
    "TransformerEnginePrecision",
    "TruePrecision",
    "apply_to_tensors",
    "precision_for",
]


def precision_for(name: str | PrecisionRow, device_type: str,
                  plugin: str | None = None) -> Precision:
    """The plugin for a precision row (or a registered row's name: the Plan's
    ``precision``) on a device type.

    Args:
        name: the precision's row, or its canonical name.
        device_type: the accelerator's torch device type (``"cpu"``, ``"cuda"``, ...).
        plugin: a strategy's own plugin family (``StrategySpec.precision_plugin``:
            ``"fsdp"``, ``"deepspeed"``, ``"xla"``); None takes the precision table's.

    Raises:
        ValueError: for a name, device type or plugin family that is not canonical.
        MissingPackageError: for a Transformer Engine precision without the package.
    """
    check_one_of("precision_for", "device_type", device_type, registered(AcceleratorRow))
    if not isinstance(name, PrecisionRow):
        check_one_of("precision_for", "name", name, registered(PrecisionRow),
                     "a canonical precision, one of")
    if plugin is not None:
        return _strategy_precision(plugin, name, device_type)
    # the class that implements a precision is its row's factory (built-in or registered)
    return plugin_from_row(name, device_type)


def _strategy_precision(plugin: str, row: str | PrecisionRow, device_type: str
                        ) -> Precision:
    # imported here: each family's module is loaded only by the strategies that use it
    name = row.name if isinstance(row, PrecisionRow) else row
    if plugin == "fsdp":
        from interlock.strategies.precision.fsdp import FSDPPrecision

        return FSDPPrecision(row, device_type)
    if plugin == "deepspeed":
        from interlock.strategies.precision.deepspeed import DeepSpeedPrecision

        return DeepSpeedPrecision(name)
    if plugin == "xla":
        from interlock.strategies.precision.xla import XLAPrecision

        return XLAPrecision(name)
    raise ValueError(
        f"precision_for(plugin={plugin!r}): expected None or one of "
        f"{', '.join(map(repr, STRATEGY_PRECISION_PLUGINS))}"
    )
