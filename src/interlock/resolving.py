"""`resolve()`: the engine's `plan()`, handed to the builder that lives with the
strategies.

The engine (`interlock.connector`) never imports the runtime; this module joins the
two, and imports the runtime (and torch) only when a plan is built, so that
``import interlock`` and `plan()` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interlock.connector.machine import Machine
from interlock.connector.model import ModelShape
from interlock.connector.planner import (
    AcceleratorFlag,
    DevicesFlag,
    ParallelismFlag,
    Plan,
    PrecisionFlag,
    StrategyFlag,
    check_machine,
    plan,
    use_builder,
)

if TYPE_CHECKING:
    from interlock.strategies.base import Strategy


def build(planned: Plan) -> Strategy:
    """The Strategy ``planned`` describes (`interlock.strategies.build.build_strategy`).

    Raises:
        ResolutionError: see `build_strategy`.
    """
    from interlock.strategies.build import build_strategy

    return build_strategy(planned)


def resolve(
    accelerator: AcceleratorFlag = "auto",
    devices: DevicesFlag = "auto",
    strategy: StrategyFlag = "auto",
    precision: PrecisionFlag = "32-true",
    num_nodes: int = 1,
    plugins: object = None,
    machine: Machine | None = None,
    parallelism: ParallelismFlag = None,
    model: ModelShape | None = None,
    optimizer: str | None = None,
    micro_batch_size: int | None = None,
    launcher: str | None = None,
) -> Strategy:
    """`plan` the flags, then build the Strategy the plan describes: a validated, wired
    strategy, or a `ResolutionError`.

    The arguments are `plan`'s. ``plan(...).build()`` does the same in two steps.

    Raises:
        ResolutionError: the combination cannot work (from `plan`), or the strategy
            cannot be built from the plan (``unknown-option``, ``invalid-plugin``, ...).
        TypeError: ``machine`` is neither an `interlock.Machine` nor None.
    """
    check_machine("resolve", machine)
    return build(plan(
        accelerator=accelerator, devices=devices, strategy=strategy, precision=precision,
        num_nodes=num_nodes, plugins=plugins, machine=machine, parallelism=parallelism,
        model=model, optimizer=optimizer, micro_batch_size=micro_batch_size,
        launcher=launcher,
    ))


use_builder(build)  # Plan.build() hands its plan here
