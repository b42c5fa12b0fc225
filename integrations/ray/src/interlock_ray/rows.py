"""The rows this package registers, read through interlock's entry points.

Free of torch and ray imports: interlock loads entry points while planning. The
classes are named by ``"module:Class"`` factories and imported only when a plan is
built or launched.
"""

from __future__ import annotations

from interlock import ClusterRow, LauncherRow, PackageRow, StrategyPreset

#: How to install what the rows need, quoted by ``missing-package`` refusals.
INSTALL = "pip install 'ray>=2.10' (or pip install interlock-ray, which brings it)"

#: What every rank asks of Ray when nothing else is said: one CPU, and one GPU on cuda.
DEFAULT_CPUS_PER_RANK = 1.0


def packages() -> list[PackageRow]:
    """The optional package the launcher requires."""
    return [PackageRow(name="ray", install=INSTALL)]


def environments() -> list[ClusterRow]:
    """The Ray cluster environment: chosen by the ray launcher, never detected."""
    return [
        ClusterRow(
            name="ray",
            detect=None,
            detect_doc="never detected from variables: a plan whose launcher is the ray "
            "launcher runs its ranks in it",
            external=False,
            description="Ray: each rank a Ray actor, placed by a placement group",
            factory="interlock_ray.environment:RayEnvironment",
        )
    ]


def placement(*, accelerator: str, devices_per_node: int, num_nodes: int) -> str:
    """How a job's devices and nodes become Ray resources, for the plan's trace."""
    world = devices_per_node * num_nodes
    per_rank = "1 GPU and cpus_per_rank CPUs" if accelerator == "cuda" else "cpus_per_rank CPUs"
    bundle = (f"{devices_per_node} GPUs and {devices_per_node} x cpus_per_rank CPUs"
              if accelerator == "cuda" else f"{devices_per_node} x cpus_per_rank CPUs")
    spread = (f"{num_nodes} bundles with placement strategy STRICT_SPREAD, so each lands on "
              "a different Ray node" if num_nodes > 1 else "1 bundle, on one Ray node")
    return (f"{world} rank{'s' if world > 1 else ''} as Ray actors: a placement group of "
            f"{spread}, each bundle holding one node's {devices_per_node} "
            f"rank{'s' if devices_per_node > 1 else ''} ({bundle}); every rank an actor "
            f"taking {per_rank} (RayEnvironment(cpus_per_rank=...), default "
            f"{DEFAULT_CPUS_PER_RANK:g}) from its node's bundle. Node rank = bundle index, "
            "local rank = the actor's place in its bundle")


def launchers() -> list[LauncherRow]:
    """The Ray launcher."""
    return [
        LauncherRow(
            name="ray",
            start_method=None,
            interactive=True,  # functions travel by cloudpickle, a notebook's too
            launches_single=True,
            description="places every rank as a Ray actor on a Ray cluster (RAY_ADDRESS, "
            "RayEnvironment(address=...), or a local one it starts)",
            factory="interlock_ray.launcher:RayLauncher",
            restarts=True,
            on_failure="every actor is killed and the placement group removed, and launch() "
            "raises naming the first rank that failed; with launch(max_restarts=N) a new "
            "placement group and new actors run the function again",
            environment="ray",
            placement=placement,
            strategies=STRATEGIES,
            requires=("ray",),
        )
    ]


#: interlock's strategies that run under the ray launcher (``launcher="ray"``)
STRATEGIES = frozenset(("ddp", "fsdp", "model_parallel"))


def strategies() -> list[StrategyPreset]:
    """ray_ddp, ray_fsdp and ray_model_parallel: names for interlock's ddp, fsdp and
    model_parallel under the ray launcher (the same as ``strategy="fsdp",
    launcher="ray"``)."""
    return [
        StrategyPreset(name="ray_ddp", strategy="ddp", launcher="ray",
                       description="DistributedDataParallel; every rank a Ray actor"),
        StrategyPreset(name="ray_fsdp", strategy="fsdp", launcher="ray",
                       description="FSDP2 (fully_shard) over a device mesh; every rank a "
                       "Ray actor"),
        StrategyPreset(name="ray_model_parallel", strategy="model_parallel", launcher="ray",
                       description="an N-D device mesh a user function parallelises the "
                       "model over; every rank a Ray actor"),
    ]
