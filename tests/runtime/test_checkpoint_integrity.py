"""Checkpoints that cannot lie: damaged files are refused, loads are all or nothing,
and a full disk is reported as such.

Files are damaged the way a user (or a failing disk) would: cut short, overwritten,
added to, emptied. Every case must raise CheckpointLoadError naming the path.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import workloads
from harness import launch_forked
from torch import nn

import interlock
from interlock.strategies import checkpointing
from interlock.strategies.base import Strategy
from interlock.strategies.environments.local import LocalEnvironment
from interlock.strategies.fsdp import FSDPStrategy
from interlock.strategies.io import CheckpointIO, CheckpointLoadError, TorchCheckpointIO, digest
from interlock.strategies.io.base import PathLike
from interlock.strategies.module_wrapper import StrategyModule
from interlock.strategies.precision import Precision
from interlock.strategies.xla import XLAFSDPStrategy

CPU = interlock.Machine()


def single() -> Strategy:
    return interlock.resolve(accelerator="cpu", machine=CPU)


def payload() -> dict[str, Any]:
    """An ~80 KB checkpoint: offsets past 4 KiB and its middle fall in tensor data."""
    generator = torch.Generator().manual_seed(0)
    return {"weights": torch.randn(20_000, generator=generator), "step": 3}


def other_files(directory: Path, keep: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != keep)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt.pt"
    TorchCheckpointIO().save_checkpoint(payload(), path)
    return path


# --------------------------------------------------------------------------- file format


def test_the_trailer_is_written_after_the_archive_and_plain_torch_still_loads(
        saved: Path) -> None:
    data = saved.read_bytes()
    tail = data[-digest.TRAILER_SIZE:]
    assert tail.startswith(digest.MAGIC), "the file does not end with a digest trailer"
    archive = data[:-digest.TRAILER_SIZE]
    hashed = digest.new_hash()
    hashed.update(archive)
    assert tail == digest.trailer(len(archive), hashed.digest())
    loaded = torch.load(saved, weights_only=True)  # plain torch ignores the trailer
    assert torch.equal(loaded["weights"], payload()["weights"]) and loaded["step"] == 3
    assert other_files(saved.parent, "ckpt.pt") == [], "no temporary file may remain"


def test_a_file_written_by_plain_torch_save_still_loads_unverified(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save(payload(), path)
    loaded = TorchCheckpointIO().load_checkpoint(path)
    assert torch.equal(loaded["weights"], payload()["weights"])


def test_a_missing_file_is_still_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TorchCheckpointIO().load_checkpoint(tmp_path / "nope.pt")


# --------------------------------------------------------------------------- damaged files


def cut_at(offset: Callable[[int], int]) -> Callable[[bytes], bytes]:
    return lambda data: data[:offset(len(data))]


def overwrite_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64]) + data[
        middle + 64:]


def flip_trailer_byte(at: int) -> Callable[[bytes], bytes]:
    def flip(data: bytes) -> bytes:
        index = len(data) - digest.TRAILER_SIZE + at
        return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1:]
    return flip


DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "cut-just-after-4KiB": (cut_at(lambda n: 4096 + 1), "truncated"),
    "cut-in-the-middle": (cut_at(lambda n: n // 2), "truncated"),
    "cut-last-byte": (cut_at(lambda n: n - 1), "it is 1 byte shorter than written"),
    "cut-into-the-trailer": (cut_at(lambda n: n - 40), "it is 40 bytes shorter than written"),
    "64-bytes-overwritten": (overwrite_middle, "does not match the digest written with it"),
    "trailer-magic-flipped": (flip_trailer_byte(0), "not an interlock digest trailer"),
    "trailer-version-flipped": (flip_trailer_byte(8), "format version"),
    "trailer-length-flipped": (flip_trailer_byte(12), "than its digest trailer records"),
    "trailer-digest-flipped": (flip_trailer_byte(digest.TRAILER_SIZE - 1),
                               "does not match the digest written with it"),
    "garbage-appended": (lambda data: data + b"garbage!" * 16,
                         "128 bytes were added after its digest trailer"),
    "empty": (lambda data: b"", "the file is empty"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_file_is_refused_naming_the_path(saved: Path, case: str) -> None:
    damage, what = DAMAGE[case]
    saved.write_bytes(damage(saved.read_bytes()))
    with pytest.raises(CheckpointLoadError) as info:
        TorchCheckpointIO().load_checkpoint(saved)
    assert info.value.path == str(saved)
    assert str(saved) in str(info.value) and what in str(info.value), str(info.value)


def test_a_strategy_refuses_a_damaged_file_too(saved: Path) -> None:
    saved.write_bytes(overwrite_middle(saved.read_bytes()))
    state: dict[str, Any] = {"weights": None, "step": 0}
    with pytest.raises(CheckpointLoadError, match="damaged after saving"):
        single().load_checkpoint(saved, state)
    assert state == {"weights": None, "step": 0}


def test_verify_false_loads_the_overwritten_file_as_documented(saved: Path) -> None:
    saved.write_bytes(overwrite_middle(saved.read_bytes()))
    loaded = TorchCheckpointIO().load_checkpoint(saved, verify=False)
    assert not torch.equal(loaded["weights"], payload()["weights"]), (
        "the overwritten bytes should be in the tensor data: this is the trade verify=False "
        "makes")
    state: dict[str, Any] = {"weights": None}
    single().load_checkpoint(saved, state, verify=False)
    assert state["weights"] is not None


@pytest.mark.parametrize("offset", [4096 + 1, 40_000], ids=["after-4KiB", "middle"])
def test_a_truncated_plain_torch_file_is_a_load_error_not_a_bare_os_error(
        tmp_path: Path, offset: int) -> None:
    path = tmp_path / "old.pt"
    torch.save(payload(), path)
    path.write_bytes(path.read_bytes()[:offset])
    for verify in (True, False):
        with pytest.raises(CheckpointLoadError, match="truncated") as info:
            TorchCheckpointIO().load_checkpoint(path, verify=verify)
        assert info.value.path == str(path) and str(path) in str(info.value)


def test_a_directory_given_as_a_file_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointLoadError, match="is a directory"):
        TorchCheckpointIO().load_checkpoint(tmp_path)


class OldSignatureIO(CheckpointIO):
    """A third-party checkpoint IO written before ``verify`` existed."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike) -> None:
        torch.save(checkpoint, path)

    def load_checkpoint(  # type: ignore[override]  # the old signature, on purpose
            self, path: PathLike, *, map_location: str | torch.device | None = None,
            weights_only: bool = True) -> dict[str, Any]:
        self.calls.append({"map_location": map_location, "weights_only": weights_only})
        loaded: dict[str, Any] = torch.load(path, map_location=map_location,
                                             weights_only=weights_only)
        return loaded

    def remove_checkpoint(self, path: PathLike) -> None:
        os.remove(path)


