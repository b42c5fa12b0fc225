"""How each launcher runs examples/train.py with a given geometry, and how it names a
failed rank. ``interlock-ddp`` and ``interlock-spawn`` are interlock's own launchers;
the others are the cluster launchers, run for real."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster_harness import PYTHON, SCRIPT, Job, start

#: SLURM_CONF and the like, filled in by the slurm fixture once the daemons run.
SLURM_ENV: dict[str, str] = {}


def free_port() -> int:
    """A port free at this moment (torchrun's c10d rendezvous binds it right after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_name(directory: Path) -> str:
    """The SLURM job name of runs made in ``directory`` (to find them in squeue)."""
    return f"interlock-{directory.name}"


@dataclass(frozen=True)
class Style:
    """One way of launching train.py.

    Attributes:
        name: the test id.
        tools: commands it needs on PATH.
        cluster, launcher: what interlock must detect (the summary's fields).
        world_size: ranks in all.
        rank_named: a pattern (``{rank}`` filled in) the launcher's output matches when
            it names a failed rank.
    """

    name: str
    tools: tuple[str, ...]
    cluster: str
    launcher: str
    world_size: int
    rank_named: str
    nodes: int = 1
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def per_node(self) -> int:
        return self.world_size // self.nodes

    def commands(self, args: Sequence[str], devices: int | None = None,
                 name: str = "interlock") -> list[list[str]]:
        """The command lines for train.py with ``args``; ``devices`` overrides the
        --devices flag (to provoke a mismatch); ``name`` names a SLURM job."""
        flags = ["--devices", str(devices if devices is not None else self.per_node),
                 "--num-nodes", str(self.nodes), *args]
        train = [PYTHON, str(SCRIPT), *flags]
        if self.name == "interlock-ddp":
            return [[*train, "--strategy", "ddp"]]
        if self.name == "interlock-spawn":
            return [[*train, "--strategy", "ddp_spawn"]]
        if self.name == "torchrun":
            port = free_port()
            return [
                [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(self.nodes),
                 "--nproc-per-node", str(self.per_node), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}",
                 "--max-restarts", "0", "--monitor-interval", "0.1",
                 str(SCRIPT), *flags]
                for _ in range(self.nodes)
            ]
        if self.name == "srun":
            return [["srun", f"--job-name={name}", "--nodes", "1", "--ntasks-per-node",
                     str(self.per_node), "--kill-on-bad-exit=1", "--label", *train]]
        if self.name == "mpirun":
            return [["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output",
                     "-np", str(self.world_size), *train]]
        raise ValueError(f"unknown launch style {self.name!r}")

    def start(self, name: str, args: Sequence[str], directory: Path,
              devices: int | None = None) -> Job:
        env = {**SLURM_ENV} if self.name == "srun" else {}
        commands = self.commands(args, devices, job_name(directory))
        return start(f"{self.name}-{name}", commands, directory, env)

    def names_rank(self, output: str, rank: int) -> bool:
        if self.name == "srun":
            # srun groups the tasks that failed together: "tasks 0-1: Exited with ..."
            return any(rank in _ranks(found)
                       for found in re.findall(self.rank_named, output))
        return re.search(self.rank_named.format(rank=rank), output) is not None


def _ranks(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}``."""
    ranks: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        ranks.update(range(int(low), int(high or low) + 1))
    return ranks


STYLES = {
    s.name: s for s in (
        Style(name="interlock-ddp", tools=(), cluster="local", launcher="subprocess",
              world_size=2, rank_named=r"rank {rank} failed"),
        Style(name="interlock-spawn", tools=(), cluster="local", launcher="spawn",
              world_size=2, rank_named=r"rank {rank} failed"),
        # two simulated nodes of two ranks each, on this machine
        Style(name="torchrun", tools=(), cluster="torchelastic", launcher="external",
              world_size=4, nodes=2, rank_named=r"rank\s*:\s*{rank} \(local_rank"),
        Style(name="srun", tools=("srun", "sinfo"), cluster="slurm", launcher="external",
              world_size=2, rank_named=r"tasks? ([\d,-]+): Exited with exit code"),
        Style(name="mpirun", tools=("mpirun",), cluster="mpi", launcher="external",
              world_size=2, rank_named=r"Process name: \[\[\d+,\d+\],{rank}\]"),
    )
}
