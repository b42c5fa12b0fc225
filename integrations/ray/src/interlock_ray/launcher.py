"""`RayLauncher`: every rank a Ray actor, placed by a placement group.

One launch:

1. connects to Ray (an existing connection, ``RayEnvironment(address=...)``,
   ``RAY_ADDRESS``, else a local Ray instance started for this process);
2. reserves a placement group of one bundle per node, each holding that node's ranks'
   CPUs and GPUs (STRICT_SPREAD across nodes), and refuses with what the cluster has
   when it does not fit within ``placement_timeout``;
3. starts one actor per rank in its node's bundle; rank 0's actor binds the rendezvous
   store on its node, to a port the kernel chose, and every rank connects to it;
4. runs the function in every actor and waits; the first rank to fail (or to die) is
   named in :class:`~interlock.strategies.launchers.RankFailedError`;
5. always kills every actor and removes the placement group, on success, failure,
   Ctrl-C or SIGTERM alike.
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from interlock.strategies.launchers import (
    ERROR_FILE_ENV,
    Launcher,
    LaunchError,
    RankFailedError,
    failure_time,
    host_store,
    limit_worker_threads,
    root_cause,
    set_worker_environment,
)
from interlock.strategies.preemption import Preempted
from interlock_ray.environment import SLOT_ENV, RayEnvironment
from interlock_ray.placement import (
    bundles,
    describe_shortfall,
    rank_resources,
    slots,
    strategy_for,
    visible_devices,
)

if TYPE_CHECKING:
    from interlock import LauncherRow
    from interlock.strategies.environments import ClusterEnvironment

#: How long a placement may take before the launcher checks whether the cluster could
#: ever hold it (and warns at once when it could not).
QUICK_PLACEMENT_S = 2.0

#: How long the ranks still running get to record their own failure once one rank
#: failed (a peer's "connection closed" is usually a consequence, recorded later).
GRACE_S = 2.0


class RayLauncher(Launcher):
    """Runs every rank of a job as a Ray actor (see the module's description).

    Args:
        num_processes: ranks per node.
        num_nodes: nodes (bundles of the placement group, each on its own Ray node).
        environment: the settings: address, CPUs and resources per rank, timeouts.
    """

    name = "ray"

    @classmethod
    def for_job(cls, row: LauncherRow, *, num_processes: int, num_nodes: int,
                cluster: ClusterEnvironment) -> Launcher:
        environment = cluster if isinstance(cluster, RayEnvironment) else RayEnvironment()
        return cls(num_processes=num_processes, num_nodes=num_nodes, environment=environment)

    def __init__(self, *, num_processes: int, num_nodes: int = 1,
                 environment: RayEnvironment | None = None) -> None:
        if num_processes < 1 or num_nodes < 1:
            raise LaunchError(f"a Ray job needs at least one rank on one node, got "
                              f"{num_processes} rank(s) on {num_nodes} node(s)")
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        self.environment = environment if environment is not None else RayEnvironment()

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    def launch(self, entry: Any, *args: Any, **kwargs: Any) -> Any:
        # Ray exports variables of its own after ray.init too (RAY_CLIENT_MODE once the
        # first actor is made): a launch leaves the caller's environment as it found it
        before = dict(os.environ)
        try:
            connect(self.environment, self.world_size)
            job = _Job(self)
            try:
                with _sigterm_exits():
                    return job.run(entry, args, kwargs)
            finally:
                job.remove()
        finally:
            _restore_environment(before)


class _sigterm_exits:
    """Within this context SIGTERM raises SystemExit(143) in the main thread, so the
    job's actors are killed before this process exits (Ray would otherwise only reap
    them when the driver's connection drops)."""

    def __enter__(self) -> None:
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signal.SIGTERM)


#: the CPUs of the local Ray instance this process started, while it runs
_LOCAL_INSTANCE: dict[str, int] = {}


