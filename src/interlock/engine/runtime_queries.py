"""The engine's rules, offered to the runtime parts so that none keeps a second copy.

Accelerators parse devices, and cluster environments detect themselves and validate
the job's geometry, through these functions: each runs the stage's own rules on typed
inputs.
"""

from __future__ import annotations

from collections.abc import Mapping

from interlock.engine.machine import Machine
from interlock.engine.registry import current_parts, registered
from interlock.engine.specs import StrategySpec
from interlock.engine.stages.cluster import check_geometry as check_cluster_geometry
from interlock.engine.stages.devices import DevicesInput
from interlock.engine.stages.devices import place_devices as devices_stage
from interlock.engine.stages.flags import read_flag
from interlock.engine.written import Written

__all__ = ["check_cluster_geometry", "cluster_detected", "place_devices"]


def place_devices(accelerator: str, devices: object, machine: Machine) -> tuple[str, ...]:
    """The torch device strings of one node for ``devices`` on ``accelerator``.

    Raises:
        ResolutionError: the devices value is invalid or the machine lacks the devices.
    """
    parts = current_parts()
    request = read_flag("devices", devices, specs=registered(StrategySpec), parts=parts).devices
    return devices_stage(DevicesInput(
        machine=machine, parts=parts, accelerator=accelerator, devices=request,
        num_nodes=1,
    ), Written(devices=devices, num_nodes=1)).parallel_devices


def cluster_detected(name: str, environ: Mapping[str, str]) -> bool:
    """Whether the detector of the cluster environment ``name`` (built-in or
    registered) holds for ``environ``.

    Raises:
        KeyError: no cluster environment of that name is registered.
    """
    detect = current_parts().environments[name].detect
    return detect is not None and detect(environ)

