"""`resolve()`: the engine's `plan()`, handed to the builder that lives with the
strategies.

The engine (`interlock.engine`) never imports the runtime; this module joins the
two, and imports the runtime (and torch) only when a plan is built, so that
``import interlock`` and `plan()` stay light.

`resolve` takes `plan`'s parameters, declared once, in `plan`: a new flag is not
written here again. Type checkers see them through the `ParamSpec` of `_then_build`,
`inspect.signature` (and so ``help()`` and the API docs) through ``__signature__``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec

from interlock.engine.planner import Plan, check_machine, plan, use_builder

if TYPE_CHECKING:
    from interlock.strategies.base import Strategy

P = ParamSpec("P")


def build(planned: Plan) -> Strategy:
    """The Strategy ``planned`` describes (`interlock.strategies.build.build_strategy`).

    Raises:
        ResolutionError: see `build_strategy`.
    """
    from interlock.strategies.build import build_strategy

    return build_strategy(planned)


def _then_build(planner: Callable[P, Plan]) -> Callable[P, Strategy]:
    """``planner`` followed by `build`, taking exactly ``planner``'s parameters."""
    signature = inspect.signature(planner)

    def resolve(*args: P.args, **kwargs: P.kwargs) -> Strategy:
        """`plan` the flags, then build the Strategy the plan describes: a validated,
        wired strategy, or a `ResolutionError`.

        The arguments are `plan`'s, with its defaults. ``plan(...).build()`` does the
        same in two steps.

        Raises:
            ResolutionError: the combination cannot work (from `plan`), or the strategy
                cannot be built from the plan (``unknown-option``, ``invalid-plugin``,
                ...).
            TypeError: ``machine`` is neither an `interlock.Machine` nor None, or an
                argument `plan` does not take.
        """
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"resolve(): {error}") from None
        check_machine("resolve", bound.arguments.get("machine"))
        return build(planner(*args, **kwargs))

    resolve.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation="Strategy")
    return resolve


resolve = _then_build(plan)

use_builder(build)  # Plan.build() hands its plan here
