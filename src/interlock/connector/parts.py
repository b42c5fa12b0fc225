"""The engine's rules, offered to the runtime parts so that none keeps a second copy.

Accelerators parse devices, and cluster environments detect themselves and validate
the job's geometry, through these functions.
"""

from __future__ import annotations

from collections.abc import Mapping

from interlock.connector.flag_rules import DEVICES_FLAG
from interlock.connector.machine import Machine
from interlock.connector.machine_rules import CLUSTER_CHECK, DEVICES_STAGE
from interlock.connector.parts_registry import current_parts
from interlock.connector.registry import strategy_specs
from interlock.connector.rules import Context, DevicesRequest, run_decision, run_stages


def _context(machine: Machine, devices: object, num_nodes: int) -> Context:
    return Context(
        machine=machine,
        specs=strategy_specs(),
        accelerator_flag=None,
        devices_flag=devices,
        strategy_flag=None,
        precision_flag=None,
        num_nodes_flag=num_nodes,
        plugins_flag=None,
        num_nodes=num_nodes,
    )


def place_devices(accelerator: str, devices: object, machine: Machine) -> tuple[str, ...]:
    """The torch device strings of one node for ``devices`` on ``accelerator``.

    Raises:
        ResolutionError: the devices value is invalid or the machine lacks the devices.
    """
    ctx = _context(machine, devices, 1)
    ctx.accelerator = accelerator
    run_decision("flags", DEVICES_FLAG, ctx)
    run_stages((DEVICES_STAGE,), ctx)
    return ctx.parallel_devices


def cluster_detected(name: str, environ: Mapping[str, str]) -> bool:
    """Whether the detector of the cluster environment ``name`` (built-in or
    registered) holds for ``environ``.

    Raises:
        KeyError: no cluster environment of that name is registered.
    """
    detect = current_parts().environments[name].detect
    return detect is not None and detect(environ)


def check_cluster_geometry(
    name: str, devices_per_node: int, num_nodes: int, environ: Mapping[str, str]
) -> None:
    """Refuse a job whose geometry (from ``name``'s variables) differs from the flags.

    Raises:
        ResolutionError: ``cluster-mismatch`` or ``invalid-environment``.
    """
    parts = current_parts()
    row = parts.environments.get(name)
    if row is None:
        return  # an environment nobody registered: nothing the tables know to check
    machine = Machine(environ={k: environ[k] for k in parts.environment_variables
                               if k in environ})
    ctx = _context(machine, devices_per_node, num_nodes)
    # the strategy's devices are settled: a count, never auto (which would follow the
    # cluster instead of being checked against it)
    ctx.devices = DevicesRequest(kind="count", count=devices_per_node)
    ctx.parallel_devices = ("cpu",) * devices_per_node
    ctx.cluster, ctx.cluster_row, ctx.cluster_external = row.name, row, row.external
    run_decision("cluster", CLUSTER_CHECK, ctx)
