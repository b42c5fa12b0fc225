"""`CheckpointManager`: a directory of numbered checkpoints that a run resumes from.

A checkpoint directory holds one entry per saved step, named ``step-00000012`` (a file,
or a directory for strategies that save distributed checkpoints), and a small file
``latest`` that names the newest complete one::

    with CheckpointManager(strategy, "checkpoints", keep=2) as manager:
        start = manager.load_latest(state) or 0
        for step in range(start + 1, steps + 1):
            ...
            if step % 100 == 0:
                manager.save(step, state)

How a crash at any moment is survived:

- a checkpoint is written under a hidden staging name and renamed into place only
  once every rank has finished writing it, so a ``step-*`` name is always complete;
- ``latest`` moves only after that rename (a temporary file, synced, renamed over the
  old one, and the directory synced), so it never names a half-written checkpoint;
- old checkpoints are deleted only after ``latest`` moved, and never the one it names.

What a crash can leave behind (hidden staging and temporary names) is never read, and
is deleted by the next :meth:`CheckpointManager.save`.

Importing this module does not import torch; the manager imports the runtime when it
is made.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from interlock.strategies.base import Strategy
    from interlock.strategies.io import CheckpointIO

#: the file in a checkpoint directory that names the newest complete checkpoint
POINTER = "latest"
#: how a checkpoint is named: its step, at least 8 digits (more once steps need them)
_NAME = re.compile(r"step-(\d{8,})")
#: what a save in progress, or one a crash interrupted, leaves in the directory: hidden
#: names built from a checkpoint's (or the pointer's) name
_LEFTOVER = re.compile(r"\.+(step-\d{8,}|latest)\..*")
_STAGING_SUFFIX = ".partial"
_OLD_SUFFIX = ".old"

T = TypeVar("T")

#: how a strategy's checkpoint is written asynchronously: one file that rank 0 writes
#: through the checkpoint IO, a torch.distributed.checkpoint directory, or not at all
#: (the save blocks)
_AsyncKind = Literal["file", "distributed", "blocking"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One complete checkpoint in a :class:`CheckpointManager`'s directory.

    Attributes:
        step: the training step it was saved at.
        path: the checkpoint file, or directory for distributed checkpoints.
    """

    step: int
    path: Path


def checkpoint_name(step: int) -> str:
    """The name of ``step``'s checkpoint in a checkpoint directory (``step-00000012``)."""
    return f"step-{step:08d}"


