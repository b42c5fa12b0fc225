"""Precision plugins: how a strategy casts modules, inputs and outputs, and steps.

``precision_for`` builds the plugin for a canonical precision name. Nothing here
imports ``transformer_engine`` until a Transformer Engine plugin is created.
"""

from __future__ import annotations

from interlock.connector.tables import ACCELERATOR_NAMES, PRECISION_NAMES, PRECISION_ROWS
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


def precision_for(name: str, device_type: str) -> Precision:
    """The plugin for a canonical precision name on a device type.

    Args:
        name: a canonical name from ``PRECISION_NAMES`` (the Plan's ``precision``).
        device_type: the accelerator's torch device type (``"cpu"``, ``"cuda"``, ...).

    Raises:
        ValueError: for a name or device type that is not canonical.
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