def test_a_checkpoint_io_without_verify_keeps_working(tmp_path: Path) -> None:
    io = OldSignatureIO()
    strategy = interlock.resolve(accelerator="cpu", plugins=[io], machine=CPU)
    assert strategy.checkpoint_io is io
    model = nn.Linear(3, 2)
    strategy.save_checkpoint(tmp_path / "c.pt", {"model": model, "step": 4})
    for verify in (True, False):
        state: dict[str, Any] = {"model": nn.Linear(3, 2), "step": 0}
        strategy.load_checkpoint(tmp_path / "c.pt", state, verify=verify)
        assert state["step"] == 4 and torch.equal(state["model"].weight, model.weight)
    assert io.calls == [{"map_location": "cpu", "weights_only": True}] * 2


# --------------------------------------------------------------------------- all or nothing


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            out[name] = {k: v.detach().clone() for k, v in value.state_dict().items()}
        elif isinstance(value, torch.optim.Optimizer):
            out[name] = workloads.full(value.state_dict())
        else:
            out[name] = value
    return out


def assert_unchanged(before: dict[str, Any], state: dict[str, Any]) -> None:
    after = snapshot(state)
    assert after.keys() == before.keys()
    for name in before:
        assert workloads._same(before[name], after[name]), f"{name!r} changed: {after[name]}"


