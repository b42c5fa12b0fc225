"""Build a strategy's parts from a Plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interlock.connector.errors import ResolutionError
from interlock.strategies.accelerators import Accelerator, accelerator_for
from interlock.strategies.environments import ClusterEnvironment, environment_for
from interlock.strategies.io import CheckpointIO, TorchCheckpointIO
from interlock.strategies.precision import Precision, precision_for

if TYPE_CHECKING:
    from interlock.connector.planner import Plan


_PLUGIN_BASES: dict[str, type] = {
    "precision": Precision,
    "checkpoint_io": CheckpointIO,
    "cluster_environment": ClusterEnvironment,
}


def _check(obj: object, base: type, flag: str, code: str) -> None:
    """Refuse an object that declares a part kind but is not that part.

    The engine recognises parts by a class attribute so that planning never imports
    torch; building needs the real thing.
    """
    if obj is not None and not isinstance(obj, base):
        raise ResolutionError(
            code, flag=flag, value=obj,
            reason=f"{type(obj).__name__} declares itself a {base.__name__} but does not "
            f"derive from interlock's {base.__module__}.{base.__name__}, so it lacks the "
            "methods a strategy calls.",
        )


def parts_from_plan(plan: Plan) -> dict[str, Any]:
    """Accelerator, precision, checkpoint IO and cluster environment for ``plan``,
    taking the user's instances and plugin objects where the plan carries them."""
    by_kind = {getattr(type(p), "interlock_plugin_kind", None): p for p in plan.plugins}
    for kind, base in _PLUGIN_BASES.items():
        _check(by_kind.get(kind), base, "plugins", "invalid-plugin")
    _check(plan.accelerator_instance, Accelerator, "accelerator", "unknown-accelerator")
    precision = by_kind.get("precision") or precision_for(
        plan.precision, plan.accelerator, plan.spec.precision_plugin
    )
    checkpoint_io = by_kind.get("checkpoint_io") or TorchCheckpointIO()
    cluster = by_kind.get("cluster_environment") or environment_for(plan.cluster_environment)
    return {
        "accelerator": plan.accelerator_instance or accelerator_for(plan.accelerator),
        "precision": precision,
        "checkpoint_io": checkpoint_io,
        "cluster_environment": cluster,
    }
