"""Build a strategy's parts from a Plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interlock.strategies.accelerators import accelerator_for
from interlock.strategies.environments import environment_for
from interlock.strategies.io import TorchCheckpointIO
from interlock.strategies.precision import precision_for

if TYPE_CHECKING:
    from interlock.connector.planner import Plan


def parts_from_plan(plan: Plan) -> dict[str, Any]:
    """Accelerator, precision, checkpoint IO and cluster environment for ``plan``,
    taking the user's instances and plugin objects where the plan carries them."""
    by_kind = {getattr(type(p), "interlock_plugin_kind", None): p for p in plan.plugins}
    precision = by_kind.get("precision") or precision_for(plan.precision, plan.accelerator)
    checkpoint_io = by_kind.get("checkpoint_io") or TorchCheckpointIO()
    cluster = by_kind.get("cluster_environment") or environment_for(plan.cluster_environment)
    return {
        "accelerator": plan.accelerator_instance or accelerator_for(plan.accelerator),
        "precision": precision,
        "checkpoint_io": checkpoint_io,
        "cluster_environment": cluster,
    }
