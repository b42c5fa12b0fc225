"""The flag space the matrix covers."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.connector.registry import strategy_specs
from interlock.connector.tables import ACCELERATOR_INPUTS, LEGACY_PRECISIONS, PRECISION_NAMES


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagSpace:
    """Values of each flag; the matrix is their product on every profile."""

    accelerators: tuple[str, ...]
    devices: tuple[object, ...]
    precisions: tuple[str | int, ...]
    num_nodes: tuple[int, ...]

    def strategies(self) -> tuple[str, ...]:
        """'auto' and every registered strategy (built-in and third-party), sorted."""
        return ("auto", *sorted(strategy_specs()))

    def size(self) -> int:
        return (len(self.accelerators) * len(self.devices) * len(self.strategies())
                * len(self.precisions) * len(self.num_nodes))


FLAG_SPACE = FlagSpace(
    accelerators=ACCELERATOR_INPUTS,
    devices=("auto", 1, 2, 4, 8, -1, "0,1", [1], 0, "[]"),
    precisions=(*PRECISION_NAMES, *LEGACY_PRECISIONS),
    num_nodes=(1, 2),
)
