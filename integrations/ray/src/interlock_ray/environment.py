"""`RayEnvironment`: where a rank placed by the ray launcher stands, read from Ray.

It is also where a user says how to reach the cluster and what each rank gets from it:
pass ``RayEnvironment(address=..., cpus_per_rank=...)`` as a plugin
(``interlock.resolve(strategy="ray_ddp", plugins=[RayEnvironment(...)])``), and the
ray launcher reads those settings.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from interlock.strategies.environments import ClusterEnvironment
from interlock_ray.rows import DEFAULT_CPUS_PER_RANK

#: Set by the ray launcher in every rank's actor: ``"<bundle>:<slot>:<ranks per bundle>"``,
#: the bundle of the job's placement group the actor was placed in (one bundle per
#: node), its place among that bundle's ranks, and how many ranks each bundle holds.
SLOT_ENV = "INTERLOCK_RAY_SLOT"


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank stands, as Ray placed it.

    Attributes:
        node_rank: the bundle of the job's placement group the rank's actor is in.
        local_rank: the rank's place among its bundle's ranks.
        ranks_per_node: ranks in each bundle.
        num_bundles: bundles in the placement group (one per node).
        num_nodes: distinct Ray nodes the bundles were placed on.
        node_id: the Ray node this actor runs on.
    """

    node_rank: int
    local_rank: int
    ranks_per_node: int
    num_bundles: int
    num_nodes: int
    node_id: str

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.num_bundles

    @property
    def global_rank(self) -> int:
        return self.node_rank * self.ranks_per_node + self.local_rank


def parse_slot(text: str) -> tuple[int, int, int]:
    """``(bundle, slot, ranks per bundle)`` from :data:`SLOT_ENV`.

    Raises:
        ValueError: the value is not three integers with ``0 <= slot < ranks``.
    """
    parts = text.split(":")
    try:
        bundle, slot, per = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{SLOT_ENV}={text!r} is not '<bundle>:<slot>:<ranks per bundle>'"
                         ) from None
    if bundle < 0 or per < 1 or not 0 <= slot < per:
        raise ValueError(f"{SLOT_ENV}={text!r} is out of range (need bundle >= 0 and "
                         "0 <= slot < ranks per bundle)")
    return bundle, slot, per


