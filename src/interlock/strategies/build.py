"""`build_strategy`: the Strategy a Plan describes.

The engine hands over nothing but the Plan; this is where the runtime takes it, with
the strategies, so that the engine never imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interlock.connector.errors import ResolutionError
from interlock.connector.planner import check_options, load_factory
from interlock.strategies.base import Strategy

if TYPE_CHECKING:
    from interlock.connector.planner import Plan


def build_strategy(plan: Plan) -> Strategy:
    """Wire the strategy ``plan`` describes (importing its module now).

    A strategy instance given to `plan()` is completed with the parts it was not
    given. Otherwise the factory named by the strategy's row is a Strategy class, built
    by its ``from_plan(plan)`` (every class inherits `Strategy.from_plan`), or any
    callable taking the plan, whose strategy is then completed from the plan.

    Raises:
        ResolutionError: ``unknown-strategy`` for an instance that declares itself a
            strategy without deriving from `Strategy`; ``unknown-option`` when the
            row's options name a keyword the factory class does not take (see
            `interlock.connector.planner.check_options`).
        ImportError: the factory cannot be imported (naming the strategy and what to
            install).
        TypeError: the factory returned something that is not a `Strategy`.
    """
    instance = plan.strategy_instance
    if instance is not None:
        if not isinstance(instance, Strategy):
            raise ResolutionError(
                "unknown-strategy", flag="strategy", value=instance,
                reason=f"{type(instance).__name__} declares itself a strategy but does not "
                "derive from interlock.strategies.base.Strategy.",
            )
        instance.complete(plan)
        return instance
    factory = load_factory(plan.spec)
    check_options(plan.spec, factory)
    from_plan = getattr(factory, "from_plan", None)
    strategy = from_plan(plan) if from_plan is not None else factory(plan)
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"the factory of strategy {plan.spec.name!r} ({plan.spec.factory}) returned "
            f"{type(strategy).__name__}, not an interlock Strategy"
        )
    if strategy.plan is not plan:  # a function factory: the plan's parts are still due
        strategy.complete(plan)
    return strategy