def _restore_environment(before: dict[str, str]) -> None:
    for key in set(os.environ) - set(before):
        del os.environ[key]
    os.environ.update(before)


def connect(environment: RayEnvironment, world_size: int) -> None:
    """Connect this process to Ray, unless it is connected already.

    The address is the environment's, else ``RAY_ADDRESS``; without either a local
    Ray instance is started with room for ``world_size`` ranks (Ray shuts it down when
    this process exits). A local instance this process started for a smaller job
    earlier is replaced by a larger one (its CPUs are logical: a job of 4 ranks on a
    2-core laptop runs, as the existing-cluster path would).
    """
    need = math.ceil(world_size * environment.cpus_per_rank)
    if ray.is_initialized():
        started = _LOCAL_INSTANCE.get("cpus")
        if started is None or started >= need:
            return  # a cluster the caller connected to, or a local one large enough
        ray.shutdown()
        _LOCAL_INSTANCE.clear()
    options: dict[str, Any] = {"log_to_driver": True, **environment.init_options}
    address = environment.address or os.environ.get("RAY_ADDRESS") or None
    # ray.init exports variables of its own (RAY_CLIENT_MODE, PYTHONBREAKPOINT, ...); a
    # launch leaves the caller's environment as it found it
    before = dict(os.environ)
    try:
        if address is not None:
            ray.init(address=address, **options)
        else:
            cpus = int(options.setdefault("num_cpus", max(os.cpu_count() or 1, need)))
            options.setdefault("include_dashboard", False)
            # "local": a new instance, even where another Ray runs on this host (plain
            # ray.init() would join that one, and refuse num_cpus)
            ray.init(address="local", **options)
            _LOCAL_INSTANCE["cpus"] = cpus
    except Exception as exc:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        raise LaunchError(f"cannot connect to {where}: {type(exc).__name__}: {exc}") from exc
    finally:
        _restore_environment(before)


class _RankActor:
    """One rank. Its methods run one at a time, in the actor's own process."""

    def __init__(self, rank: int, bundle: int, slot: int, per_bundle: int) -> None:
        self.rank = rank
        self.slot_text = f"{bundle}:{slot}:{per_bundle}"
        self.errors = Path(tempfile.mkdtemp(prefix="interlock-ray-"))

    def where(self) -> tuple[str, str, list[str], int, str]:
        """``(node id, node IP, GPU ids, pid, error file)``."""
        context = ray.get_runtime_context()
        gpus = [str(g) for g in context.get_accelerator_ids().get("GPU", [])]
        return (context.get_node_id(), _node_address(), gpus, os.getpid(),
                str(self.errors / f"rank{self.rank}.json"))

    def host_rendezvous(self) -> str:
        """Bind the rendezvous store in this actor, on its node's address."""
        return host_store(_node_address())

    def run(self, payload: tuple[Any, tuple[Any, ...], dict[str, Any]],
            place: Mapping[str, Any]) -> tuple[str, Any]:
        """Run the job's entry; ``("ok", result)``, ``("failed", (time, traceback))`` or
        ``("preempted", None)``. A result is sent only by rank 0."""
        if place.get("cuda_visible_devices") is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = place["cuda_visible_devices"]
        os.environ[SLOT_ENV] = self.slot_text
        os.environ[ERROR_FILE_ENV] = str(self.errors / f"rank{self.rank}.json")
        set_worker_environment(
            local_rank=place["local_rank"], node_rank=place["node_rank"],
            num_processes=place["num_processes"], world_size=place["world_size"],
            rendezvous=place["rendezvous"],
        )
        limit_worker_threads(None)
        entry, args, kwargs = payload
        try:
            result = entry(*args, **kwargs)
        except Preempted:
            return ("preempted", None)
        except BaseException as exc:
            return ("failed", (failure_time(exc), "".join(traceback.format_exception(exc))))
        return ("ok", result if self.rank == 0 else None)


