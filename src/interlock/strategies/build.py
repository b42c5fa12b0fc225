"""`build_strategy`: the Strategy a Plan describes.

The engine hands over nothing but the Plan; this is where the runtime takes it, with
the strategies, so that the engine never imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interlock.engine.errors import ResolutionError, did_you_mean
from interlock.engine.registry import load_reference
from interlock.engine.specs import StrategySpec
from interlock.strategies.base import Strategy

if TYPE_CHECKING:
    from interlock.engine.planner import Plan


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
            `check_options`).
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


def load_factory(spec: StrategySpec) -> Any:
    """Import the object a spec's ``factory`` names, with an error that says which
    strategy needed it and what to install."""
    return load_reference("strategy", spec.name, spec.factory, spec.requires)


#: constructor parameters a strategy's parts arrive through: the plan provides them,
#: so a spec's options may not
PLAN_PROVIDED: frozenset[str] = frozenset({
    "accelerator", "parallel_devices", "num_nodes", "precision", "checkpoint_io",
    "cluster_environment",
})


def check_options(spec: StrategySpec, factory: object) -> None:
    """Refuse option keys the factory class's constructor does not take.

    A factory class receives ``spec.options`` as keyword arguments (the runtime's
    ``Strategy.from_plan`` passes them to its constructor), so every key must be a
    keyword parameter of the class, other than the parts the plan provides. A
    constructor with ``**kwargs`` checks its own extras (`DDPStrategy` checks them
    against DistributedDataParallel's signature). A factory that is a plain function
    reads ``plan.spec.options`` itself and is not checked.

    Raises:
        ResolutionError: ``unknown-option``, naming the strategy, the key and the
            closest accepted one.
    """
    if not spec.options or not isinstance(factory, type):
        return
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a signature Python cannot read: nothing to check
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        accepted = None
    else:
        accepted = [p.name for p in params
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                    and p.name not in PLAN_PROVIDED]
    for key in spec.options:
        if key in PLAN_PROVIDED:
            why = "is a part the plan provides (set it with a flag or a plugin instead)"
        elif accepted is not None and key not in accepted:
            why = f"is not a parameter of {factory.__name__}"
        else:
            continue
        raise ResolutionError(
            "unknown-option", flag="strategy", value=spec.name,
            reason=f"the strategy's options give {spec.factory} the keyword {key!r}, "
            f"which {why}.",
            choices=sorted(accepted or ()),
            suggestion=did_you_mean(key, accepted or ()),
        )