def trained(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 1) -> None:
    for _ in range(steps):
        dtype = next(model.parameters()).dtype
        model(torch.ones(2, model_inputs(model), dtype=dtype)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def model_inputs(model: nn.Module) -> int:
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    return first.in_features


def save_adam(path: Path, model: nn.Module, **plain: Any) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    trained(model, optimizer, 2)
    single().save_checkpoint(path, {"model": model, "optimizer": optimizer, **plain})


def fresh_state(model: nn.Module) -> dict[str, Any]:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    trained(model, optimizer)  # live optimizer state that a half-load would overwrite
    return {"model": model, "optimizer": optimizer, "step": 0}


MISFITS: dict[str, tuple[Callable[[], nn.Module], Callable[[], nn.Module], str]] = {
    "other-shape": (lambda: nn.Linear(8, 4), lambda: nn.Linear(16, 4),
                    "module 'model': weight: saved shape (4, 8), this model has (4, 16)"),
    "other-dtype": (lambda: nn.Linear(8, 4), lambda: nn.Linear(8, 4).double(),
                    "module 'model': weight: saved as float32, this model has float64"),
    "missing-key": (lambda: nn.Linear(8, 4, bias=False), lambda: nn.Linear(8, 4),
                    "module 'model': bias: not in the checkpoint"),
    "unexpected-key": (lambda: nn.Linear(8, 4), lambda: nn.Linear(8, 4, bias=False),
                       "module 'model': bias: in the checkpoint, not in this model"),
}


@pytest.mark.parametrize("case", list(MISFITS))
def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path: Path, case: str) -> None:
    make_saved, make_live, message = MISFITS[case]
    path = tmp_path / "c.pt"
    save_adam(path, make_saved(), step=7)
    state = fresh_state(make_live())
    before = snapshot(state)
    with pytest.raises(CheckpointLoadError) as info:
        single().load_checkpoint(path, state)
    assert message in str(info.value) and "nothing was restored" in str(info.value)
    assert info.value.path == str(path)
    assert_unchanged(before, state)


def test_an_optimizer_over_other_shapes_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    model = nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    trained(model, optimizer)
    single().save_checkpoint(path, {"optimizer": optimizer, "step": 7})
    live = nn.Linear(16, 4)
    state: dict[str, Any] = {"optimizer": torch.optim.Adam(live.parameters()), "step": 0}
    trained(live, state["optimizer"])
    before = snapshot(state)
    with pytest.raises(CheckpointLoadError,
                       match=r"parameter 0 exp_avg: saved shape \(4, 8\), this optimizer "
                             r"holds \(4, 16\)"):
        single().load_checkpoint(path, state)
    assert_unchanged(before, state)
    fresh = nn.Linear(16, 4)  # no state yet: compared with the parameter itself
    state = {"optimizer": torch.optim.Adam(fresh.parameters()), "step": 0}
    with pytest.raises(CheckpointLoadError,
                       match=r"exp_avg: saved shape \(4, 8\), its parameter has \(4, 16\)"):
        single().load_checkpoint(path, state)
    assert state["step"] == 0 and not state["optimizer"].state


def test_an_optimizer_with_other_groups_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    model = nn.Linear(8, 4)
    single().save_checkpoint(path, {"optimizer": torch.optim.SGD(model.parameters(), lr=1)})
    groups: list[dict[str, Any]] = [{"params": [model.weight]}, {"params": [model.bias]}]
    with pytest.raises(CheckpointLoadError, match="saved with 1 parameter group"):
        single().load_checkpoint(path, {"optimizer": torch.optim.SGD(groups, lr=1)})
    with pytest.raises(CheckpointLoadError, match="saved with 2 parameters, this optimizer "
                                                  "has 1"):
        single().load_checkpoint(path, {"optimizer": torch.optim.SGD([model.weight], lr=1)})


class FailsOnSecondLayer(nn.Module):
    """Loading its state dict fails after the first layer was already copied."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 4)
        self.second = nn.Linear(4, 2)
        self.fail = False
        self.second.register_load_state_dict_pre_hook(  # type: ignore[no-untyped-call]
            self._maybe_fail)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))  # type: ignore[no-any-return]

    def _maybe_fail(self, *args: Any) -> None:
        if self.fail:
            raise RuntimeError("the disk went away")


class RefusesKey(dict[str, Any]):
    """A state dict whose ``refused`` entry cannot be set (after ``step`` was)."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "refused":
            raise RuntimeError("cannot set this entry")
        super().__setitem__(key, value)