_remote_rank: Any = None


def _actor_class() -> Any:
    global _remote_rank
    if _remote_rank is None:
        _remote_rank = ray.remote(_RankActor)
    return _remote_rank


class _Job:
    """The placement group and actors of one launch, and their removal."""

    def __init__(self, launcher: RayLauncher) -> None:
        self.launcher = launcher
        self.group: Any = None
        self.actors: list[Any] = []
        self.where: list[tuple[str, str, list[str], int, str]] = []

    def run(self, entry: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        launcher = self.launcher
        env = launcher.environment
        try:
            per_rank = rank_resources(launcher.device_type, env.cpus_per_rank,
                                      env.resources_per_rank)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        wanted = bundles(per_rank, launcher.num_processes, launcher.num_nodes)
        strategy = strategy_for(launcher.num_nodes)
        self.group = placement_group(wanted, strategy=strategy)
        ready_ref = self.group.ready()
        first = min(QUICK_PLACEMENT_S, env.placement_timeout)
        ready, _ = ray.wait([ready_ref], timeout=first)
        if not ready and env.placement_timeout > first:
            if not _could_ever_fit(wanted, strategy):
                # say so now rather than after the whole timeout: only an autoscaler
                # adding nodes can still make room
                warnings.warn(
                    f"Ray cannot place the job on the cluster as it is ("
                    f"{_shortfall(wanted, strategy)}); waiting up to "
                    f"{env.placement_timeout:g} s for it to grow", RuntimeWarning,
                    stacklevel=4)
            ready, _ = ray.wait([ready_ref], timeout=env.placement_timeout - first)
        if not ready:
            raise LaunchError(
                f"Ray could not place the job within {env.placement_timeout:g} s: "
                + _shortfall(wanted, strategy)
                + ". Add nodes, ask for fewer devices or nodes, lower cpus_per_rank, or "
                "raise RayEnvironment(placement_timeout=...) for an autoscaling cluster")
        actor = _actor_class()
        resources = {k: v for k, v in per_rank.items() if k not in ("CPU", "GPU")}
        for rank, bundle, slot in slots(launcher.num_processes, launcher.num_nodes):
            self.actors.append(actor.options(
                num_cpus=per_rank.get("CPU", 0.0), num_gpus=per_rank.get("GPU", 0.0),
                resources=resources or None, max_restarts=0, max_concurrency=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.group, placement_group_bundle_index=bundle),
            ).remote(rank, bundle, slot, launcher.num_processes))
        try:
            self.where = ray.get([a.where.remote() for a in self.actors],
                                 timeout=env.placement_timeout)
            rendezvous = ray.get(self.actors[0].host_rendezvous.remote(),
                                 timeout=env.placement_timeout)
        except ray.exceptions.RayError as exc:
            raise LaunchError(f"the ranks' actors did not start within "
                              f"{env.placement_timeout:g} s: {exc}") from exc
        visible = (visible_devices([w[2] for w in self.where], launcher.num_processes)
                   if launcher.device_type == "cuda" else None)
        try:
            payload = ray.put((entry, args, kwargs))
        except Exception as exc:
            raise LaunchError(
                "the function given to launch() and its arguments must pickle (with "
                f"cloudpickle) to reach the ranks' actors: {type(exc).__name__}: {exc}"
            ) from exc
        refs = [self.actors[rank].run.remote(payload, {
            "local_rank": slot, "node_rank": bundle, "num_processes": launcher.num_processes,
            "world_size": launcher.world_size, "rendezvous": rendezvous,
            "cuda_visible_devices": visible[rank] if visible is not None else None,
        }) for (rank, bundle, slot) in slots(launcher.num_processes, launcher.num_nodes)]
        return self._wait(refs)

    def _wait(self, refs: list[Any]) -> Any:
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        failures: dict[int, tuple[float, str]] = {}
        died: dict[int, str] = {}
        preempted: list[int] = []
        result: Any = None
        deadline: float | None = None
        while pending:
            if deadline is not None and time.monotonic() >= deadline:
                break
            done, pending = ray.wait(pending, num_returns=1, timeout=0.1)
            for ref in done:
                rank = rank_of[ref]
                try:
                    status, value = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    died[rank] = self._death(rank, exc)
                    status, value = "died", None
                except ray.exceptions.RayError as exc:
                    # the function returned, but its result did not reach this process
                    failures[rank] = (time.time(), f"{type(exc).__name__}: {exc}")
                    status, value = "failed", None
                if status == "failed" and value is not None:
                    failures[rank] = value
                elif status == "preempted":
                    preempted.append(rank)
                elif status == "ok" and rank == 0:
                    result = value
                if status != "ok" and deadline is None:
                    deadline = time.monotonic() + GRACE_S
        if died:
            # a rank that died without a word (SIGKILL, the OOM killer, os._exit) is the
            # cause: the failures recorded by its peers are its consequences
            silent = sorted(r for r in died if r not in failures)
            if silent:
                rank = silent[0]
                others = sorted(set(failures) | set(died) - {rank})
                detail = died[rank]
                if others:
                    detail += (f"\n(rank{'s' if len(others) > 1 else ''} "
                               f"{', '.join(map(str, others))} failed after it)")
                raise RankFailedError(rank, detail)
        if failures:
            raise root_cause(failures)
        if preempted:
            raise Preempted()
        return result

    def _death(self, rank: int, exc: BaseException) -> str:
        """What is known of a rank's actor that died: the failure it recorded in its
        error file when that file is on this machine, else Ray's account."""
        if rank < len(self.where):
            path = Path(self.where[rank][4])
            try:
                report = json.loads(path.read_text(encoding="utf-8"))
                return str(report["traceback"])
            except (OSError, ValueError, KeyError):
                pass
        text = str(exc).strip().splitlines()
        return "the rank's Ray actor died: " + (" ".join(text[:6]) if text else type(exc).__name__)

    def remove(self) -> None:
        """Kill every actor and remove the placement group (idempotent); wait until the
        actors on this machine have exited."""
        actors, self.actors = self.actors, []
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        if self.group is not None:
            group, self.group = self.group, None
            try:
                remove_placement_group(group)
            except Exception:
                pass
        here = _node_address() if ray.is_initialized() else None
        pids = [w[3] for w in self.where if w[1] == here]
        deadline = time.monotonic() + 15.0
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if pids:
                time.sleep(0.05)
        for _, _, _, _, error_file in self.where:
            path = Path(error_file)
            if path.parent.exists():
                for leftover in path.parent.glob("*"):
                    leftover.unlink(missing_ok=True)
                try:
                    path.parent.rmdir()
                except OSError:
                    pass
        self.where = []


def _alive_nodes() -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [n for n in nodes if n.get("Alive")]


def _shortfall(wanted: list[dict[str, float]], strategy: str) -> str:
    return describe_shortfall(wanted, strategy,
                              ray.cluster_resources(),  # type: ignore[no-untyped-call]
                              ray.available_resources(),  # type: ignore[no-untyped-call]
                              len(_alive_nodes()))


def _could_ever_fit(wanted: list[dict[str, float]], strategy: str) -> bool:
    """Whether the cluster's nodes, all of them free, could hold the bundles."""
    totals = [dict(n.get("Resources") or {}) for n in _alive_nodes()]
    if strategy == "STRICT_SPREAD":
        fitting = [t for t in totals
                   if all(t.get(k, 0.0) >= v for k, v in wanted[0].items())]
        return len(fitting) >= len(wanted)
    return any(all(t.get(k, 0.0) >= v for k, v in wanted[0].items()) for t in totals)


def _node_address() -> str:
    """This Ray node's IP address."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: its parent (the raylet) has not reaped it yet
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
