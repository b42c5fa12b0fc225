"""The flag space the matrix covers."""

from __future__ import annotations

from dataclasses import dataclass, replace

from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.registry import registered
from interlock.engine.specs import StrategySpec
from interlock.engine.tables import ACCELERATOR_INPUTS, LEGACY_PRECISIONS, PRECISIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagSpace:
    """Values of each flag; the matrix is their product on every profile."""

    accelerators: tuple[str, ...]
    devices: tuple[object, ...]
    precisions: tuple[str | int, ...]
    num_nodes: tuple[int, ...]
    #: the strategy names to cover; None covers every registered one
    strategy_names: tuple[str, ...] | None = None

    def strategies(self) -> tuple[str, ...]:
        """'auto' and the strategies covered (by default every registered one, built-in
        and third-party), sorted."""
        names = self.strategy_names if self.strategy_names is not None else registered(StrategySpec)
        return ("auto", *sorted(names))

    def size(self) -> int:
        return (len(self.accelerators) * len(self.devices) * len(self.strategies())
                * len(self.precisions) * len(self.num_nodes))


#: the flag space over the built-in accelerators and precisions (and every registered
#: strategy)
FLAG_SPACE = FlagSpace(
    accelerators=ACCELERATOR_INPUTS,
    devices=("auto", 1, 2, 4, 8, -1, "0,1", [1], 0, "[]"),
    precisions=(*(row.name for row in PRECISIONS), *LEGACY_PRECISIONS),
    num_nodes=(1, 2),
)


#: the space matrix.lock pins: the built-in strategies only, so that a third-party
#: strategy installed in a development environment does not change the lock
BUILTIN_SPACE = replace(FLAG_SPACE, strategy_names=tuple(s.name for s in BUILTIN_STRATEGIES))
