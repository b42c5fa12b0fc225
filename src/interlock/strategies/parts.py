"""`Parts`: everything a Plan decided about a strategy, built once as objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from interlock.engine.errors import ResolutionError
from interlock.engine.stages.flags import plugin_kind
from interlock.strategies.accelerators import Accelerator, accelerator_for
from interlock.strategies.environments import ClusterEnvironment, environment_for
from interlock.strategies.io import CheckpointIO, checkpoint_io_for
from interlock.strategies.precision import Precision, precision_for

if TYPE_CHECKING:
    from interlock.engine.planner import Plan

#: The parts a strategy holds as objects, by the constructor keyword (and flag name)
#: that can give each one; the strategy keeps the ones it was given and takes the rest
#: from its Parts.
PART_OBJECTS: tuple[str, ...] = (
    "accelerator", "precision", "checkpoint_io", "cluster_environment",
)

_PLUGIN_BASES: dict[str, type] = {
    "precision": Precision,
    "checkpoint_io": CheckpointIO,
    "cluster_environment": ClusterEnvironment,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """A strategy's parts as one Plan decided them.

    The engine decides by row (`interlock.Plan.rows`: ``Plan.launcher``,
    ``Plan.checkpoint_io``, ... name them) and carries the objects the user passed
    (plugins, an accelerator instance); this is the one place those rows become
    objects. A strategy never chooses a part again: it
    keeps what its constructor was given and takes the rest from here.

    Attributes:
        accelerator: the plan's accelerator instance, or a new one for its name.
        precision: the precision plugin passed, or the one the plan's precision (and the
            strategy row's ``precision_plugin``) names.
        checkpoint_io: the checkpoint IO plugin passed, or the one the plan names.
        cluster_environment: the cluster environment plugin passed, or the one the plan
            names (reading this process's environment).
        launcher: the launcher table's name for how processes are created, or None
            for strategies that run in the calling process.
        parallel_devices: the devices of one node's processes, in local-rank order.
        num_nodes: how many nodes the job spans.
    """

    accelerator: Accelerator
    precision: Precision
    checkpoint_io: CheckpointIO
    cluster_environment: ClusterEnvironment
    launcher: str | None
    parallel_devices: tuple[torch.device, ...]
    num_nodes: int

    @classmethod
    def from_plan(cls, plan: Plan) -> Parts:
        """The parts ``plan`` describes, taking the user's objects where it carries them.

        Raises:
            ResolutionError: an object passed as a plugin or as the accelerator declares
                a part kind but does not derive from interlock's class for it.
        """
        by_kind = {plugin_kind(p): p for p in plan.plugins}
        for kind, base in _PLUGIN_BASES.items():
            _check(by_kind.get(kind), base, "plugins", "invalid-plugin")
        _check(plan.accelerator_instance, Accelerator, "accelerator", "unknown-accelerator")
        accelerator = plan.accelerator_instance
        precision = by_kind.get("precision")
        checkpoint_io = by_kind.get("checkpoint_io")
        cluster = by_kind.get("cluster_environment")
        rows = plan.rows  # what the plan chose, as registered when it was planned
        return cls(
            accelerator=accelerator if isinstance(accelerator, Accelerator)
            else accelerator_for(rows.get("accelerators", plan.accelerator)),
            precision=precision if isinstance(precision, Precision)
            else precision_for(rows.get("precisions", plan.precision), plan.accelerator,
                               plan.spec.precision_plugin),
            checkpoint_io=checkpoint_io if isinstance(checkpoint_io, CheckpointIO)
            else checkpoint_io_for(rows.get("checkpoint_io", plan.checkpoint_io)),
            cluster_environment=cluster if isinstance(cluster, ClusterEnvironment)
            else environment_for(rows.get("environments", plan.cluster_environment)),
            launcher=plan.launcher,
            parallel_devices=tuple(torch.device(d) for d in plan.parallel_devices),
            num_nodes=plan.num_nodes,
        )


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
