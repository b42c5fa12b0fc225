"""The strategy this package registers, read through the ``interlock.strategies`` entry
point. Kept free of torch imports: interlock loads entry points while planning, and
``interlock.plan()`` must stay cheap; the strategy class is imported only when a plan
is built (the ``factory`` string)."""

from __future__ import annotations

from interlock import StrategySpec


def specs() -> list[StrategySpec]:
    """The strategies this package registers."""
    return [
        StrategySpec(
            name="ddp_fp16_compress",
            factory="interlock_compressed_ddp.strategy:CompressedDDPStrategy",
            description="DDP whose gradient all-reduce travels in float16",
            family="ddp",
            accelerators=frozenset({"cpu", "cuda"}),
            precisions=frozenset({"32-true", "bf16-mixed", "16-mixed"}),
            launcher="subprocess",
            options={"start_method": "popen"},
            capabilities=frozenset({"accumulation", "clipping", "resharding", "timeout"}),
            # float16 keeps 11 significant bits: gradients are rounded to ~5e-4
            parity_tolerance=(5e-3, 5e-4),
        ),
    ]
