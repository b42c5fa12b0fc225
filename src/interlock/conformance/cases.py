"""Which conformance cases apply: strategies x runners x world sizes x precisions x checks.

A case that the runner cannot provide (no CUDA devices, a strategy that does not run on
the runner's accelerator, one device at most) is still listed, with the reason it is
skipped; a declared capability is never skipped.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from interlock.conformance.checks import ANY_PRECISION, CHECKS
from interlock.connector.registry import (
    EntryPointStatus,
    broken_entry_points,
    strategy_specs,
)
from interlock.connector.specs import StrategySpec
from interlock.connector.tables import ACCELERATOR_ROWS

#: runner name -> the accelerator it runs strategies on
RUNNERS: dict[str, str] = {"cpu": "cpu", "cuda": "cuda", "tpu": "xla"}


@dataclass(frozen=True, slots=True)
class Case:
    """One conformance test item."""

    strategy: str
    runner: str
    world_size: int | None  # None: the declaration, which launches nothing
    precision: str
    check: str
    skip: str | None = None

    @property
    def id(self) -> str:
        """The test id, also what skip and xfail files match by prefix."""
        where = "any" if self.world_size is None else f"w{self.world_size}"
        return f"{self.strategy}-{self.runner}-{where}-{self.precision}-{self.check}"

    @property
    def group(self) -> str:
        """Cases that share one driver launch."""
        return f"{self.strategy}-{self.runner}-w{self.world_size}"


def runner_devices(runner: str) -> tuple[int, str | None]:
    """How many devices the runner has here, and why it cannot run when it has none."""
    if runner == "cpu":
        return 1 << 10, None  # processes, not devices, bound the CPU runner
    if runner == "cuda":
        import torch

        count = torch.cuda.device_count()
        return count, None if count else "this machine has no CUDA devices"
    if importlib.util.find_spec("torch_xla") is None:
        return 0, "torch_xla is not installed, so there is no TPU runner here"
    from interlock.connector.machine import Machine

    count = Machine.probe().xla_devices
    return count, None if count else "this machine has no XLA devices"


def available_runners() -> list[str]:
    return [r for r in RUNNERS if runner_devices(r)[1] is None]


def resolve_strategies(names: Iterable[str]) -> list[StrategySpec]:
    """Specs for the names asked for; ``all`` means every registered strategy that is
    not a preset of another. A name that a broken entry point stands for is left to
    `broken_entry_points_asked`.

    Raises:
        ValueError: naming an unknown strategy and the known ones.
    """
    specs = strategy_specs()
    broken = {n for ep in broken_entry_points() for n in ep.strategies}
    chosen: list[StrategySpec] = []
    for name in names:
        if name == "all":
            chosen += [s for s in specs.values() if s.variant_of is None]
        elif name in specs:
            chosen.append(specs[name])
        elif name not in broken:
            raise ValueError(f"unknown strategy {name!r}; registered: {', '.join(specs)}")
    return list(dict.fromkeys(chosen))


def broken_entry_points_asked(names: Iterable[str]) -> list[EntryPointStatus]:
    """The broken entry points the names ask for: every one for ``all``, else those
    that stand for a name asked for (and not registered by someone else). Each is a
    failed ``declaration`` case named after the entry point."""
    specs = strategy_specs()
    wanted = set(names)
    return [ep for ep in broken_entry_points()
            if "all" in wanted or any(n in wanted and n not in specs for n in ep.strategies)]


def precisions_for(spec: StrategySpec, runner: str,
                   only: Sequence[str] | None = None) -> list[str]:
    """The declared precisions the runner's accelerator supports (32-true first)."""
    accelerator = ACCELERATOR_ROWS[RUNNERS[runner]]
    chosen = [p for p in sorted(spec.precisions & accelerator.precisions)
              if only is None or p in only]
    return sorted(chosen, key=lambda p: (p != "32-true", p))


def cases_for(spec: StrategySpec, runner: str, world_sizes: Sequence[int],
              only_precisions: Sequence[str] | None = None) -> list[Case]:
    accelerator = RUNNERS[runner]
    devices, unavailable = runner_devices(runner)
    out = [Case(spec.name, runner, None, ANY_PRECISION, "declaration",
                skip=None if accelerator in spec.accelerators else
                f"{spec.name} does not declare the {accelerator} accelerator")]
    precisions = precisions_for(spec, runner, only_precisions)
    for world_size in world_sizes:
        skip = unavailable
        if skip is None and accelerator not in spec.accelerators:
            skip = (f"{spec.name} runs on {', '.join(sorted(spec.accelerators))}, not on "
                    f"the {runner} runner's {accelerator}")
        if skip is None and spec.max_devices is not None and world_size > spec.max_devices:
            skip = f"{spec.name} runs on {spec.max_devices} device(s) at most"
        if skip is None and world_size > devices:
            skip = f"the {runner} runner has {devices} device(s), fewer than {world_size}"
        if skip is None and not precisions:
            skip = "none of the strategy's precisions runs on this runner"
        for check in CHECKS:
            if check.where == "declaration":
                continue
            labels = precisions if check.where == "rank" else [ANY_PRECISION]
            for precision in labels or [ANY_PRECISION]:
                out.append(Case(spec.name, runner, world_size, precision, check.id, skip))
    return out
