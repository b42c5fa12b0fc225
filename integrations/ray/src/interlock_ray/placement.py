"""The arithmetic of placing a job on Ray, kept apart from Ray itself (and tested so)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def rank_resources(device_type: str, cpus_per_rank: float,
                   extra: Mapping[str, float]) -> dict[str, float]:
    """What one rank's actor reserves: its CPUs, one GPU on cuda, and ``extra``.

    Raises:
        ValueError: it would reserve nothing (Ray refuses an empty bundle, and a rank
            that holds nothing could be placed anywhere).
    """
    resources = {"CPU": float(cpus_per_rank), **{k: float(v) for k, v in extra.items()}}
    if device_type == "cuda":
        resources["GPU"] = 1.0
    reserved = {k: v for k, v in resources.items() if v > 0}
    if not reserved:
        raise ValueError("each rank must reserve some resource: give cpus_per_rank > 0 (or "
                         "resources_per_rank) on a CPU job")
    return reserved


def bundles(per_rank: Mapping[str, float], ranks_per_node: int,
            num_nodes: int) -> list[dict[str, float]]:
    """One bundle per node, holding that node's ranks' resources."""
    return [{k: v * ranks_per_node for k, v in per_rank.items()} for _ in range(num_nodes)]


def strategy_for(num_nodes: int) -> str:
    """The placement strategy: every bundle on a different node when there are several
    (STRICT_SPREAD), else the one bundle wherever it fits."""
    return "STRICT_SPREAD" if num_nodes > 1 else "PACK"


def slots(ranks_per_node: int, num_nodes: int) -> list[tuple[int, int, int]]:
    """``(global rank, bundle, slot)`` for every rank, in rank order."""
    return [(node * ranks_per_node + slot, node, slot)
            for node in range(num_nodes) for slot in range(ranks_per_node)]


def visible_devices(gpu_ids: Sequence[Sequence[str]], ranks_per_node: int
                    ) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for every rank (in rank order), from the GPU ids Ray
    gave each rank's actor.

    Ray shows each actor only its own GPU. interlock places local rank ``i`` on
    ``cuda:i``, and NCCL's peer-to-peer paths want a node's GPUs visible to each other,
    so every rank of a node sees the node's GPUs in local-rank order: ``cuda:i`` is then
    the GPU Ray gave local rank ``i``.

    Raises:
        ValueError: a rank was given other than exactly one GPU.
    """
    for rank, ids in enumerate(gpu_ids):
        if len(ids) != 1:
            raise ValueError(f"rank {rank} was given {len(ids)} GPUs by Ray, not 1: {list(ids)}")
    visible: list[str] = []
    for start in range(0, len(gpu_ids), ranks_per_node):
        node = ",".join(ids[0] for ids in gpu_ids[start:start + ranks_per_node])
        visible.extend([node] * len(gpu_ids[start:start + ranks_per_node]))
    return visible


def describe_shortfall(wanted: Sequence[Mapping[str, float]], strategy: str,
                       total: Mapping[str, float], available: Mapping[str, float],
                       nodes: int) -> str:
    """Why a placement group did not fit, in words."""
    need: dict[str, float] = {}
    for bundle in wanted:
        for key, value in bundle.items():
            need[key] = need.get(key, 0.0) + value

    def fmt(values: Mapping[str, float]) -> str:
        keys = [k for k in ("CPU", "GPU") if k in values] + sorted(
            k for k in values if k not in ("CPU", "GPU") and not k.startswith("node:")
            and k not in ("memory", "object_store_memory"))
        return ", ".join(f"{k} {values[k]:g}" for k in keys) or "nothing"

    per_bundle = fmt(wanted[0]) if wanted else "nothing"
    spread = (f" on {len(wanted)} different nodes (STRICT_SPREAD)"
              if strategy == "STRICT_SPREAD" else "")
    return (f"the job needs {len(wanted)} bundle(s) of {per_bundle}{spread}, {fmt(need)} in "
            f"all; the Ray cluster has {nodes} alive node(s) with {fmt(total)} in all, "
            f"{fmt(available)} free")
