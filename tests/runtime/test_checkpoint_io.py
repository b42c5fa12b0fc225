"""TorchCheckpointIO: round trips, safe loading, and saves that survive crashes."""

from __future__ import annotations

import inspect
import os
import pickle
import queue
import random
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import interlock
from interlock.strategies.io import CheckpointIO, CheckpointLoadError, TorchCheckpointIO

SRC = Path(interlock.__file__).resolve().parents[1]


def assert_same(expected: object, actual: object, where: str = "checkpoint") -> None:
    """Recursive equality with exact tensor comparison; names the first difference."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: expected a tensor, got {actual!r}"
        assert expected.dtype == actual.dtype, f"{where}: {actual.dtype} != {expected.dtype}"
        assert torch.equal(expected, actual), f"{where}: tensor values differ"
    elif isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{where}: expected a mapping, got {actual!r}"
        assert list(expected) == list(actual), f"{where}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        assert len(expected) == len(actual), f"{where}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{where}[{i}]")
    else:
        assert expected == actual and type(expected) is type(actual), (
            f"{where}: {actual!r} != {expected!r}"
        )


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --------------------------------------------------------------------------- round trip


def test_round_trip_of_model_optimizer_and_plain_values(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).square().mean().backward()
    optimizer.step()
    assert optimizer.state_dict()["state"], "after a step, Adam has per-parameter state"
    checkpoint: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 3,
        "lr": 1e-3,
        "name": "run-1",
        "history": [0.5, 0.25],
        "config": {"betas": (0.9, 0.999), "amsgrad": False, "note": None},
    }
    io = TorchCheckpointIO()
    target = tmp_path / "nested" / "dirs" / "last.ckpt"
    io.save_checkpoint(checkpoint, target)

    assert files_in(target.parent) == ["last.ckpt"], "no temporary file may remain"
    loaded = io.load_checkpoint(target)
    assert_same(checkpoint, loaded)

    restored = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    restored.load_state_dict(loaded["model"])
    torch.optim.Adam(restored.parameters(), lr=1e-3).load_state_dict(loaded["optimizer"])


def test_save_replaces_and_gives_the_mode_open_would(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "ckpt.pt"
    io.save_checkpoint({"version": 1}, target)
    io.save_checkpoint({"version": 2}, str(target))
    assert io.load_checkpoint(target) == {"version": 2}
    mask = os.umask(0o022)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask, "not mkstemp's owner-only mode"


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt") as info:
        TorchCheckpointIO().load_checkpoint(missing)
    assert info.value.filename == str(missing)


def test_remove_checkpoint_deletes_and_tolerates_a_missing_file(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "ckpt.pt"
    io.save_checkpoint({"step": 1}, target)
    io.remove_checkpoint(target)
    assert not target.exists()
    io.remove_checkpoint(target)


def test_is_a_checkpoint_io_plugin() -> None:
    io = TorchCheckpointIO()
    assert isinstance(io, CheckpointIO)
    plan = interlock.plan(accelerator="cpu", devices=1, plugins=[io], machine=interlock.Machine())
    assert plan.checkpoint_io == "TorchCheckpointIO"


# --------------------------------------------------------------------------- unsafe files


def leave_marker(path: str) -> str:
    """What the crafted pickle calls when unpickled: proof that code ran."""
    Path(path).write_text("unpickling ran code")
    return "payload ran"


class Payload:
    """Unpickles into a call of leave_marker, as a malicious checkpoint would run code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return (leave_marker, (self.marker,))


