"""A strategy whose numerics change only after a warm-up, registered twice: once
without declaring it (the suite's default 3 parity steps never see the change) and
once declaring ``parity_steps`` beyond it (the suite must then catch it).

Importing this module registers them (``--interlock-import warm_up_strategies``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import interlock
from interlock import StrategySpec, registered
from interlock.strategies.ddp import DDPStrategy

#: synchronised steps averaged exactly before the strategy starts to deviate: the
#: suite's default training parity (3 steps) and accumulation parity (2) stay inside
WARM_UP = 3
#: what the declaring spec asks the parity checks for: past the warm-up
DECLARED_STEPS = 5


class DeviatesAfterWarmUp(DDPStrategy):
    """Averages gradients exactly for its first WARM_UP synchronised steps, then sums
    them: a stand-in for compression that starts after a warm-up (PowerSGD's
    ``start_powerSGD_iter``)."""

    def configure_ddp(self, ddp_module: DistributedDataParallel) -> None:
        # one counter per wrapped module, as PowerSGD keeps its state per module
        ddp_module.register_comm_hook({"step": 0}, _warm_up_hook)


# unannotated: DDP checks a hook's annotations against dist.GradBucket, and this
# module's postponed annotations are strings
def _warm_up_hook(state, bucket):  # type: ignore[no-untyped-def]
    exact = state["step"] < WARM_UP
    if bucket.is_last():
        state["step"] += 1
    world = dist.get_world_size()
    work = dist.all_reduce(bucket.buffer(), async_op=True)

    def finish(done: Any) -> torch.Tensor:
        summed: torch.Tensor = done.value()[0]
        return summed / world if exact else summed

    return work.get_future().then(finish)


def _register() -> None:
    for name, steps in (("warm_up_undeclared", None), ("warm_up_declared", DECLARED_STEPS)):
        if name in registered(StrategySpec):
            continue
        interlock.register(interlock.StrategySpec(
            name=name, factory=f"{__name__}:DeviatesAfterWarmUp",
            description=f"deviates after {WARM_UP} steps; parity_steps={steps}",
            family="ddp", accelerators=frozenset({"cpu"}),
            precisions=frozenset({"32-true"}), launcher="fork",
            options={"start_method": "fork"}, capabilities=frozenset({"accumulation"}),
            parity_steps=steps,
        ))


_register()
