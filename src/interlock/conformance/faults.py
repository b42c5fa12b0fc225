"""Fault injection: a small training run that one rank breaks on purpose, once.

The suite's ``survives_*`` checks and the soak (``tests/soak/soak_faults.py``) launch
:func:`train` with ``max_restarts`` and a :class:`Fault`. The run is deterministic: a
fixed model, batches that are a pure function of the step, AdamW (so that optimizer
state matters) in ``32-true``, a checkpoint every :data:`SAVE_EVERY` steps, and on
every start a resume from the last checkpoint that was completely saved. The fault
fires in attempt 0 only, at one rank and one step, so the attempt after the restart
must finish with exactly the parameters and optimizer state of a run that was never
interrupted.

A run's directory holds its checkpoints (a :class:`~interlock.CheckpointManager`
directory, ``checkpoints/``, whose ``latest`` pointer moves only once every rank got
past the save), one marker per (attempt, rank) with the process id, and two small JSON files
with wall-clock times: ``fault.json`` (when and where the fault fired) and
``resumed.json`` (when the restarted attempt had loaded its checkpoint and was about
to train again).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from interlock.checkpoints import CheckpointManager
from interlock.conformance import reference
from interlock.conformance.checks import full
from interlock.strategies.module_wrapper import unwrap
from interlock.strategies.restarts import restart_attempt

#: what a fault can be
FAULT_KINDS = ("kill", "raise_in_backward", "hang", "kill_during_save")
#: optimizer steps in a run
STEPS = 8
#: a checkpoint is saved after every this many steps (and labelled with the steps done)
SAVE_EVERY = 2
LR = 1e-2
#: a rank that hangs sleeps this long at most, should nothing ever stop it
HANG_S = 600.0

FAULT_FILE = "fault.json"
RESUMED_FILE = "resumed.json"
#: the run's CheckpointManager directory
CHECKPOINTS = "checkpoints"

#: the real functions, for this module's own files while a save has them patched
_REPLACE = os.replace


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One failure, injected in the first attempt of a run.

    Attributes:
        kind: ``"kill"`` (SIGKILL before the step's forward), ``"raise_in_backward"``
            (a gradient hook raises inside the step's ``backward``), ``"hang"`` (the rank
            sleeps before the step's first collective, so the others' collective times
            out), or ``"kill_during_save"`` (SIGKILL in the first checkpoint save made
            after step ``step``: after the bytes were written, before they were
            renamed into place; a rank that writes no file itself dies as its save
            returns, before the save is recorded as complete).
        rank: the global rank it fires in.
        step: the step (0-based) it fires at.
    """

    kind: str
    rank: int
    step: int

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r}: expected one of {FAULT_KINDS}")
        if not 0 <= self.step < STEPS:
            raise ValueError(f"fault step {self.step}: expected 0 to {STEPS - 1}")
        if self.rank < 0:
            raise ValueError(f"fault rank {self.rank}: expected at least 0")

    def resumes_from(self) -> int:
        """The checkpoint (steps done) the attempt after this fault resumes from."""
        if self.kind == "kill_during_save":
            interrupted = (self.step // SAVE_EVERY + 1) * SAVE_EVERY
            return interrupted - SAVE_EVERY
        return self.step // SAVE_EVERY * SAVE_EVERY


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: a function of the step alone."""
    g = torch.Generator().manual_seed(step)
    return (torch.randn(reference.BATCH, reference.FEATURES, generator=g),
            torch.randn(reference.BATCH, 1, generator=g))


# ------------------------------------------------------------------ in every rank


def train(strategy: Any, directory: str, fault: Fault | None = None) -> dict[str, Any]:
    """Every rank's work: resume from the last complete checkpoint in ``directory``,
    train to :data:`STEPS` (the fault firing on the way in attempt 0), and return the
    full parameters and optimizer state on the CPU, with the attempt and the step it
    resumed from."""
    root = Path(directory)
    attempt = restart_attempt()
    rank = int(strategy.global_rank)
    (root / f"attempt-{attempt}-rank-{rank}.pid").write_text(str(os.getpid()))
    armed = fault if fault is not None and attempt == 0 and fault.rank == rank else None
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _train(strategy, root, attempt, armed)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def _train(strategy: Any, root: Path, attempt: int, fault: Fault | None) -> dict[str, Any]:
    net = reference.model()
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    module, (opt,) = strategy.setup_module_and_optimizers(net, [opt])
    state: dict[str, Any] = {"model": module, "optimizer": opt, "step": 0}
    manager = CheckpointManager(strategy, root / CHECKPOINTS, keep=2)
    start = manager.load_latest(state) or 0
    if state["step"] != start:
        raise RuntimeError(f"the checkpoint of step {start} holds step {state['step']}")
    if attempt and strategy.is_global_zero:
        _write_json(root / RESUMED_FILE, {"attempt": attempt, "from_step": start,
                                          "at": time.time()})
    for step in range(start, STEPS):
        if fault is not None and fault.step == step:
            fire_before_step(fault, root, module)
        x, y = batch(step)
        size, index = strategy.data_parallel_size, strategy.data_parallel_rank
        x, y = strategy.batch_to_device((x.chunk(size)[index], y.chunk(size)[index]))
        loss = torch.nn.functional.mse_loss(module(x).float(), y)
        strategy.backward(loss, module)
        strategy.optimizer_step(opt)
        opt.zero_grad()
        if (step + 1) % SAVE_EVERY == 0:
            state["step"] = step + 1
            dying = fault is not None and fault.kind == "kill_during_save" and step >= fault.step
            _save(strategy, manager, root, step + 1, state, fault if dying else None)
    manager.close()
    return {"params": full(module.state_dict()), "optimizer": full(opt.state_dict()),
            "attempt": attempt, "resumed_from": start}


def _save(strategy: Any, manager: CheckpointManager, root: Path, done: int,
          state: Mapping[str, Any], fault: Fault | None) -> None:
    """The checkpoint of ``done`` steps through the manager; with ``fault``, this rank
    dies inside the save: once it has written and synced a file of its own, or, when
    it writes none (a DDP rank other than 0), when the strategy's own save returns,
    before the manager has made the checkpoint the latest one."""
    if fault is None:
        manager.save(done, state)
        return
    own_save = strategy.save_checkpoint

    def dying_save(path: Any, saved: Mapping[str, Any]) -> None:
        with _die_before_rename(fault, root):
            own_save(path, saved)
        _die(fault, root, "after its part of the save, before the save was recorded")

    strategy.save_checkpoint = dying_save
    try:
        manager.save(done, state)
    finally:
        del strategy.save_checkpoint  # the class's method again


def fire_before_step(fault: Fault, root: Path, module: Any) -> None:
    if fault.kind == "kill":
        _die(fault, root, "before the step's forward")
    elif fault.kind == "hang":
        _record(fault, root, "sleeping before the step's first collective")
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            time.sleep(1)
        os._exit(3)  # nothing stopped it: leave no process behind
    elif fault.kind == "raise_in_backward":
        _raise_in_backward(fault, root, module)


def _raise_in_backward(fault: Fault, root: Path, module: Any) -> None:
    """Make the next backward raise from a hook on the gradient of the first layer's
    output: part of the gradients is computed when it fires, the rest never is. (A hook
    on a parameter would not fire under FSDP2, whose sharded parameters are not the
    ones autograd sees.)"""
    first = next(m for m in unwrap(module).modules() if isinstance(m, torch.nn.Linear))

    def fail(grad: torch.Tensor) -> torch.Tensor:
        _record(fault, root, "inside loss.backward()")
        raise RuntimeError(f"injected fault: rank {fault.rank} raises in backward at step "
                           f"{fault.step}")

    def arm(mod: torch.nn.Module, args: Any, output: Any) -> None:
        handle.remove()
        output.register_hook(fail)

    handle = first.register_forward_hook(arm)


@contextlib.contextmanager
def _die_before_rename(fault: Fault, root: Path) -> Iterator[None]:
    """While saving, this process kills itself once it has written and synced a file
    (``os.fsync``), or at the latest when it is about to rename one into place."""
    saved = os.fsync, os.replace, os.rename

    def synced(fd: Any) -> None:
        saved[0](fd)
        _die(fault, root, "after writing and syncing, before the rename")

    def renaming(*args: Any, **kwargs: Any) -> None:
        _die(fault, root, "before the rename")

    os.fsync, os.replace, os.rename = synced, renaming, renaming
    try:
        yield
    finally:
        os.fsync, os.replace, os.rename = saved


def _die(fault: Fault, root: Path, where: str) -> None:
    _record(fault, root, where)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is delivered before this ends


def _record(fault: Fault, root: Path, where: str) -> None:
    _write_json(root / FAULT_FILE, {**asdict(fault), "where": where, "pid": os.getpid(),
                                    "at": time.time()})


def _write_json(path: Path, value: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(value))
    _REPLACE(temp, path)


# ------------------------------------------------------------------ the launching side


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a run left behind.

    Attributes:
        fault: the fault record (``fault.json``), or None when none fired.
        resumed: the restarted attempt's record (``resumed.json``), or None.
        attempts: the attempts any rank started, in order.
    """

    fault: dict[str, Any] | None
    resumed: dict[str, Any] | None
    attempts: tuple[int, ...]

    @property
    def recovery_s(self) -> float | None:
        """Seconds from the fault to the restarted attempt ready to train again."""
        if self.fault is None or self.resumed is None:
            return None
        return float(self.resumed["at"]) - float(self.fault["at"])


def outcome(directory: str | Path) -> Outcome:
    """Read what the run in ``directory`` recorded."""
    root = Path(directory)

    def read(name: str) -> dict[str, Any] | None:
        path = root / name
        return dict(json.loads(path.read_text())) if path.exists() else None

    markers = sorted(root.glob("attempt-*-rank-*.pid"))
    attempts = sorted({int(p.name.split("-")[1]) for p in markers})
    return Outcome(fault=read(FAULT_FILE), resumed=read(RESUMED_FILE),
                   attempts=tuple(attempts))


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` differs from ``want``, bit for bit (tensors with ``torch.equal``,
    dtypes included; dictionaries key by key)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return [f"{where}: {type(got).__name__}, expected a tensor"]
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            diff = ""
            if got.shape == want.shape and got.dtype == want.dtype and want.is_floating_point():
                diff = f", max |difference| {(got - want).abs().max().item():.3g}"
            return [f"{where}: differs ({got.dtype}{list(got.shape)} vs "
                    f"{want.dtype}{list(want.shape)}{diff})"]
        return []
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return [f"{where}: {type(got).__name__}, expected a mapping"]
        problems = [f"{where}[{k!r}]: missing" for k in want if k not in got]
        problems += [f"{where}[{k!r}]: unexpected" for k in got if k not in want]
        for key in want:
            if key in got:
                problems += differences(got[key], want[key], f"{where}[{key!r}]")
        return problems
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{where}: {got!r:.80}, expected {want!r:.80}"]
        return [p for i, (g, w) in enumerate(zip(got, want, strict=True)) for p in
                differences(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: {got!r:.80}, expected {want!r:.80}"]


def final_state(result: Any) -> dict[str, Any]:
    """The parameters and optimizer state a run returned, to compare with another's."""
    if not (isinstance(result, dict) and isinstance(result.get("params"), dict)
            and result["params"]):
        raise TypeError(f"the run returned {type(result).__name__} through launch(), not "
                        "rank 0's parameters and optimizer state")
    return {"params": result["params"], "optimizer": result["optimizer"]}


def prepare(directory: Path) -> None:
    """An empty run directory (what an earlier run left there is removed)."""
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def restart_problems(fault: Fault, result: Any, record: Outcome) -> list[str]:
    """What is wrong with how a faulted run restarted: the fault must have fired where
    asked, and exactly one restart must have resumed from the expected checkpoint."""
    problems = []
    if record.fault is None:
        problems.append(f"the {fault.kind} fault never fired (rank {fault.rank}, step "
                        f"{fault.step})")
    elif (record.fault["rank"], record.fault["step"]) != (fault.rank, fault.step):
        problems.append(f"the fault fired at {record.fault}, expected rank {fault.rank} "
                        f"step {fault.step}")
    if record.attempts != (0, 1):
        problems.append(f"the ranks ran attempts {list(record.attempts)}; expected exactly "
                        "one restart (attempts 0 and 1)")
    attempt = result.get("attempt") if isinstance(result, dict) else None
    if attempt != 1:
        problems.append(f"launch returned the result of attempt {attempt}, expected 1")
    resumed = result.get("resumed_from") if isinstance(result, dict) else None
    if resumed != fault.resumes_from():
        problems.append(f"the restarted attempt resumed from step {resumed}, expected the "
                        f"checkpoint of step {fault.resumes_from()}")
    return problems

