"""Ray as a cluster for interlock.

Registers, through interlock's entry points only, the optional package ``ray``, the
``ray`` cluster environment (:class:`~interlock_ray.environment.RayEnvironment`), the
``ray`` launcher (:class:`~interlock_ray.launcher.RayLauncher`: every rank a Ray actor,
placed by a placement group), which interlock's ``ddp``, ``fsdp`` and ``model_parallel``
run under (``interlock.resolve(strategy="fsdp", launcher="ray")``), and three presets
that name them so: ``ray_ddp``, ``ray_fsdp`` and ``ray_model_parallel``.

Importing this package imports neither torch nor ray (interlock reads its rows while
planning, which must stay cheap); ``interlock_ray.RayEnvironment`` is imported on first
use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RayEnvironment"]


def __getattr__(name: str) -> Any:
    if name == "RayEnvironment":
        from interlock_ray.environment import RayEnvironment

        return RayEnvironment
    raise AttributeError(f"module 'interlock_ray' has no attribute {name!r}")
