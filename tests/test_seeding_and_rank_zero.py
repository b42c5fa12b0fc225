"""seed_everything and rank-zero output, in one process (the 2-rank behaviour is checked
in tests/runtime/test_dataloading.py)."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator

import numpy
import pytest
import torch
from typeguard import suppress_type_checks

import interlock
from interlock.seeding import (
    MAX_SEED,
    SEED_ENV,
    SEED_WORKERS_ENV,
    derive_seed,
    seed_everything,
    seed_workers_enabled,
)
from interlock.strategies.rank_zero import RankZeroLogger, process_rank


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No seed, workers flag or RANK from outside; every generator restored after."""
    for name in (SEED_ENV, SEED_WORKERS_ENV, "RANK"):
        monkeypatch.setenv(name, "")  # recorded, so what the test writes is undone
        monkeypatch.delenv(name)
    states = random.getstate(), numpy.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(states[0])
    numpy.random.set_state(states[1])
    torch.set_rng_state(states[2])


def draws() -> tuple[float, float, float]:
    return random.random(), float(numpy.random.rand()), float(torch.rand(()))


def test_the_same_seed_gives_the_same_numbers_from_every_generator() -> None:
    assert seed_everything(123) == 123
    first = draws()
    assert seed_everything(123) == 123
    assert draws() == first, "random, numpy or torch did not restart from the seed"
    seed_everything(124)
    other = draws()
    assert all(a != b for a, b in zip(first, other, strict=True)), (first, other)
    assert (os.environ[SEED_ENV], os.environ[SEED_WORKERS_ENV]) == ("124", "1")
    assert not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]


def test_no_seed_reuses_the_environments_or_draws_one_and_leaves_it_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh = seed_everything()
    assert 0 <= fresh <= MAX_SEED
    assert os.environ[SEED_ENV] == str(fresh), "the drawn seed was not left for later ranks"
    assert seed_everything() == fresh
    monkeypatch.setenv(SEED_ENV, "77")
    assert seed_everything() == 77


def test_rank_offset_adds_the_global_rank_and_wraps_around(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "3")
    assert seed_everything(10, rank_offset=True) == 13
    offset = draws()
    assert os.environ[SEED_ENV] == "10", "the environment must keep the seed before the offset"
    assert seed_everything(rank_offset=True) == 13
    assert seed_everything(10) == 10
    seed_everything(13)
    assert draws() == offset
    assert seed_everything(MAX_SEED, rank_offset=True) == 2


def test_workers_flag_is_left_for_setup_dataloader() -> None:
    assert seed_workers_enabled(), "worker seeding is on unless switched off"
    seed_everything(1, workers=False)
    assert os.environ[SEED_WORKERS_ENV] == "0" and not seed_workers_enabled()
    seed_everything(1)
    assert seed_workers_enabled()


@pytest.mark.parametrize(("seed", "error", "message"), [
    (-1, ValueError, r"seed=-1 is out of range: a seed is an int in \[0, 4294967295\]"),
    (2**32, ValueError, "seed=4294967296 is out of range"),
    (True, TypeError, r"seed=True \(bool\) is not a seed"),
    (1.5, TypeError, r"seed=1.5 \(float\) is not a seed"),
    ("3", TypeError, r"seed='3' \(str\) is not a seed"),
])
def test_bad_seeds_are_refused(seed: object, error: type[Exception], message: str) -> None:
    with suppress_type_checks(), pytest.raises(error, match=message):
        seed_everything(seed)  # type: ignore[arg-type]


def test_bad_environment_and_flags_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SEED_ENV, "abc")
    with pytest.raises(ValueError, match="INTERLOCK_SEED='abc' in the environment is not a "
                       "seed"):
        seed_everything()
    monkeypatch.setenv(SEED_ENV, "-5")
    with pytest.raises(ValueError, match="INTERLOCK_SEED=-5 is out of range"):
        seed_everything()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one' in the environment is not a rank"):
        seed_everything(1, rank_offset=True)
    with suppress_type_checks(), pytest.raises(TypeError, match="workers='yes'"):
        seed_everything(1, workers="yes")  # type: ignore[arg-type]


#: splitmix64 mixing of (5, 1), worked out once: pinned so that a run's seeds stay reproducible
DERIVED_5_1 = 0x4C7D0167AA7FC304


def test_derived_seeds_are_stable_and_apart() -> None:
    assert derive_seed(5, 1) == DERIVED_5_1, "derive_seed changed: seeds of past runs differ"
    seeds = {derive_seed(a, b) for a in range(8) for b in range(8)}
    assert len(seeds) == 64 and all(0 <= s < 2**64 for s in seeds)
    assert derive_seed(1, 2) != derive_seed(2, 1)


def test_the_rank_zero_logger_emits_on_rank_zero_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = interlock.rank_zero_logger("interlock_tests.single")
    assert isinstance(log, RankZeroLogger)
    caplog.set_level(logging.INFO, logger="interlock_tests.single")
    log.info("from rank %d", 0, extra={"tag": 5})
    monkeypatch.setenv("RANK", "1")
    assert process_rank() == 1
    log.warning("from rank %d", 1)
    assert not log.isEnabledFor(logging.CRITICAL)
    assert [r.getMessage() for r in caplog.records] == ["from rank 0"]
    record = caplog.records[0]
    assert record.tag == 5, "the caller's extra was lost"  # type: ignore[attr-defined]
    assert record.funcName == "test_the_rank_zero_logger_emits_on_rank_zero_only", (
        f"the record points at {record.funcName}, not at the caller")


def test_strategy_print_prints_on_rank_zero(capsys: pytest.CaptureFixture[str]) -> None:
    strategy = interlock.resolve(accelerator="cpu", devices=1, strategy="single_device",
                                 machine=interlock.Machine())
    strategy.print("hello", 1, sep="-")
    assert capsys.readouterr().out == "hello-1\n"
