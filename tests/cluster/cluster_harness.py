"""Start real launchers (torchrun, srun, sbatch, mpirun, interlock's own) and watch them.

A :class:`Job` is one or more launcher processes started in new sessions. The harness
waits with deadlines, records every process id that belongs to the job while it runs
(its sessions, plus processes whose command line names the job's directory, which
catches ranks that srun's daemons start outside our sessions), reports each launcher's
output when something goes wrong, and kills what is left by process id.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train.py"
SERVICES = ROOT / "tests" / "cluster" / "services.sh"
PYTHON = sys.executable

#: The training run every launcher must reproduce (rank 0's parameters).
PARITY_ARGS = ("--steps", "12", "--batch-size", "16")
#: How long the harness waits for a job's processes to disappear after it ended.
REAP_SECONDS = 15.0


class JobTimeout(AssertionError):
    """A job did not end within its deadline (its output is in the message)."""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[3]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _pids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


@dataclass
class Job:
    """Launcher processes started together; see :func:`start`."""

    name: str
    directory: Path
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    started: float = field(default_factory=time.time)
    ended: float | None = None
    #: pid -> start time (in clock ticks), to tell a pid from a later reuse of it
    seen: dict[int, int] = field(default_factory=dict)

    # ----------------------------------------------------------------- processes

    def _belongs(self, pid: int, sid: int) -> bool:
        sessions = {p.pid for p in self.procs}
        return sid in sessions or str(self.directory) in _cmdline(pid)

    def sample(self) -> None:
        """Record the job's live processes (called while waiting)."""
        me = os.getpid()
        for pid in _pids():
            if pid == me or pid in self.seen:
                continue
            stat = _stat(pid)
            if stat is not None and stat[0] != "Z" and self._belongs(pid, stat[1]):
                self.seen[pid] = stat[2]

    def alive(self) -> list[int]:
        """The recorded processes that still run (zombies and reused pids excluded)."""
        found = []
        for pid, start in self.seen.items():
            stat = _stat(pid)
            if stat is not None and stat[0] != "Z" and stat[2] == start:
                found.append(pid)
        return sorted(found)

    def survivors(self, seconds: float = REAP_SECONDS) -> list[int]:
        """Processes of the job still alive ``seconds`` after it ended."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for proc in self.procs:
                proc.poll()  # reap our own children
            if not self.alive():
                return []
            time.sleep(0.1)
        return self.alive()

    # ----------------------------------------------------------------- waiting

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout: float) -> list[int]:
        """Wait until every launcher exits; their exit codes.

        Raises:
            JobTimeout: a launcher still runs after ``timeout`` seconds (the job is
                killed first, and the message carries its output).
        """
        deadline = time.monotonic() + timeout
        while self.running():
            self.sample()
            if time.monotonic() > deadline:
                self.kill()
                raise JobTimeout(f"{self.name} did not end within {timeout:.0f}s\n"
                                 + self.output_tail())
            time.sleep(0.05)
        self.ended = time.time()
        return [int(p.returncode) for p in self.procs]

    def wait_for_text(self, pattern: str, timeout: float) -> re.Match[str]:
        """Wait until some launcher's output matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            self.sample()
            found = re.search(pattern, self.output())
            if found:
                return found
            if time.monotonic() > deadline or not self.running():
                raise JobTimeout(f"{self.name}: no output matching {pattern!r} within "
                                 f"{timeout:.0f}s\n" + self.output_tail())
            time.sleep(0.1)

    # ----------------------------------------------------------------- signals

    def signal(self, signum: signal.Signals) -> float:
        """Send ``signum`` to every launcher's process group; the time it was sent."""
        sent = time.time()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signum)
        return sent

    def kill(self) -> None:
        """SIGKILL every recorded process and the launchers' groups."""
        self.sample()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    # ----------------------------------------------------------------- output

    def output(self) -> str:
        return "\n".join(log.read_text(errors="replace") for log in self.logs if log.exists())

    def output_tail(self, chars: int = 6000) -> str:
        """Each launcher's output (stdout and stderr), the end of it, labelled."""
        parts = []
        for proc, log in zip(self.procs, self.logs, strict=True):
            text = log.read_text(errors="replace") if log.exists() else ""
            code = proc.poll()
            parts.append(f"----- {log.name} (pid {proc.pid}, exit {code}) -----\n"
                         + text[-chars:])
        return "\n".join(parts)

    def summary(self) -> dict[str, object]:
        """The JSON line train.py prints on rank 0 at the end."""
        for line in reversed(self.output().splitlines()):
            start = line.find('{"strategy"')
            if start >= 0:
                found: dict[str, object] = json.loads(line[start:])
                return found
        raise AssertionError(f"{self.name} printed no summary\n{self.output_tail()}")


def start(name: str, commands: Sequence[Sequence[str]], directory: Path,
          env: Mapping[str, str] | None = None) -> Job:
    """Start each command in its own session, output to ``directory/<name>-<i>.log``."""
    directory.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    full_env = {**os.environ, **(env or {})}
    for i, command in enumerate(commands):
        log = directory / f"{name}-{i}.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=full_env, cwd=ROOT,
                                          start_new_session=True))
        logs.append(log)
    job = Job(name=name, directory=directory, procs=procs, logs=logs)
    job.sample()
    return job


def fault_time(output: str, what: str) -> float:
    """The wall-clock time train.py printed with its deliberate fault ``what``."""
    found = re.search(rf"{what}.*?\(time (\d+\.\d+)\)", output)
    if found is None:
        raise AssertionError(f"the output does not mention {what!r} with a time")
    return float(found.group(1))


def load_params(path: Path) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return params


def assert_same_params(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                       what: str) -> None:
    assert actual.keys() == expected.keys(), f"{what}: parameter names differ"
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=_prefix(f"{what}, {key}"))


def _prefix(what: str) -> Callable[[str], str]:
    return lambda message: f"{what}: {message}"


def assert_checkpoint_intact(path: Path, every: int, before: int) -> int:
    """The checkpoint at ``path`` loads, is complete, and no partial file is beside it;
    its step (a multiple of ``every``, at most ``before``) is returned."""
    partial = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert not partial, f"partial checkpoint files left beside {path.name}: {partial}"
    assert path.exists(), f"no checkpoint was written at {path}"
    state = torch.load(path, weights_only=True)
    assert {"model", "optimizer", "step"} <= set(state), (
        f"the checkpoint lacks entries: it has {sorted(state)}")
    step = int(state["step"])
    assert step % every == 0 and 0 < step <= before, (
        f"the checkpoint holds step {step}; expected a multiple of {every} up to {before}")
    return step


def tool_missing(*commands: str) -> str | None:
    """Why a test cannot run here (a command not on PATH), or None."""
    absent = [c for c in commands if shutil.which(c) is None]
    if absent:
        return (f"{', '.join(absent)} not found on PATH; install them with "
                f"{SERVICES.relative_to(ROOT)} install (root, Debian)")
    return None