class RayEnvironment(ClusterEnvironment):
    """Ranks are Ray actors; their place comes from Ray's placement.

    Inside a rank the ray launcher started, the node rank is the bundle of the job's
    placement group the actor was placed in (the launcher asks for one bundle per
    node), the local rank its place among that bundle's actors, the world size the
    ranks per bundle times the placement group's bundles, and the node count the
    distinct Ray nodes those bundles are on; each is read from Ray's runtime context
    and placement group table, and a rank whose node is not the one the table gives
    its bundle is an error. Outside such a rank (in the launching process) it says
    rank 0 of a world of one, as interlock's local environment does.

    Args:
        environ: the variables to read (default ``os.environ``).
        address: the Ray cluster to connect to (``"ray://head:10001"``, ``"auto"``,
            ``"10.0.0.1:6379"``); default ``RAY_ADDRESS``, else a local Ray instance
            started for this process. Ignored when ``ray.init`` was already called.
        cpus_per_rank: CPUs reserved for each rank's actor.
        resources_per_rank: further Ray resources for each rank's actor
            (``{"memory": 8e9}``, custom resources such as ``{"trainer": 1}``).
        placement_timeout: seconds to wait for the cluster to hold the placement group
            before the launch is refused with what the cluster has.
        init_options: further keyword arguments for ``ray.init`` when the launcher
            connects (``runtime_env``, ``namespace``, ...).
    """

    name = "ray"

    def __init__(self, environ: Mapping[str, str] | None = None, *,
                 address: str | None = None, cpus_per_rank: float = DEFAULT_CPUS_PER_RANK,
                 resources_per_rank: Mapping[str, float] | None = None,
                 placement_timeout: float = 120.0,
                 init_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(environ)
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"address must be a non-empty string or None, got {address!r}")
        _check_amount("cpus_per_rank", cpus_per_rank)
        resources = dict(resources_per_rank or {})
        for key, value in resources.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"resources_per_rank keys must be resource names, got {key!r}")
            if key in ("CPU", "GPU"):
                raise ValueError(f"resources_per_rank must not set {key!r}: CPUs come from "
                                 "cpus_per_rank, and a GPU per rank from the cuda accelerator")
            _check_amount(f"resources_per_rank[{key!r}]", value)
        _check_amount("placement_timeout", placement_timeout, positive=True)
        self.address = address
        self.cpus_per_rank = float(cpus_per_rank)
        self.resources_per_rank: Mapping[str, float] = MappingProxyType(
            {k: float(v) for k, v in resources.items()})
        self.placement_timeout = float(placement_timeout)
        self.init_options: Mapping[str, Any] = MappingProxyType(dict(init_options or {}))
        self._place: RankPlace | None = None
        self._world_size: int | None = None
        self._global_rank: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in (
            "_environ", "address", "cpus_per_rank", "placement_timeout",
            "_world_size", "_global_rank")}
        state["resources_per_rank"] = dict(self.resources_per_rank)
        state["init_options"] = dict(self.init_options)
        return state  # the place is read again where the object lands

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self.resources_per_rank = MappingProxyType(dict(state["resources_per_rank"]))
        self.init_options = MappingProxyType(dict(state["init_options"]))
        self._place = None

    # ------------------------------------------------------------------ settings

    @property
    def creates_processes_externally(self) -> bool:
        return False  # interlock's ray launcher creates the actors

    @property
    def main_address(self) -> str:
        return self.environ.get("MASTER_ADDR", "").strip() or "127.0.0.1"

    @property
    def main_port(self) -> int:
        text = self.environ.get("MASTER_PORT", "").strip()
        return int(text) if text.isdigit() else 0

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> bool:
        """Whether this process is a rank the ray launcher started."""
        return SLOT_ENV in (os.environ if environ is None else environ)

    # ------------------------------------------------------------------ place

    def in_rank(self) -> bool:
        """Whether this process is a rank's actor started by the ray launcher."""
        return SLOT_ENV in self.environ

    def place(self) -> RankPlace:
        """Where this rank stands, read from Ray once per process.

        Raises:
            RuntimeError: not inside a rank the ray launcher started, or Ray placed the
                actor elsewhere than its placement group's table says.
        """
        if self._place is None:
            self._place = _read_place(self.environ)
        return self._place

    def world_size(self) -> int:
        if self._world_size is not None:
            return self._world_size
        return self.place().world_size if self.in_rank() else 1

    def set_world_size(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the world size must be >= 1, got {size}")
        self._world_size = size

    def global_rank(self) -> int:
        if self._global_rank is not None:
            return self._global_rank
        return self.place().global_rank if self.in_rank() else 0

    def set_global_rank(self, rank: int) -> None:
        if rank < 0:
            raise ValueError(f"the global rank must be >= 0, got {rank}")
        self._global_rank = rank

    def local_rank(self) -> int:
        return self.place().local_rank if self.in_rank() else 0

    def node_rank(self) -> int:
        return self.place().node_rank if self.in_rank() else 0

    def num_nodes(self) -> int:
        """The Ray nodes the job's placement group is on (1 outside a rank)."""
        return self.place().num_nodes if self.in_rank() else 1

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Refuse a placement that is not ``num_devices`` ranks on each of
        ``num_nodes`` Ray nodes (checked in each rank, before any collective)."""
        if not self.in_rank():
            return
        place = self.place()
        if (place.ranks_per_node, place.num_bundles, place.num_nodes) != (
                num_devices, num_nodes, num_nodes):
            raise RuntimeError(
                f"the plan wants {num_devices} rank(s) on each of {num_nodes} node(s); Ray "
                f"placed {place.ranks_per_node} rank(s) in each of {place.num_bundles} "
                f"bundle(s) on {place.num_nodes} distinct node(s)"
            )

    def __repr__(self) -> str:
        return (f"RayEnvironment(address={self.address!r}, cpus_per_rank={self.cpus_per_rank:g}, "
                f"resources_per_rank={dict(self.resources_per_rank)!r})")


def _check_amount(name: str, value: object, *, positive: bool = False) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")


def _read_place(environ: Mapping[str, str]) -> RankPlace:
    text = environ.get(SLOT_ENV)
    if text is None:
        raise RuntimeError(f"not a rank started by the ray launcher ({SLOT_ENV} is not set)")
    bundle, slot, per = parse_slot(text)
    import ray
    from ray.util import get_current_placement_group, placement_group_table

    if not ray.is_initialized():
        raise RuntimeError(f"{SLOT_ENV} is set but this process is not connected to Ray")
    group = get_current_placement_group()
    if group is None:
        raise RuntimeError(f"{SLOT_ENV} is set but this actor is in no placement group")
    table = placement_group_table(group)
    nodes: dict[Any, str] = table.get("bundles_to_node_id") or {}
    by_index = {int(k): str(v) for k, v in nodes.items()}
    node_id = ray.get_runtime_context().get_node_id()
    if by_index.get(bundle) != node_id:
        raise RuntimeError(
            f"this rank's actor runs on Ray node {node_id}, but its placement group puts "
            f"bundle {bundle} on {by_index.get(bundle)!r}"
        )
    return RankPlace(node_rank=bundle, local_rank=slot, ranks_per_node=per,
                     num_bundles=len(table.get("bundles") or by_index),
                     num_nodes=len(set(by_index.values())), node_id=node_id)
