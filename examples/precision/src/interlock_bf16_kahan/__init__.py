"""The precision row this package registers, read through the ``interlock.precisions``
entry point. Kept free of torch imports: interlock loads entry points while planning,
and ``interlock.plan()`` must stay cheap; the class is imported only when a strategy is
built (the row's ``factory`` string)."""

from __future__ import annotations

from interlock import PrecisionRow

PRECISION = PrecisionRow(
    name="bf16-true-kahan",
    param_dtype="bfloat16",
    compute_dtype="bfloat16",
    scaler=False,
    plugin="kahan",
    factory="interlock_bf16_kahan.precision:KahanBF16Precision",
    description="parameters and compute in bfloat16, optimizer updates Kahan-compensated",
    accelerators=frozenset({"cpu"}),
    # the compensation buffer, one per parameter in its dtype, in the optimizer's state
    state_tensors=1,
    # ddp reaches its presets too (ddp_spawn, ddp_fork, ...: ddp under a launcher);
    # fsdp wraps this row's plugin in its own (the sharding policy around it)
    strategies=frozenset({"single_device", "ddp", "fsdp"}),
)

__all__ = ["PRECISION"]
