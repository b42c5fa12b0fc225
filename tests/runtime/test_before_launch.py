"""A multi-process strategy used where it has no process group, and fork after CUDA.

Before ``launch`` (or ``setup_environment`` in processes a launcher started) and after
teardown, the calls that need the process group refuse with interlock's own error,
which says what to call, and do nothing first: no checkpoint file, no moved module.
A fork launch from a process where CUDA is initialised is refused before any process
starts (``torch.cuda.is_initialized`` is monkeypatched: this machine has no CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import interlock
from interlock.strategies.deepspeed import DeepSpeedStrategy
from interlock.strategies.launchers import LaunchError
from interlock.strategies.launchers.base import RANK0_SERVES_ENV, RENDEZVOUS_ENV
from interlock.strategies.launchers.rendezvous import host_store, release_store
from interlock.strategies.parallel import NEEDS_PROCESS_GROUP, NotSetUpError, ParallelStrategy
from interlock.strategies.xla import XLAFSDPStrategy, XLAStrategy

#: built-in multi-process strategies this machine resolves (cpu, 2 processes)
RESOLVED = ["ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_forkserver", "fsdp",
            "model_parallel"]


def resolved(name: str) -> ParallelStrategy:
    strategy = interlock.resolve(strategy=name, accelerator="cpu", devices=2,
                                 machine=interlock.Machine())
    assert isinstance(strategy, ParallelStrategy), type(strategy)
    return strategy


def built(kind: str) -> ParallelStrategy:
    """A strategy by registry name, or one whose package this machine lacks, built by
    hand (its class must refuse before it imports the package)."""
    if kind == "deepspeed (not installed)":
        return DeepSpeedStrategy(parallel_devices=["cpu", "cpu"])
    if kind == "xla (not installed)":
        return XLAStrategy()
    if kind == "xla_fsdp (not installed)":
        return XLAFSDPStrategy()
    return resolved(kind)


KINDS = [*RESOLVED, "deepspeed (not installed)", "xla (not installed)",
         "xla_fsdp (not installed)"]


def calls(path: Path) -> dict[str, Callable[[ParallelStrategy], Any]]:
    module = nn.Linear(2, 2)
    return {
        "all_reduce": lambda s: s.all_reduce(torch.ones(1)),
        "all_gather": lambda s: s.all_gather(torch.ones(1)),
        "broadcast": lambda s: s.broadcast({"step": 1}),
        "barrier": lambda s: s.barrier(),
        "reduce_boolean_decision": lambda s: s.reduce_boolean_decision(True),
        "setup_module": lambda s: s.setup_module(module),
        "setup_module_and_optimizers": lambda s: s.setup_module_and_optimizers(
            module, [torch.optim.SGD(module.parameters(), lr=0.1)]),
        "save_checkpoint": lambda s: s.save_checkpoint(path / "ckpt", {"model": module,
                                                                       "step": 1}),
    }


def test_every_guarded_method_is_exercised_here(tmp_path: Path) -> None:
    assert sorted(calls(tmp_path)) == sorted(NEEDS_PROCESS_GROUP)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", NEEDS_PROCESS_GROUP)
def test_calls_before_launch_say_what_to_call_and_do_nothing(
        kind: str, method: str, tmp_path: Path) -> None:
    strategy = built(kind)
    call = calls(tmp_path)[method]
    with pytest.raises(NotSetUpError) as info:
        call(strategy)
    message = str(info.value)
    assert f"{type(strategy).__name__}.{method}()" in message, message
    assert "strategy.launch(fn)" in message and "strategy.setup_environment()" in message
    assert "init_process_group" not in message, message
    assert isinstance(info.value, RuntimeError)
    assert list(tmp_path.iterdir()) == [], f"{method} wrote {list(tmp_path.iterdir())}"


def test_setup_module_leaves_the_module_as_it_was() -> None:
    module = nn.Linear(2, 2)
    weight = module.weight
    before = weight.detach().clone()
    with pytest.raises(NotSetUpError):
        resolved("fsdp").setup_module(module)
    assert module.weight is weight and torch.equal(module.weight, before)
    assert type(module.weight) is nn.Parameter, "the module was sharded before the refusal"


def test_overrides_in_subclasses_are_guarded_too(tmp_path: Path) -> None:
    """A strategy of someone else's that writes in its own save_checkpoint is refused
    before it writes."""

    class WritesFirst(type(resolved("ddp"))):  # type: ignore[misc]
        def save_checkpoint(self, path: str | Path, state: Any) -> None:
            Path(path).write_text("half")
            super().save_checkpoint(path, state)

    strategy = WritesFirst(parallel_devices=["cpu", "cpu"])
    with pytest.raises(NotSetUpError, match=r"WritesFirst\.save_checkpoint\(\)"):
        strategy.save_checkpoint(tmp_path / "ckpt", {"step": 1})
    assert not (tmp_path / "ckpt").exists()


def test_every_parallel_strategy_class_is_guarded() -> None:
    def subclasses(cls: type[ParallelStrategy]) -> list[type[ParallelStrategy]]:
        found = [cls]
        for sub in cls.__subclasses__():
            found += subclasses(sub)
        return found

    for cls in subclasses(ParallelStrategy):
        bare = [name for name in NEEDS_PROCESS_GROUP
                if not getattr(getattr(cls, name), "_interlock_needs_group", False)]
        assert not bare, f"{cls.__qualname__} has unguarded {bare}"


@pytest.mark.timeout(60)
def test_inside_setup_the_calls_work_and_after_teardown_they_refuse(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    strategy = interlock.resolve(strategy="ddp", accelerator="cpu", devices=1,
                                 machine=interlock.Machine())
    assert isinstance(strategy, ParallelStrategy)
    rendezvous = host_store()
    monkeypatch.setenv(RENDEZVOUS_ENV, rendezvous)
    monkeypatch.setenv(RANK0_SERVES_ENV, "0")
    try:
        strategy.setup_environment()
        try:
            assert float(strategy.all_reduce(torch.tensor(3.0))) == 3.0
            strategy.barrier()
            strategy.save_checkpoint(tmp_path / "ckpt", {"step": 1})
            assert (tmp_path / "ckpt").exists()
        finally:
            strategy.teardown()
        with pytest.raises(NotSetUpError, match=r"DDPStrategy\.barrier\(\)"):
            strategy.barrier()
    finally:
        release_store(rendezvous)


# --------------------------------------------------------------------------- fork after CUDA


class _Started(Exception):
    """Raised in place of starting processes: the launch got past its checks."""


def _refuse_to_start(*args: Any, **kwargs: Any) -> None:
    raise _Started()


@pytest.mark.parametrize("name", ["ddp_notebook", "ddp_fork"])
def test_fork_after_cuda_is_refused_before_any_process_starts(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.multiprocessing as mp

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(mp, "start_processes", _refuse_to_start)
    with pytest.raises(LaunchError) as info:
        resolved(name).launch(_never_called)
    message = str(info.value)
    assert "torch.cuda.is_initialized() is True" in message, message
    assert "only inside the function given to launch()" in message, message
    assert "strategy='ddp_spawn'" in message, message


@pytest.mark.parametrize("name", ["ddp_spawn", "ddp_forkserver"])
def test_fresh_processes_are_not_refused_after_cuda(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.multiprocessing as mp

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(mp, "start_processes", _refuse_to_start)
    with pytest.raises(_Started):
        resolved(name).launch(_never_called)


@pytest.mark.parametrize("name", ["ddp_notebook", "ddp_fork"])
def test_fork_without_cuda_gets_past_the_check(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.multiprocessing as mp

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(mp, "start_processes", _refuse_to_start)
    with pytest.raises(_Started):
        resolved(name).launch(_never_called)


def _never_called(strategy: ParallelStrategy) -> None:  # pragma: no cover
    raise AssertionError("the launched function ran")


def _sleep_forever() -> None:  # pragma: no cover - runs in the forked child
    import time

    while True:
        time.sleep(1)


@pytest.mark.timeout(60)
def test_an_interrupt_while_workers_start_stops_those_already_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal that lands inside ``mp.start_processes`` leaves the launcher without a
    process context; the worker forked before it must still be stopped, not left to
    hold the interpreter's exit until the process group times out."""
    import multiprocessing

    import torch.multiprocessing as mp

    forked: list[multiprocessing.process.BaseProcess] = []

    def start_one_then_interrupt(*args: object, **kwargs: object) -> None:
        child = multiprocessing.get_context("fork").Process(target=_sleep_forever,
                                                            daemon=False)
        child.start()
        forked.append(child)
        raise KeyboardInterrupt

    monkeypatch.setattr(mp, "start_processes", start_one_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        resolved("ddp_fork").launch(_never_called)
    assert forked, "the stand-in start_processes did not run"
    forked[0].join(10)
    assert not forked[0].is_alive(), "a worker started before the interrupt is still alive"
