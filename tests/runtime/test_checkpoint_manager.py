"""CheckpointManager: numbered checkpoints, the ``latest`` pointer, retention, resuming
past damage, and asynchronous saves; in one process, and on 2 gloo ranks (DDP, and
FSDP writing distributed checkpoint directories)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sharded_workloads as sw
import torch
import workloads
from harness import launch_forked
from torch import nn
from typeguard import suppress_type_checks

import interlock
from interlock import Checkpoint, CheckpointManager
from interlock.strategies.base import Strategy
from interlock.strategies.fsdp import FSDPStrategy
from interlock.strategies.io import CheckpointLoadError


@pytest.fixture
def strategy() -> Iterator[Strategy]:
    made = interlock.resolve(accelerator="cpu", devices=1, strategy="single_device",
                             machine=interlock.Machine())
    made.setup_environment()
    yield made
    made.teardown()


def trained(seed: int, steps: int = 2) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small model and an Adam optimizer with state, both depending on ``seed``."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for k in range(steps):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(k))
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return net, opt


def snapshot(net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"params": {k: v.detach().clone() for k, v in net.state_dict().items()},
            "optimizer": {i: {k: v.clone() if isinstance(v, torch.Tensor) else v
                              for k, v in s.items()}
                          for i, s in opt.state_dict()["state"].items()}}


def assert_equal_state(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    assert actual["params"].keys() == expected["params"].keys(), f"{what}: parameter names"
    for name, tensor in expected["params"].items():
        assert torch.equal(actual["params"][name], tensor), f"{what}: parameter {name} differs"
    assert actual["optimizer"].keys() == expected["optimizer"].keys(), f"{what}: optimizer keys"
    for index, per_param in expected["optimizer"].items():
        for key, value in per_param.items():
            got = actual["optimizer"][index][key]
            same = torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
            assert same, f"{what}: optimizer state {index}.{key} differs"


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --------------------------------------------------------------------------- saving


def test_save_names_points_and_keeps_the_newest(strategy: Strategy, tmp_path: Path) -> None:
    net, opt = trained(0)
    manager = CheckpointManager(strategy, tmp_path / "ckpt", keep=2)
    assert manager.latest() is None and manager.checkpoints() == []
    paths = [manager.save(step, {"model": net, "optimizer": opt, "step": step})
             for step in (1, 5, 12)]
    directory = tmp_path / "ckpt"
    assert paths == [directory / "step-00000001", directory / "step-00000005",
                     directory / "step-00000012"]
    assert names(directory) == ["latest", "step-00000005", "step-00000012"], (
        "keep=2 keeps the two newest, and nothing staged or temporary is left")
    assert (directory / "latest").read_text() == "step-00000012\n"
    assert manager.latest() == Checkpoint(12, directory / "step-00000012")
    assert [c.step for c in manager.checkpoints()] == [5, 12], "oldest first"
    assert all(c.path.is_file() for c in manager.checkpoints()), "one file per checkpoint"


def test_load_latest_restores_fresh_objects_exactly(strategy: Strategy, tmp_path: Path) -> None:
    net, opt = trained(0, steps=3)
    expected = snapshot(net, opt)
    with CheckpointManager(strategy, tmp_path) as manager:
        manager.save(7, {"model": net, "optimizer": opt, "epoch": 2, "history": [0.5, 0.25]})
    fresh_net, fresh_opt = trained(99, steps=0)
    state: dict[str, Any] = {"model": fresh_net, "optimizer": fresh_opt, "epoch": 0,
                             "history": []}
    assert CheckpointManager(strategy, tmp_path).load_latest(state) == 7
    assert state["model"] is fresh_net and state["optimizer"] is fresh_opt, "in place"
    assert state["epoch"] == 2 and state["history"] == [0.5, 0.25]
    assert_equal_state(snapshot(fresh_net, fresh_opt), expected, "loaded into fresh objects")


def test_an_empty_or_missing_directory_loads_nothing(strategy: Strategy, tmp_path: Path) -> None:
    net, opt = trained(0)
    before = snapshot(net, opt)
    state: dict[str, Any] = {"model": net, "optimizer": opt, "epoch": 4}
    assert CheckpointManager(strategy, tmp_path / "never-made").load_latest(state) is None
    assert CheckpointManager(strategy, tmp_path).load_latest(state) is None
    assert state["epoch"] == 4
    assert_equal_state(snapshot(net, opt), before, "state after loading nothing")
    assert not (tmp_path / "never-made").exists(), "reading creates no directory"


def test_steps_must_increase_and_the_latest_step_may_be_saved_again(
        strategy: Strategy, tmp_path: Path) -> None:
    manager = CheckpointManager(strategy, tmp_path, keep=3)
    manager.save(5, {"value": "first"})
    with pytest.raises(ValueError, match=r"save\(step=3\).*is step 5; steps must increase"):
        manager.save(3, {"value": "older"})
    manager.save(5, {"value": "again"})
    assert names(tmp_path) == ["latest", "step-00000005"], "replaced, not duplicated"
    state: dict[str, Any] = {"value": None}
    assert manager.load_latest(state) == 5 and state["value"] == "again"
    manager.save(6, {"value": "next"})
    assert [c.step for c in manager.checkpoints()] == [5, 6]


@pytest.mark.parametrize(("step", "error", "match"), [
    (-1, ValueError, r"save\(step=-1\): expected a step >= 0"),
    ("3", TypeError, r"save\(step='3'\): expected an int"),
    (True, TypeError, r"save\(step=True\): expected an int"),
    (2.0, TypeError, r"save\(step=2\.0\): expected an int"),
])
def test_a_bad_step_is_refused(strategy: Strategy, tmp_path: Path, step: Any,
                               error: type[Exception], match: str) -> None:
    manager = CheckpointManager(strategy, tmp_path)
    with suppress_type_checks(), pytest.raises(error, match=match):
        manager.save(step, {})
    assert not any(tmp_path.iterdir()), "nothing written"


def test_bad_state_and_constructor_arguments_are_refused(strategy: Strategy,
                                                         tmp_path: Path) -> None:
    manager = CheckpointManager(strategy, tmp_path)
    with suppress_type_checks():
        with pytest.raises(TypeError, match=r"save\(state=...\): expected a mapping.*list"):
            manager.save(1, [("model", 1)])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"load_latest\(state=...\): expected a dict"):
            manager.load_latest(())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"keep='2'\): expected an int >= 1"):
            CheckpointManager(strategy, tmp_path, keep="2")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="expected an interlock Strategy"):
            CheckpointManager("ddp", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"keep=0\): expected an int >= 1"):
        CheckpointManager(strategy, tmp_path, keep=0)
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="that is a file"):
        CheckpointManager(strategy, a_file)


# --------------------------------------------------------------------------- damage


@pytest.mark.parametrize("damage", ["garbage", "names a missing step", "missing", "empty"])
def test_a_damaged_pointer_falls_back_to_the_newest_complete_checkpoint(
        strategy: Strategy, tmp_path: Path, damage: str) -> None:
    manager = CheckpointManager(strategy, tmp_path, keep=3)
    for step in (1, 2):
        manager.save(step, {"step": step})
    pointer = tmp_path / "latest"
    if damage == "missing":
        pointer.unlink()
    else:
        pointer.write_text({"garbage": "\x00\xff nonsense", "names a missing step":
                            "step-00000009\n", "empty": ""}[damage])
    # what a save in progress or a crash leaves is never a checkpoint
    (tmp_path / ".step-00000003.partial").mkdir()
    (tmp_path / "..step-00000003.partial.abc123.tmp").write_bytes(b"half")
    with pytest.warns(RuntimeWarning, match=r"latest.*using the newest complete checkpoint"):
        latest = manager.latest()
    assert latest == Checkpoint(2, tmp_path / "step-00000002")
    assert [c.step for c in manager.checkpoints()] == [1, 2]
    with pytest.warns(RuntimeWarning):
        state: dict[str, Any] = {"step": None}
        assert manager.load_latest(state) == 2 and state["step"] == 2
    with pytest.warns(RuntimeWarning):
        manager.save(3, {"step": 3})
    assert names(tmp_path) == ["latest", "step-00000001", "step-00000002", "step-00000003"], (
        "the next save repairs the pointer and removes what a crash left")
    assert manager.latest() == Checkpoint(3, tmp_path / "step-00000003")


def test_a_pointer_behind_the_directory_wins_and_the_newer_one_is_dropped(
        strategy: Strategy, tmp_path: Path) -> None:
    """A crash between moving a checkpoint into place and moving the pointer: the
    pointer still names the step before, which is what a run resumes from."""
    manager = CheckpointManager(strategy, tmp_path, keep=3)
    for step in (1, 2, 3):
        manager.save(step, {"step": step})
    (tmp_path / "latest").write_text("step-00000002\n")
    assert manager.latest() == Checkpoint(2, tmp_path / "step-00000002")
    manager.save(3, {"step": 30})
    state: dict[str, Any] = {"step": None}
    assert manager.load_latest(state) == 3 and state["step"] == 30
    manager.save(4, {"step": 4})
    (tmp_path / "latest").write_text("step-00000002\n")
    manager.save(3, {"step": 300})
    assert [c.step for c in manager.checkpoints()] == [2, 3], (
        "step 4 was never what the pointer named when step 3 was saved again (step 1 went "
        "when step 4 was saved)")


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(strategy: Strategy,
                                                               tmp_path: Path) -> None:
    manager = CheckpointManager(strategy, tmp_path, keep=2)
    first_net, first_opt = trained(1)
    manager.save(1, {"model": first_net, "optimizer": first_opt, "tag": "one"})
    expected = snapshot(first_net, first_opt)
    second_net, second_opt = trained(2)
    newest = manager.save(2, {"model": second_net, "optimizer": second_opt, "tag": "two"})
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])

    net, opt = trained(3, steps=0)
    state: dict[str, Any] = {"model": net, "optimizer": opt, "tag": None}
    with pytest.warns(RuntimeWarning, match=r"step-00000002.*could not be loaded \(.+\)"):
        assert manager.load_latest(state) == 1
    assert state["tag"] == "one"
    assert_equal_state(snapshot(net, opt), expected, "the older checkpoint")


def test_when_no_checkpoint_loads_the_newest_error_is_raised(strategy: Strategy,
                                                             tmp_path: Path) -> None:
    manager = CheckpointManager(strategy, tmp_path, keep=2)
    for step in (1, 2):
        path = manager.save(step, {"step": step})
        path.write_bytes(path.read_bytes()[:40])
    state: dict[str, Any] = {"step": None}
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointLoadError) as info:
        manager.load_latest(state)
    assert info.value.path.endswith("step-00000002"), info.value.path
    assert state["step"] is None


# --------------------------------------------------------------------------- async


def test_async_save_writes_what_a_blocking_save_writes(strategy: Strategy,
                                                       tmp_path: Path) -> None:
    net, opt = trained(0, steps=3)
    history = [1.0]
    state = {"model": net, "optimizer": opt, "epoch": 3, "history": history}
    blocking = CheckpointManager(strategy, tmp_path / "blocking").save(3, state)
    with CheckpointManager(strategy, tmp_path / "async", async_save=True) as manager:
        written = manager.save(3, state)
        # training goes on while the file is written: none of this may reach it
        trained_more = snapshot(net, opt)
        net(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        history.append(2.0)
        assert not torch.equal(snapshot(net, opt)["params"]["0.weight"],
                               trained_more["params"]["0.weight"])
    assert written.read_bytes() == blocking.read_bytes(), "the same bytes on disk"
    assert (tmp_path / "async" / "latest").read_text() == "step-00000003\n"

    fresh_net, fresh_opt = trained(5, steps=0)
    loaded: dict[str, Any] = {"model": fresh_net, "optimizer": fresh_opt, "epoch": 0,
                              "history": None}
    assert CheckpointManager(strategy, tmp_path / "async").load_latest(loaded) == 3
    assert loaded["history"] == [1.0]
    assert_equal_state(snapshot(fresh_net, fresh_opt), trained_more, "async checkpoint")


def test_async_saves_keep_and_point_like_blocking_ones(strategy: Strategy,
                                                       tmp_path: Path) -> None:
    with CheckpointManager(strategy, tmp_path, keep=2, async_save=True) as manager:
        for step in range(1, 6):
            manager.save(step, {"step": step})
    assert names(tmp_path) == ["latest", "step-00000004", "step-00000005"]
    assert manager.latest() == Checkpoint(5, tmp_path / "step-00000005")


def test_a_failed_async_write_is_raised_by_the_next_call_and_leaves_the_last_checkpoint(
        strategy: Strategy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(strategy, tmp_path, async_save=True)
    manager.save(1, {"step": 1})
    manager.wait()

    def disk_full(checkpoint: dict[str, Any], path: Any) -> None:
        Path(path).write_bytes(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(strategy.checkpoint_io, "save_checkpoint", disk_full)
    manager.save(2, {"step": 2})  # returns: the write happens on another thread
    with pytest.raises(OSError, match="No space left on device"):
        manager.save(3, {"step": 3})
    assert manager.latest() == Checkpoint(1, tmp_path / "step-00000001")
    assert (tmp_path / "latest").read_text() == "step-00000001\n"
    assert [c.step for c in manager.checkpoints()] == [1]

    monkeypatch.undo()
    manager.save(3, {"step": 3})  # the error was raised once; saving works again
    manager.close()
    assert names(tmp_path) == ["latest", "step-00000001", "step-00000003"], (
        "the failed write's staging file is gone")

    monkeypatch.setattr(strategy.checkpoint_io, "save_checkpoint", disk_full)
    manager.save(4, {"step": 4})
    state: dict[str, Any] = {"step": None}
    with pytest.raises(OSError, match="No space left on device"):
        manager.load_latest(state)
    assert state["step"] is None, "loading stops before touching the state"
    manager.close()


def test_close_raises_a_failed_write_once(strategy: Strategy, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(checkpoint: dict[str, Any], path: Any) -> None:
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(strategy.checkpoint_io, "save_checkpoint", broken)
    with pytest.raises(RuntimeError, match="the disk went away"):
        with CheckpointManager(strategy, tmp_path, async_save=True) as manager:
            manager.save(1, {"step": 1})
    manager.close()  # nothing pending any more
    assert manager.latest() is None


# --------------------------------------------------------------------------- 2 ranks


def _ddp_resume(strategy: Strategy, directory: str, async_save: bool) -> dict[str, Any]:
    net = strategy.setup_module(workloads.model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    saved: dict[int, dict[str, Any]] = {}
    with CheckpointManager(strategy, directory, keep=2, async_save=async_save) as manager:
        for step in (1, 2, 3):
            sw._step(strategy, net, opt, step)
            saved[step] = snapshot(net, opt)
            manager.save(step, {"model": net, "optimizer": opt, "step": step})
        sw._step(strategy, net, opt, 4)  # after the save: must not reach the checkpoint
    listed = [c.step for c in manager.checkpoints()]

    fresh = strategy.setup_module(sw.fresh_model())
    fresh_opt = strategy.setup_optimizer(torch.optim.Adam(fresh.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    loaded = manager.load_latest(state)
    assert_equal_state(snapshot(fresh, fresh_opt), saved[3], f"rank {strategy.global_rank}")

    if strategy.is_global_zero:  # damage the newest checkpoint
        path = Path(directory, "step-00000003")
        path.write_bytes(path.read_bytes()[:100])
    strategy.barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = manager.load_latest(state)
    assert_equal_state(snapshot(fresh, fresh_opt), saved[2], f"rank {strategy.global_rank}")
    return {
        "listed": listed,
        "loaded": strategy.collective.all_gather_object((loaded, state["step"], fallback)),
        "warnings": strategy.collective.all_gather_object(
            [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]),
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
def test_ddp_ranks_save_keep_and_resume_together(tmp_path: Path, async_save: bool) -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_fork",
                                 machine=interlock.Machine())
    out = strategy.launch(_ddp_resume, str(tmp_path), async_save)
    assert out["listed"] == [2, 3], "keep=2 after saving steps 1, 2, 3"
    assert out["loaded"] == [(3, 2, 2), (3, 2, 2)], (
        "both ranks load step 3, then fall back to step 2 together (loaded, step, fallback)")
    for rank, messages in enumerate(out["warnings"]):
        assert any("step-00000003" in m and "could not be loaded" in m for m in messages), (
            f"rank {rank} warned {messages}")
    assert names(tmp_path) == ["latest", "step-00000002", "step-00000003"]


def _fsdp_resume(strategy: Strategy, directory: str, async_save: bool) -> dict[str, Any]:
    net = strategy.setup_module(workloads.model())
    opt = strategy.setup_optimizer(torch.optim.Adam(net.parameters(), lr=0.01))
    saved: dict[int, Any] = {}
    with CheckpointManager(strategy, directory, keep=2, async_save=async_save) as manager:
        for step in (1, 2, 3):
            sw._step(strategy, net, opt, step)
            saved[step] = {"params": workloads.full(net.state_dict()),
                           "optimizer": workloads.full(opt.state_dict())}
            manager.save(step, {"model": net, "optimizer": opt, "step": step})
            sw._step(strategy, net, opt, 10 + step)  # while an async save is written
    listed = [(c.step, c.path.is_dir(), (c.path / ".metadata").is_file(),
               (c.path / "interlock.manifest.json").is_file())
              for c in manager.checkpoints()]

    fresh = strategy.setup_module(sw.fresh_model())
    fresh_opt = strategy.setup_optimizer(torch.optim.Adam(fresh.parameters(), lr=0.01))
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    loaded = manager.load_latest(state)
    return {
        "listed": listed,
        "loaded": strategy.collective.all_gather_object((loaded, state["step"])),
        "expected": saved[3],
        "params": workloads.full(fresh.state_dict()),
        "optimizer": workloads.full(fresh_opt.state_dict()),
    }


@pytest.mark.timeout(150)
@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
def test_fsdp_distributed_checkpoint_directories_resume_on_both_ranks(
        tmp_path: Path, async_save: bool) -> None:
    strategy = interlock.resolve(strategy=FSDPStrategy(state_dict_type="sharded"),
                                 accelerator="cpu", devices=2, machine=interlock.Machine())
    assert isinstance(strategy, FSDPStrategy)
    out = launch_forked(strategy, _fsdp_resume, str(tmp_path), async_save)
    assert out["listed"] == [(2, True, True, True), (3, True, True, True)], (
        "keep=2; each checkpoint a distributed directory (step, is a directory, .metadata, "
        "the digest manifest, asynchronous saves included)")
    assert out["loaded"] == [(3, 3), (3, 3)], "both ranks load step 3"
    for name, tensor in out["expected"]["params"].items():
        assert torch.equal(out["params"][name], tensor), f"parameter {name} differs"
    expected_opt = out["expected"]["optimizer"]["state"]
    for key, per_param in expected_opt.items():
        for field, value in per_param.items():
            got = out["optimizer"]["state"][key][field]
            assert torch.equal(got, value), f"optimizer state {key}.{field} differs"
    assert names(tmp_path) == ["latest", "step-00000002", "step-00000003"]