def test_a_restore_that_fails_half_way_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    model = FailsOnSecondLayer()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    trained(model, optimizer, 2)
    single().save_checkpoint(path, {"model": model, "optimizer": optimizer, "step": 7})
    state = fresh_state(FailsOnSecondLayer())
    state["model"].fail = True
    weight = state["model"].first.weight
    before = snapshot(state)
    with pytest.raises(CheckpointLoadError, match=r"failed half-way.*disk went away.*put back"):
        single().load_checkpoint(path, state)
    assert_unchanged(before, state)
    assert state["model"].first.weight is weight, "the parameter object was replaced"

    # a failure after modules and optimizers were restored: all of them are rolled back
    ok = fresh_state(nn.Sequential(nn.Linear(8, 4)))
    single().save_checkpoint(path, {"model": nn.Sequential(nn.Linear(8, 4)),
                                    "optimizer": torch.optim.Adam(
                                        nn.Linear(8, 4).parameters()),
                                    "step": 7, "refused": 1})
    refusing = RefusesKey(model=ok["model"], optimizer=ok["optimizer"], step=0, refused=0)
    before = snapshot(refusing)
    with pytest.raises(CheckpointLoadError, match="cannot set this entry"):
        single().load_checkpoint(path, refusing)
    assert_unchanged(before, refusing)
    assert refusing["step"] == 0, "the plain value set before the failure was not restored"


class Sharded(nn.Module):
    """Stands in for XLA's FSDP wrapper: its state dict (the shards) is keyed under
    the wrapper, unlike the user's module inside it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.wrapped = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x)  # type: ignore[no-any-return]

    def get_shard_metadata(self, world_size: int = 1) -> dict[str, Any]:
        """What torch_xla's wrapper says of its shards: each parameter's original name
        and size."""
        return {"shard_info": {"": {
            f"shard{i}": {"_orig_name": f"_fsdp_wrapped_module._fpw_module.{name}",
                          "_orig_size": param.shape}
            for i, (name, param) in enumerate(self.wrapped.named_parameters())}},
            "flatten_info": {}, "buffer_info": {}, "world_size": world_size, "rank": 0}


def xla_fsdp() -> XLAFSDPStrategy:
    """Built with its parts, which needs no XLA machine: torch_xla runs the real load
    in ``nox -s xla`` (tests/runtime/test_deepspeed_and_xla.py)."""
    return XLAFSDPStrategy(precision=Precision(), checkpoint_io=TorchCheckpointIO(),
                           cluster_environment=LocalEnvironment())


def xla_fsdp_state(inner: nn.Module) -> dict[str, Any]:
    module = StrategyModule(Sharded(inner), inner, Precision())
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    trained(module, optimizer)
    return {"model": module, "optimizer": optimizer, "step": 0}


def save_xla_fsdp_rank(directory: Path, state: dict[str, Any], world_size: int = 1,
                       **entries: Any) -> None:
    """Rank 0's file as XLAFSDPStrategy.save_checkpoint writes it (which needs torch_xla)."""
    wrapper = state["model"].forward_module
    shards = {"model": {"model": wrapper.state_dict(),
                        "shard_metadata": wrapper.get_shard_metadata(world_size)},
              "optimizer": state["optimizer"].state_dict(), "step": 7, **entries}
    xla_fsdp().checkpoint_io.save_checkpoint(shards, directory / "rank-0.pt")