def test_pickle_that_runs_code_is_refused_unless_opted_in(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    target = tmp_path / "evil.ckpt"
    torch.save({"weights": torch.ones(2), "extra": Payload(marker)}, target)
    io = TorchCheckpointIO()

    with pytest.raises(CheckpointLoadError) as info:
        io.load_checkpoint(target)
    message = str(info.value)
    for text in (str(target), "beyond tensors and plain containers", "leave_marker",
                 "weights_only=False", "trust"):
        assert text in message, f"{text!r} missing from: {message}"
    assert isinstance(info.value.__cause__, pickle.UnpicklingError), "chain torch's error"
    assert info.value.path == str(target)
    assert not marker.exists(), "the refused file must not have run any code"

    loaded = io.load_checkpoint(target, weights_only=False)
    assert loaded["extra"] == "payload ran"
    assert marker.read_text() == "unpickling ran code", "the explicit opt-in unpickles fully"


class ShellPayload:
    """Unpickles into os.system: the classic malicious checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.command = f"touch {shlex.quote(str(marker))}"

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return (os.system, (self.command,))


def test_pickle_that_calls_os_system_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    target = tmp_path / "shell.ckpt"
    torch.save({"weights": torch.ones(2), "extra": ShellPayload(marker)}, target)
    with pytest.raises(CheckpointLoadError, match=r"beyond tensors.*system.*weights_only=False"):
        TorchCheckpointIO().load_checkpoint(target)
    assert not marker.exists(), "the refused file must not have run a shell command"


@pytest.mark.parametrize(
    ("content", "weights_only", "detail"),
    [
        (b"", True, "EOFError"),
        (b"not a checkpoint at all", True, "UnpicklingError: Unsupported operand"),
        (b"hello world garbage", True, "KeyError"),
        (b"hello world garbage", False, "UnpicklingError"),
    ],
)
def test_unreadable_files_are_a_clear_error(
    tmp_path: Path, content: bytes, weights_only: bool, detail: str
) -> None:
    target = tmp_path / "bad.ckpt"
    target.write_bytes(content)
    with pytest.raises(CheckpointLoadError, match=rf"bad.ckpt is not a readable.*{detail}"):
        TorchCheckpointIO().load_checkpoint(target, weights_only=weights_only)


def test_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "cut.ckpt"
    TorchCheckpointIO().save_checkpoint({"w": torch.zeros(10_000)}, target)
    target.write_bytes(target.read_bytes()[:1000])
    with pytest.raises(CheckpointLoadError, match="truncated or corrupt"):
        TorchCheckpointIO().load_checkpoint(target)


def test_a_non_dict_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "list.ckpt"
    torch.save([1, 2], target)
    with pytest.raises(CheckpointLoadError, match="holds a list, not a checkpoint dictionary"):
        TorchCheckpointIO().load_checkpoint(target)


def test_load_error_survives_pickling() -> None:
    error = CheckpointLoadError("/x.ckpt", "refused")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.path, str(copy)) == (CheckpointLoadError, "/x.ckpt", "refused")


# --------------------------------------------------------------------------- failed saves


class Interrupted:
    """Pickling it raises KeyboardInterrupt, as a Ctrl-C in the middle of a save would."""

    def __reduce__(self) -> tuple[Any, ...]:
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (lambda: None, (pickle.PicklingError, AttributeError)),
        (Interrupted(), (KeyboardInterrupt,)),
    ],
    ids=["unpicklable", "interrupted"],
)
def test_failed_save_keeps_the_previous_checkpoint(
    tmp_path: Path, bad: object, error: tuple[type[BaseException], ...]
) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "ckpt.pt"
    first = {"version": 1, "weights": torch.arange(1000.0)}
    io.save_checkpoint(first, target)
    with pytest.raises(error):
        io.save_checkpoint({"version": 2, "weights": torch.zeros(1000), "bad": bad}, target)
    assert files_in(tmp_path) == ["ckpt.pt"], "the temporary file must be removed"
    assert_same(first, io.load_checkpoint(target))


def test_failed_sync_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = TorchCheckpointIO()
    target = tmp_path / "ckpt.pt"
    io.save_checkpoint({"version": 1}, target)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        io.save_checkpoint({"version": 2}, target)
    monkeypatch.undo()
    assert files_in(tmp_path) == ["ckpt.pt"]
    assert io.load_checkpoint(target) == {"version": 1}


# --------------------------------------------------------------------------- SIGKILL


def make_checkpoint(version: int) -> dict[str, Any]:
    """A deterministic ~16 MB checkpoint per version (rebuilt identically by the writer)."""
    generator = torch.Generator().manual_seed(version)
    return {
        "version": version,
        "weights": torch.randn(4_000_000, generator=generator),
        "step": [version, version * 2],
    }


WRITER = """
from __future__ import annotations

import sys
from typing import Any

import torch

from interlock.strategies.io import TorchCheckpointIO

{make_checkpoint}

io = TorchCheckpointIO()
version = int(sys.argv[2])
while True:
    io.save_checkpoint(make_checkpoint(version), sys.argv[1])
    print(version, flush=True)  # printed only once the checkpoint is in place
    version += 1
"""


def read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.strip())
    lines.put(None)


def kill_writer_mid_save(
    script: Path, target: Path, start: int, delay: float, stderr_path: Path
) -> int:
    """Run the writer from version ``start``, SIGKILL it ``delay`` seconds after its first
    completed save; return the last version it reported as completed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p
    )}
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(script), str(target), str(start)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
        )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(process, lines), daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=90)
        assert first == str(start), (
            f"the writer did not complete a save ({first!r}); its stderr:\n"
            + stderr_path.read_text()
        )
        threading.Event().wait(delay)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL, "the writer should die by SIGKILL"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        reader.join(timeout=30)
    completed = [start]
    while (line := lines.get(timeout=5)) is not None:
        completed.append(int(line))
    return completed[-1]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_sigkill_during_saves_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(make_checkpoint=inspect.getsource(make_checkpoint)))
    target = tmp_path / "ckpts" / "ckpt.pt"
    io = TorchCheckpointIO()
    io.save_checkpoint(make_checkpoint(0), target)
    rng = random.Random(1234)

    for round_ in range(1, 4):
        # A random moment of a later save: mid-write, mid-sync or mid-rename.
        delay = rng.uniform(0.05, 0.6)
        last = kill_writer_mid_save(
            script, target, round_ * 1000, delay, tmp_path / "writer.stderr"
        )
        loaded = io.load_checkpoint(target)
        version = loaded["version"]
        assert last <= version <= last + 1, (
            f"round {round_} (killed {delay:.2f}s in): the file holds version {version}, but "
            f"the last completed save was {last} (only the one in flight may land after it)"
        )
        assert_same(make_checkpoint(version), loaded, f"round {round_}, version {version}")

    leftovers = [n for n in files_in(target.parent) if n != "ckpt.pt"]
    assert all(n.startswith(".ckpt.pt.") and n.endswith(".tmp") for n in leftovers), leftovers
    io.save_checkpoint(make_checkpoint(7), target)
    assert io.load_checkpoint(target)["version"] == 7, "stale temp files must not interfere"
