"""Precision plugins: how a strategy casts modules, inputs and outputs, and steps.

``precision_for`` builds the plugin for a canonical precision name. Nothing here
imports ``transformer_engine`` until a Transformer Engine plugin is created.
"""

from __future__ import annotations

from interlock.connector.tables import (
    ACCELERATOR_NAMES,
    PRECISION_NAMES,
    PRECISION_ROWS,
    STRATEGY_PRECISION_PLUGINS,
)
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.double import DoublePrecision
from interlock.strategies.precision.half import HalfPrecision
from interlock.strategies.precision.mixed import MixedPrecision
from interlock.strategies.precision.transformer_engine import (
    MissingPackageError,
    TransformerEnginePrecision,
)
from interlock.strategies.precision.true import TruePrecision
from interlock.strategies.precision.utils import apply_to_tensors

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


def precision_for(name: str, device_type: str, plugin: str | None = None) -> Precision:
    """The plugin for a canonical precision name on a device type.

    Args:
        name: a canonical name from ``PRECISION_NAMES`` (the Plan's ``precision``).
        device_type: the accelerator's torch device type (``"cpu"``, ``"cuda"``, ...).
        plugin: a strategy's own plugin family (``StrategySpec.precision_plugin``:
            ``"fsdp"``, ``"deepspeed"``, ``"xla"``); None takes the precision table's.

    Raises:
        ValueError: for a name, device type or plugin family that is not canonical.
        MissingPackageError: for a Transformer Engine precision without the package.
    """
    if device_type not in ACCELERATOR_NAMES:
        raise ValueError(
            f"precision_for(device_type={device_type!r}): expected one of "
            f"{', '.join(map(repr, ACCELERATOR_NAMES))}"
        )
    row = PRECISION_ROWS.get(name)
    if row is None:
        raise ValueError(
            f"precision_for(name={name!r}): expected a canonical precision, one of "
            f"{', '.join(map(repr, PRECISION_NAMES))}"
        )
    if plugin is not None:
        return _strategy_precision(plugin, name, device_type)
    # which plugin family implements a precision is a table fact (PrecisionRow.plugin)
    family = row.plugin
    if family == "true":
        return Precision()
    if family == "double":
        return DoublePrecision()
    if family == "half":
        return HalfPrecision(name)
    if family == "mixed":
        return MixedPrecision(name, device_type)
    if family == "transformer_engine":
        return TransformerEnginePrecision(name)
    raise RuntimeError(f"internal error: no plugin family {family!r} for {name!r}")


def _strategy_precision(plugin: str, name: str, device_type: str) -> Precision:
    # imported here: each family's module is loaded only by the strategies that use it
    if plugin == "fsdp":
        from interlock.strategies.precision.fsdp import FSDPPrecision

        return FSDPPrecision(name, device_type)
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