def test_xla_fsdp_loads_its_shard_files_all_or_nothing(tmp_path: Path) -> None:
    saved = xla_fsdp_state(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)))
    trained(saved["model"], saved["optimizer"], 2)
    save_xla_fsdp_rank(tmp_path, saved, extra="kept")
    strategy = xla_fsdp()

    # shards that do not fit: refused before anything changes
    state = xla_fsdp_state(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 3)))
    before = snapshot(state)
    with pytest.raises(CheckpointLoadError, match=r"module 'model': 1\.weight: saved "
                                                  r"shape \(2, 4\), this model has \(3, 4\)"):
        strategy.load_checkpoint(tmp_path, state)
    assert_unchanged(before, state)

    # shards cut for another world size: refused by name, with the way out
    (tmp_path / "w").mkdir()
    save_xla_fsdp_rank(tmp_path / "w", saved, world_size=2)
    state = xla_fsdp_state(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)))
    before = snapshot(state)
    with pytest.raises(CheckpointLoadError, match=r"shards of 2 rank\(s\), this run has 1.*"
                                                  r"consolidate_sharded_model_checkpoints"):
        strategy.load_checkpoint(tmp_path / "w", state)
    assert_unchanged(before, state)

    # a restore that fails half-way (the second layer, after the first was copied)
    (tmp_path / "f").mkdir()
    save_xla_fsdp_rank(tmp_path / "f", xla_fsdp_state(FailsOnSecondLayer()))
    state = xla_fsdp_state(FailsOnSecondLayer())
    state["model"].module.fail = True
    before = snapshot(state)
    with pytest.raises(CheckpointLoadError, match=r"failed half-way.*disk went away.*put back"):
        strategy.load_checkpoint(tmp_path / "f", state)
    assert_unchanged(before, state)

    # an entry that is not a module's shards (a plain state dict): refused by name
    (tmp_path / "p").mkdir()
    xla_fsdp().checkpoint_io.save_checkpoint(
        {"model": saved["model"].state_dict()}, tmp_path / "p" / "rank-0.pt")
    with pytest.raises(CheckpointLoadError, match=r"entry 'model' is not a module's shards"):
        strategy.load_checkpoint(tmp_path / "p", {"model": state["model"]})

    # a file that fits loads into the wrapper, plain values and all
    state = xla_fsdp_state(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)))
    rest = strategy.load_checkpoint(tmp_path, state)
    assert rest == {"extra": "kept"} and state["step"] == 7
    assert_unchanged({**snapshot(saved), "step": 7}, state)


def test_xla_fsdps_module_refuses_what_is_not_a_state_dict() -> None:
    """XLAFSDPModule.load_state_dict, given a path or nothing: torch's TypeError, not an
    AttributeError from inside, and the module unchanged."""
    from typeguard import suppress_type_checks

    from interlock.strategies.xla import XLAFSDPModule

    inner = nn.Linear(2, 2)
    module = XLAFSDPModule(Sharded(inner), inner, Precision())
    before = {k: v.clone() for k, v in inner.state_dict().items()}
    for junk in (None, "ckpt.pt", [1]):
        with suppress_type_checks(), pytest.raises(
                TypeError, match=r"load_state_dict\(\) takes a state dict .* got "
                                 f"{type(junk).__name__}"):
            module.load_state_dict(junk)
    assert all(torch.equal(v, before[k]) for k, v in inner.state_dict().items())


# --------------------------------------------------------------------------- full disk


def assert_full_disk_error(error: OSError, directory: Path) -> None:
    assert error.errno == errno.ENOSPC, error
    assert error.filename == str(directory)
    text = str(error)
    assert f"no space left on {directory}: needed about " in text, text
    assert " MB, " in text and " MB free" in text, text


@pytest.fixture
def failing_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int, int], None]]:
    """``fail(after, code)``: the checkpoint's temporary file takes ``after`` bytes, then
    every write fails with ``code``; other files are untouched."""
    temp_fds: set[int] = set()
    real_mkstemp, real_write = tempfile.mkstemp, os.write
    budget = {"left": 0, "code": errno.ENOSPC}

    def recording_mkstemp(*args: Any, **kwargs: Any) -> tuple[int, str]:
        fd, name = real_mkstemp(*args, **kwargs)
        temp_fds.add(fd)
        return fd, name

    def limited_write(fd: int, data: Any) -> int:
        if fd not in temp_fds:
            return real_write(fd, data)
        if budget["left"] <= 0:
            raise OSError(budget["code"], os.strerror(budget["code"]))
        size = min(len(memoryview(data).cast("B")), budget["left"])
        budget["left"] -= size
        return real_write(fd, memoryview(data).cast("B")[:size])

    def fail(after: int, code: int) -> None:
        budget.update(left=after, code=code)
        monkeypatch.setattr(tempfile, "mkstemp", recording_mkstemp)
        monkeypatch.setattr(os, "write", limited_write)

    yield fail
    monkeypatch.undo()


def assert_4mb_save_refused_and_previous_kept(io: TorchCheckpointIO, path: Path) -> None:
    """Saving 4 MB over ``path`` on a full disk: the full-disk error naming the
    directory and the size, no temporary file left, the previous checkpoint intact."""
    with pytest.raises(OSError) as info:
        io.save_checkpoint({"weights": torch.zeros(1_000_000)}, path)
    assert_full_disk_error(info.value, path.parent)
    assert "needed about 4.0 MB" in str(info.value), str(info.value)
    assert other_files(path.parent, path.name) == [], "the temporary file must be removed"
    assert torch.equal(io.load_checkpoint(path)["weights"], payload()["weights"])


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(
        tmp_path: Path, failing_writes: Callable[[int, int], None], code: int) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "ckpt.pt"
    io.save_checkpoint(payload(), path)
    failing_writes(50_000, code)
    assert_4mb_save_refused_and_previous_kept(io, path)