class CheckpointManager:
    """Numbered checkpoints in one directory, the newest named by a ``latest`` pointer.

    Every rank makes a manager over the same directory, and calls :meth:`save` and
    :meth:`load_latest` together: both are collectives, like the strategy's own
    ``save_checkpoint`` and ``load_checkpoint``. Only global rank 0 moves the pointer
    and deletes old checkpoints.

    Steps must increase: saving a step below the latest one is refused. Saving the
    latest step again is allowed and replaces that checkpoint (a run that resumed from
    it and saves at the same step, or a last save at the end of training).

    With ``async_save=True``, :meth:`save` returns as soon as the state is copied, and
    the bytes go to disk while training continues; the next :meth:`save`,
    :meth:`load_latest` or :meth:`close` waits for that write, and raises its error
    there. The pointer moves only once the write is complete, so a crash during it
    leaves the previous checkpoint and pointer as they were. What is asynchronous:

    - one checkpoint file (single device, DDP, and FSDP or model parallel saving full
      checkpoints): the state dicts are taken on the calling thread, sharded ones
      gathered as a blocking save would, and copied to CPU memory (so later optimizer
      steps cannot change what is written); a thread on rank 0 then writes the file
      with the strategy's checkpoint IO, moves the pointer and deletes old checkpoints,
      without any collective;
    - a distributed checkpoint directory (FSDP ``state_dict_type="sharded"``, model
      parallel with ``save_distributed_checkpoint``): ``torch.distributed.checkpoint.
      async_save`` copies the shards to CPU memory and writes them from a thread, over a
      gloo process group of its own that the first asynchronous save creates (on every
      rank, like every save); rank 0 adds the plain values and moves the pointer once
      every rank's shards are written.

    Other checkpoints (DeepSpeed's, XLA's, and those of strategies that override
    ``save_checkpoint`` in another way) are saved blocking even with ``async_save``.

    Args:
        strategy: the strategy whose ``save_checkpoint`` and ``load_checkpoint`` write
            and read the checkpoints.
        directory: where the checkpoints go; created by the first save.
        keep: how many of the newest checkpoints to keep (at least 1).
        async_save: write checkpoints while training continues (see above).

    Attributes:
        strategy: the strategy given.
        keep: how many checkpoints are kept.
        async_save: whether saves are written while training continues.

    Raises:
        TypeError: for a strategy that is not an interlock ``Strategy``, or a ``keep``
            that is not an int.
        ValueError: for ``keep`` below 1.
        NotADirectoryError: when ``directory`` is an existing file.
    """

    def __init__(self, strategy: Strategy, directory: str | os.PathLike[str], *,
                 keep: int = 2, async_save: bool = False) -> None:
        from interlock.strategies.base import Strategy

        if not isinstance(strategy, Strategy):
            raise TypeError(f"CheckpointManager(strategy={strategy!r}): expected an interlock "
                            "Strategy (from interlock.resolve)")
        if not isinstance(keep, int) or isinstance(keep, bool):
            raise TypeError(f"CheckpointManager(keep={keep!r}): expected an int >= 1, the "
                            "number of newest checkpoints to keep")
        if keep < 1:
            raise ValueError(f"CheckpointManager(keep={keep}): expected an int >= 1; the "
                             "newest checkpoint is always kept")
        self._directory = Path(directory)
        if self._directory.exists() and not self._directory.is_dir():
            raise NotADirectoryError(
                f"CheckpointManager(directory={str(directory)!r}): that is a file; give a "
                "directory (it is created if missing)"
            )
        self.strategy = strategy
        self.keep = keep
        self.async_save = bool(async_save)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._group: ProcessGroup | None = None

    @property
    def directory(self) -> Path:
        """The checkpoint directory."""
        return self._directory

    # ----------------------------------------------------------------- reading

    def checkpoints(self) -> list[Checkpoint]:
        """Every complete checkpoint in the directory, oldest first (as this process
        sees the directory; staging and temporary names are never listed)."""
        try:
            entries = list(self._directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = [Checkpoint(int(match.group(1)), entry) for entry in entries
                 if (match := _NAME.fullmatch(entry.name)) is not None]
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        """The checkpoint the ``latest`` pointer names; None when there is none.

        When the pointer is missing, unreadable, or names a checkpoint that is not
        there, the newest complete checkpoint in the directory is the latest one (with
        a RuntimeWarning when checkpoints exist but the pointer does not name one).
        It does not wait for an asynchronous save still being written.
        """
        pointer = self._directory / POINTER
        try:
            text = pointer.read_text(encoding="utf-8").strip()
        except (FileNotFoundError, NotADirectoryError):
            problem = "is missing"
        except (OSError, UnicodeDecodeError) as error:
            problem = f"cannot be read ({type(error).__name__}: {error})"
        else:
            match = _NAME.fullmatch(text)
            if match is not None and (self._directory / text).exists():
                return Checkpoint(int(match.group(1)), self._directory / text)
            problem = (f"names {text[:80]!r}, which is not there" if match is not None
                       else f"holds {text[:80]!r}, not a checkpoint name")
        found = self.checkpoints()
        if not found:
            return None
        newest = found[-1]
        warnings.warn(f"checkpoint pointer {str(pointer)!r} {problem}; using the newest "
                      f"complete checkpoint, {str(newest.path)!r}", RuntimeWarning,
                      stacklevel=2)
        return newest

    # ----------------------------------------------------------------- saving

    def save(self, step: int, state: Mapping[str, Any]) -> Path:
        """Save ``state`` as the checkpoint of ``step`` and make it the latest one.

        A collective: call it on every rank with the same ``step``. ``state`` is what the
        strategy's ``save_checkpoint`` takes (modules, optimizers, plain values).

        Returns:
            The checkpoint's path (being written still, with ``async_save``).

        Raises:
            TypeError: for a ``step`` that is not an int, or a ``state`` that is not a
                mapping.
            ValueError: for a negative step, or one below the latest checkpoint's.
            Exception: the error of the previous asynchronous save, when it failed.
        """
        if not isinstance(step, int) or isinstance(step, bool):
            raise TypeError(f"save(step={step!r}): expected an int, the training step")
        if step < 0:
            raise ValueError(f"save(step={step}): expected a step >= 0")
        if not isinstance(state, Mapping):
            raise TypeError(f"save(state=...): expected a mapping of names to modules, "
                            f"optimizers and plain values, got {type(state).__name__}")
        strategy = self.strategy
        name = checkpoint_name(step)
        final = self._directory / name
        staging = self._directory / f".{name}{_STAGING_SUFFIX}"
        kind = _async_kind(strategy) if self.async_save else "blocking"

        def prepare() -> str | None:
            # rank 0, once the previous write is done: the step's verdict, and a clean
            # directory to write into
            latest = self.latest()
            if latest is not None and step < latest.step:
                return (f"save(step={step}): the latest checkpoint in "
                        f"{str(self._directory)!r} is step {latest.step}; steps must "
                        f"increase (saving step {latest.step} again replaces it)")
            self._directory.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
            if kind == "distributed":
                staging.mkdir()
            return None

        verdict = self._agree(prepare)
        if verdict is not None:
            raise ValueError(verdict)
        if kind == "file":
            self._save_file_async(step, staging, state)
        elif kind == "distributed":
            self._save_distributed_async(step, staging, state)
        else:
            strategy.save_checkpoint(staging, state)
            if strategy.world_size > 1:
                strategy.barrier()  # every rank has finished writing into the staging name
            self._agree(lambda: self._commit(step, staging),
                        f"making {str(final)!r} the latest checkpoint")
        return final

    def _save_file_async(self, step: int, staging: Path, state: Mapping[str, Any]) -> None:
        """The strategy's own save builds the checkpoint (gathered where sharded) and
        hands it to its checkpoint IO: a stand-in IO keeps a CPU copy of it instead, and
        a thread on rank 0 writes that copy with the real IO."""
        strategy = self.strategy
        real = strategy.checkpoint_io
        captured: list[dict[str, Any]] = []
        strategy._checkpoint_io = _capturing_io(real, captured)
        try:
            strategy.save_checkpoint(staging, state)
        finally:
            strategy._checkpoint_io = real
        if not captured:
            if strategy.is_global_zero:
                raise RuntimeError(
                    f"{type(strategy).__name__}.save_checkpoint gave its checkpoint IO "
                    "nothing to write on rank 0; save with async_save=False"
                )
            return
        checkpoint = captured[-1]

        def write() -> None:
            real.save_checkpoint(checkpoint, staging)
            self._commit(step, staging)

        self._pending = self._executor_().submit(write)

    def _save_distributed_async(self, step: int, staging: Path,
                                state: Mapping[str, Any]) -> None:
        """torch.distributed.checkpoint's asynchronous save into ``staging`` (made by
        rank 0 already); rank 0 adds the plain values and commits once it is written."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from interlock.strategies import checkpointing
        from interlock.strategies.io import digest

        strategy = self.strategy
        tensors, plain = checkpointing.split_state(strategy, state)
        plain = _cpu_copy(plain)
        if self._group is None:
            # the writer's collectives run on a thread while training runs its own on
            # the default group: they get a group of their own (made on every rank)
            self._group = dist.new_group(backend="gloo")
        written: Any = dcp.async_save(tensors, checkpoint_id=staging,
                                      process_group=self._group)
        real = strategy.checkpoint_io
        is_zero = strategy.is_global_zero

        def finish() -> None:
            # a Future (torch's default stager), or a response holding one; done on
            # rank 0 means every rank's shards and the metadata are written
            getattr(written, "upload_completion", written).result()
            if is_zero:
                real.save_checkpoint(plain, staging / checkpointing.PLAIN_FILE)
                # last, as a blocking save does: it lists every file written before it
                digest.write_manifest(staging)
                self._commit(step, staging)

        self._pending = self._executor_().submit(finish)

    def _commit(self, step: int, staging: Path) -> None:
        """Rank 0: move the written checkpoint into place, point ``latest`` at it, and
        delete what ``keep`` no longer covers."""
        if not staging.exists():
            raise RuntimeError(
                f"{type(self.strategy).__name__}.save_checkpoint wrote nothing at "
                f"{str(staging)!r}"
            )
        name = checkpoint_name(step)
        final = self._directory / name
        if final.is_file() and staging.is_file():
            os.replace(staging, final)
        else:
            old = self._directory / f".{name}{_OLD_SUFFIX}"
            if final.exists():
                final.rename(old)
            staging.rename(final)
            if old.exists():
                _remove(old)
        fsync_directory(self._directory)
        _write_pointer(self._directory, name)
        # the newest `keep` at or below this step stay; a checkpoint above it was
        # written after the one a run resumed from and never became the latest
        kept = [c for c in self.checkpoints() if c.step <= step][-self.keep:]
        for checkpoint in self.checkpoints():
            if checkpoint not in kept and checkpoint.step != step:
                _remove(checkpoint.path)

    def _remove_leftovers(self) -> None:
        for entry in self._directory.iterdir():
            if _LEFTOVER.fullmatch(entry.name):
                _remove(entry)

    # ----------------------------------------------------------------- loading

    def load_latest(self, state: dict[str, Any], **load_options: Any) -> int | None:
        """Load the newest checkpoint into ``state`` and return its step.

        A collective: rank 0 decides which checkpoint every rank loads. Modules and
        optimizers in ``state`` are restored in place and plain values are set, as the
        strategy's ``load_checkpoint`` does. A newest checkpoint that cannot be loaded
        because it is damaged (``CheckpointLoadError``, or a file of it missing) is
        skipped with a RuntimeWarning naming it and why, and the next older one is
        loaded instead.

        Args:
            state: what to restore, as ``load_checkpoint`` takes it.
            **load_options: passed on to the strategy's ``load_checkpoint``
                (``weights_only``, and what else it accepts).

        Returns:
            The step loaded, or None when the directory holds no checkpoint (``state``
            is then untouched).

        Raises:
            CheckpointLoadError: the newest checkpoint's error, when none could be loaded.
            Exception: the error of a previous asynchronous save, when it failed.
        """
        from interlock.strategies.io import CheckpointLoadError

        if not isinstance(state, dict):
            raise TypeError(f"load_latest(state=...): expected a dict of names to modules, "
                            f"optimizers and plain values, got {type(state).__name__}")
        strategy = self.strategy

        def candidates() -> list[tuple[int, str]]:
            newest = self.latest()
            if newest is None:
                return []
            older = [c for c in reversed(self.checkpoints()) if c.step < newest.step]
            return [(c.step, c.path.name) for c in [newest, *older]]

        order: list[tuple[int, str]] = self._agree(candidates)
        first: BaseException | None = None
        for index, (step, name) in enumerate(order):
            path = self._directory / name
            error: BaseException | None = None
            try:
                strategy.load_checkpoint(path, state, **load_options)
            except (CheckpointLoadError, FileNotFoundError) as caught:
                error = caught
            except Exception:  # not damage: every rank stops
                self._vote(2)
                raise
            outcome = self._vote(0 if error is None else 1)
            if outcome == 2:
                raise RuntimeError(f"another rank failed to load {str(path)!r}; see its error")
            if outcome == 0:
                return step
            reason = str(error) if error is not None else "another rank could not load it"
            if first is None:
                first = error or CheckpointLoadError(str(path), reason)
            then = ("trying the next older one" if index + 1 < len(order)
                    else "no older checkpoint is left")
            warnings.warn(f"checkpoint {str(path)!r} could not be loaded ({reason}); {then}",
                          RuntimeWarning, stacklevel=2)
        if first is not None:
            raise first
        return None

    def _vote(self, code: int) -> int:
        """The largest of every rank's outcome (0 loaded, 1 damaged, 2 other error)."""
        strategy = self.strategy
        if strategy.world_size == 1:
            return code
        import torch

        votes = torch.tensor(code, device=strategy.root_device)
        return int(strategy.all_reduce(votes, "max").item())

    # ----------------------------------------------------------------- waiting

    def _agree(self, decide: Callable[[], T], doing: str | None = None) -> T:
        """Wait for this rank's pending write; then rank 0 runs ``decide()`` and every
        rank gets its answer, or every rank raises (the original error where it
        happened, a RuntimeError naming it elsewhere, and ``doing``: what rank 0 was
        doing, by default preparing the directory)."""
        strategy = self.strategy
        error = self._wait()
        answer: T | None = None
        failed: str | None = None
        if error is not None:
            failed = f"the previous checkpoint write failed: {type(error).__name__}: {error}"
        elif strategy.is_global_zero:
            try:
                answer = decide()
            except Exception as caught:
                error = caught
                doing = doing or f"preparing {str(self._directory)!r}"
                failed = f"{doing} failed: {type(caught).__name__}: {caught}"
        if strategy.world_size > 1:
            failed, answer = strategy.broadcast((failed if strategy.is_global_zero else None,
                                                 answer))
        if error is not None:
            raise error
        if failed is not None:
            raise RuntimeError(f"on rank 0, {failed}")
        return answer  # type: ignore[return-value]

    def _wait(self) -> BaseException | None:
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            pending.result()
        except Exception as error:
            return error
        return None

    def wait(self) -> None:
        """Wait until this rank's asynchronous save (if any) is on disk, and raise its
        error. Not a collective."""
        error = self._wait()
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for this rank's pending write (raising its error) and stop the writer
        thread. Not a collective; the manager can still be used afterwards."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the body's error is the one to see
            self.close()

    def _executor_(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="interlock-checkpoint")
        return self._executor


# ------------------------------------------------------------------ helpers


def _async_kind(strategy: Strategy) -> _AsyncKind:
    """How ``strategy``'s checkpoint can be written while training continues."""
    from interlock.strategies.base import Strategy
    from interlock.strategies.fsdp import FSDPStrategy
    from interlock.strategies.io.xla_io import XLACheckpointIO
    from interlock.strategies.model_parallel import ModelParallelStrategy

    save = inspect.unwrap(type(strategy).save_checkpoint)
    if isinstance(strategy, FSDPStrategy) and save is inspect.unwrap(
            FSDPStrategy.save_checkpoint):
        distributed = strategy.state_dict_type == "sharded"
    elif isinstance(strategy, ModelParallelStrategy) and save is inspect.unwrap(
            ModelParallelStrategy.save_checkpoint):
        distributed = strategy.save_distributed_checkpoint
    elif save is Strategy.save_checkpoint:
        distributed = False
    else:
        return "blocking"
    if distributed:
        return "distributed"
    # XLA's IO runs the pending graph before it writes: that stays on the training thread
    return "blocking" if isinstance(strategy.checkpoint_io, XLACheckpointIO) else "file"


def _cpu_copy(value: Any) -> Any:
    """A deep copy of ``value`` whose tensors are copies in CPU memory (a tensor that
    appears twice is copied once, and still appears twice)."""
    import torch

    memo: dict[int, Any] = {}

    def collect(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            if id(item) not in memo:
                memo[id(item)] = item.detach().to("cpu", copy=True)
        elif isinstance(item, Mapping):
            for inner in item.values():
                collect(inner)
        elif isinstance(item, (list, tuple, set, frozenset)):
            for inner in item:
                collect(inner)

    collect(value)
    return copy.deepcopy(value, memo)


def _capturing_io(real: CheckpointIO, into: list[dict[str, Any]]) -> CheckpointIO:
    """A checkpoint IO that stands in for ``real`` during an asynchronous save: what it
    is asked to write, it appends to ``into`` as a CPU copy; reads and removals go to
    ``real``."""
    from interlock.strategies.io import CheckpointIO

    class CapturingIO(CheckpointIO):
        def save_checkpoint(self, checkpoint: dict[str, Any],
                            path: str | os.PathLike[str]) -> None:
            into.append(_cpu_copy(checkpoint))

        def load_checkpoint(self, path: str | os.PathLike[str],
                            **options: Any) -> dict[str, Any]:
            return real.load_checkpoint(path, **options)

        def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
            real.remove_checkpoint(path)

    return CapturingIO()


def _write_pointer(directory: Path, name: str) -> None:
    """Point ``latest`` at ``name``: a temporary file, synced, renamed over the pointer,
    and the directory synced, so a crash leaves the old pointer or the new one."""
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{POINTER}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(name + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, directory / POINTER)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_directory(directory)



def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


__all__ = ["POINTER", "Checkpoint", "CheckpointManager", "checkpoint_name"]


def fsync_directory(directory: Path) -> None:
    """Make renames in ``directory`` durable (the checkpoint IO's own; imported here,
    when first needed, so that ``import interlock`` does not import torch)."""
    from interlock.strategies.io.torch_io import fsync_directory as sync

    sync(directory)