def test_torchs_short_write_message_becomes_the_full_disk_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "ckpt.pt"
    io.save_checkpoint(payload(), path)

    def short_write(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 896 "
                           "vs 790")

    monkeypatch.setattr(torch, "save", short_write)
    with pytest.raises(OSError) as info:
        io.save_checkpoint(payload(), path)
    monkeypatch.undo()
    assert_full_disk_error(info.value, tmp_path)
    assert other_files(tmp_path, "ckpt.pt") == []
    assert io.load_checkpoint(path)["step"] == 3


def test_another_write_error_stays_itself(
        tmp_path: Path, failing_writes: Callable[[int, int], None]) -> None:
    path = tmp_path / "ckpt.pt"
    failing_writes(1000, errno.EIO)
    with pytest.raises(OSError) as info:
        TorchCheckpointIO().save_checkpoint(payload(), path)
    assert info.value.errno == errno.EIO and "no space" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def mount_small_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``where``; the reason it cannot be done, or None."""
    if not sys.platform.startswith("linux"):
        return "tmpfs mounts need Linux"
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root (the injected-ENOSPC test covers this)"
    if shutil.which("mount") is None:
        return "no mount command"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"mount -t tmpfs failed here: {done.stderr.strip() or done.returncode}"
    return None


def test_a_really_full_tmpfs_says_so_and_keeps_the_previous_checkpoint(
        tmp_path: Path) -> None:
    small = tmp_path / "small"
    reason = mount_small_tmpfs(small, "1m")
    if reason is not None:
        pytest.skip(reason)
    try:
        io = TorchCheckpointIO()
        path = small / "ckpt.pt"
        io.save_checkpoint(payload(), path)
        assert_4mb_save_refused_and_previous_kept(io, path)
    finally:
        subprocess.run(["umount", str(small)], check=False)


# --------------------------------------------------------------------------- sharded ranks


def fsdp(**options: Any) -> FSDPStrategy:
    strategy = interlock.resolve(strategy=FSDPStrategy(**options), accelerator="cpu",
                                 devices=2, machine=CPU)
    assert isinstance(strategy, FSDPStrategy)
    return strategy


def _outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except CheckpointLoadError as error:
        return f"CheckpointLoadError({error.path}): {error}"
    except Exception as error:  # reported as the result
        return f"{type(error).__name__}: {error}"
    return "loaded"


def sharded_checks(strategy: Strategy, root: str) -> dict[str, Any]:
    """Every check of sharded saves and loads, in one launch of 2 ranks; each outcome
    is gathered from both ranks."""
    base = Path(root)
    full_path, directory = base / "full.pt", base / "sharded"
    net = strategy.setup_module(workloads.model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    for k in range(2):
        x, y = workloads.batch(k)
        x, y = workloads.share(x, strategy), workloads.share(y, strategy)
        strategy.backward(nn.functional.mse_loss(net(x), y), net)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    strategy.save_checkpoint(full_path, {"model": net, "optimizer": opt, "step": 7})
    checkpointing.save_distributed(strategy, directory,
                                   {"model": net, "optimizer": opt, "step": 7})
    outcomes: dict[str, str] = {}

    def fresh(features: int = 8) -> dict[str, Any]:
        torch.manual_seed(5)
        module = strategy.setup_module(nn.Sequential(
            nn.Linear(workloads.FEATURES, features), nn.Tanh(), nn.Linear(features, 1)))
        optimizer = strategy.setup_optimizer(torch.optim.Adam(module.parameters(), lr=0.01))
        return {"model": module, "optimizer": optimizer, "step": 0}

    def attempt(name: str, path: Path, state: dict[str, Any], **options: Any) -> None:
        before = workloads.full({"model": state["model"].state_dict(),
                                 "optimizer": state["optimizer"].state_dict()})
        outcomes[name] = _outcome(lambda: strategy.load_checkpoint(path, state, **options))
        after = workloads.full({"model": state["model"].state_dict(),
                                "optimizer": state["optimizer"].state_dict()})
        if outcomes[name] != "loaded":
            outcomes[name + ":unchanged"] = str(
                workloads._same(before, after) and state["step"] == 0)

    manifest = directory / digest.MANIFEST_FILE
    names = sorted(p.name for p in directory.iterdir())
    shard = directory / "__1_0.distcp"
    damages: dict[str, Callable[[], object]] = {
        "shard-truncated": lambda: shard.write_bytes(shard.read_bytes()[:-10]),
        "shard-changed": lambda: shard.write_bytes(
            shard.read_bytes()[:100] + b"\xff" * 8 + shard.read_bytes()[108:]),
        "shard-deleted": shard.unlink,
        "metadata-deleted": (directory / ".metadata").unlink,
        "file-added": lambda: (directory / "stray.bin").write_bytes(b"x"),
        "manifest-damaged": lambda: manifest.write_text(
            manifest.read_text().replace('"size": ', '"size": 1', 1)),
        "manifest-cut": lambda: manifest.write_bytes(manifest.read_bytes()[:40]),
    }
    originals = {p.name: p.read_bytes() for p in directory.iterdir()}
    for name, damage in damages.items():
        if strategy.is_global_zero:
            damage()
        strategy.barrier()
        attempt(name, directory, fresh())
        strategy.barrier()
        if strategy.is_global_zero:  # put the directory back as it was written
            (directory / "stray.bin").unlink(missing_ok=True)
            for file_name, data in originals.items():
                (directory / file_name).write_bytes(data)
        strategy.barrier()

    # a wrong-shape model, from a full file and from a directory
    attempt("full-other-shape", full_path, fresh(16))
    attempt("dir-other-shape", directory, fresh(16))
    # a damaged full file (read on rank 0 only: the verdict reaches every rank)
    if strategy.is_global_zero:
        data = full_path.read_bytes()
        middle = len(data) // 2
        full_path.write_bytes(data[:middle] + b"\0" * 64 + data[middle + 64:])
    strategy.barrier()
    attempt("full-overwritten", full_path, fresh())
    # a directory without a manifest (an older interlock's) loads unverified
    if strategy.is_global_zero:
        manifest.unlink()
    strategy.barrier()
    attempt("no-manifest", directory, fresh())
    gathered: list[dict[str, str]] = strategy.collective.all_gather_object(outcomes)
    return {"outcomes": gathered, "names": names}


@pytest.mark.timeout(240)
def test_sharded_loads_refuse_damage_on_every_rank_and_change_nothing(tmp_path: Path) -> None:
    result = launch_forked(fsdp(auto_wrap_policy={nn.Linear}), sharded_checks, str(tmp_path))
    assert digest.MANIFEST_FILE in result["names"] and ".metadata" in result["names"]
    zero, one = result["outcomes"]
    assert zero == one, f"the ranks disagree:\nrank 0: {zero}\nrank 1: {one}"
    directory = str(tmp_path / "sharded")
    expected = {
        "shard-truncated": "__1_0.distcp: it is 10 bytes shorter than written",
        "shard-changed": "__1_0.distcp: its content does not match the digest",
        "shard-deleted": "__1_0.distcp is missing",
        "metadata-deleted": ".metadata is missing",
        "file-added": "stray.bin is not one of the files it was written with",
        "manifest-damaged": "its manifest interlock.manifest.json is damaged",
        "manifest-cut": "its manifest interlock.manifest.json is damaged",
        "dir-other-shape": "module 'model': 0.weight: saved shape (8, 6), this model has "
                           "(16, 6)",
    }
    for name, text in expected.items():
        outcome = zero[name]
        assert outcome.startswith(f"CheckpointLoadError({directory})"), f"{name}: {outcome}"
        assert text in outcome, f"{name}: {outcome}"
        assert zero[f"{name}:unchanged"] == "True", f"{name}: the state changed"
    full = str(tmp_path / "full.pt")
    for name, text in {
        "full-other-shape": "0.weight: saved shape (8, 6), this model has (16, 6)",
        "full-overwritten": "does not match the digest written with it",
    }.items():
        assert zero[name].startswith(f"CheckpointLoadError({full})"), f"{name}: {zero[name]}"
        assert text in zero[name], f"{name}: {zero[name]}"
        assert zero[f"{name}:unchanged"] == "True", f"{name}: the state changed"
    assert zero["no-manifest"] == "loaded", zero["no-manifest"]
