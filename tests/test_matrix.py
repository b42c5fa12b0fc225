"""The matrix: staged evaluation agrees with plan(), and the lock file pins every cell."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from typeguard import suppress_type_checks

import interlock
from interlock import ResolutionError
from interlock.engine.registry import current_parts
from interlock.engine.stages.flags import OneFlag, read_flag, read_flags
from interlock.engine.written import Written
from interlock.matrix import FLAG_SPACE, PROFILES, evaluate, outcome_of, profile_named
from interlock.matrix import parallelism as par
from interlock.matrix.evaluate import show
from interlock.matrix.lock import (
    LOCK_PATH,
    differences,
    main,
    outcomes,
    parse,
    parse_parallelism,
    render,
)
from interlock.matrix.space import FlagSpace

ROOT = Path(__file__).resolve().parents[1]


def _flag(values: tuple[Any, ...], shown: str) -> Any:
    return next(v for v in values if show(v) == shown)


def _direct(profile_name: str, cell: Any, space: FlagSpace = FLAG_SPACE) -> str:
    profile = profile_named(profile_name)
    try:
        result = interlock.plan(
            accelerator=cell.accelerator,
            devices=_flag(space.devices, cell.devices),
            strategy=cell.strategy,
            precision=_flag(space.precisions, cell.precision),
            num_nodes=cell.num_nodes,
            machine=profile.machine,
        )
    except ResolutionError as error:
        return outcome_of(error)
    return outcome_of(result)


def test_the_space_and_profiles_are_as_large_as_promised() -> None:
    assert len(PROFILES) == 12
    assert len({p.name for p in PROFILES}) == 12
    assert FLAG_SPACE.size() * len(PROFILES) >= 100_000
    assert len({show(p) for p in FLAG_SPACE.precisions}) == len(FLAG_SPACE.precisions), (
        "two precision values print alike; the lock file could not tell them apart")


@pytest.fixture(scope="module")
def current() -> dict[Any, str]:
    """Every cell, with typeguard stepped aside: 756,000 cells take a minute and a half
    under it (test_every_cell_of_a_mixed_space_matches_plan runs the same evaluation
    under it, on a smaller space)."""
    with suppress_type_checks():
        return outcomes()


#: accepted and refused values of every flag, so that cells refuse in several flags at
#: once (which refusal a cell reports is the flags stage's order)
MIXED = dataclasses.replace(
    FLAG_SPACE, accelerators=("auto", "cuda", "quantum"), devices=(2, -1, "[]"),
    precisions=("bf16-mixed", 16, "fp7"), num_nodes=(2, 0),
    strategy_names=("fsdp", "no_such_strategy"))


def _default_flags(**written: object) -> Any:
    specs = interlock.registered(interlock.StrategySpec)
    flags = {"accelerator": "auto", "devices": "auto", "strategy": "auto",
             "precision": "32-true", "num_nodes": 1, **written}
    return read_flags(Written(**flags), specs=specs, parts=current_parts())


@pytest.mark.parametrize("flag", ["accelerator", "devices", "strategy", "precision",
                                  "num_nodes"])
def test_each_flag_value_reads_alone_as_plan_reads_it(flag: OneFlag) -> None:
    """The matrix reads each value of a flag once, alone (`read_flag`); plan() reads
    all flags together (`read_flags`). For every value the space covers, both give the
    same parsed value, or the same refusal."""
    specs = interlock.registered(interlock.StrategySpec)
    values = {"accelerator": FLAG_SPACE.accelerators, "devices": FLAG_SPACE.devices,
              "strategy": FLAG_SPACE.strategies(), "precision": FLAG_SPACE.precisions,
              "num_nodes": FLAG_SPACE.num_nodes}[flag]
    for value in values:
        try:
            alone: object = getattr(read_flag(flag, value, specs=specs, parts=current_parts()),
                                    flag)
        except ResolutionError as error:
            alone = (error.code, error.flag)
        try:
            together: object = getattr(_default_flags(**{flag: value}), flag)
        except ResolutionError as error:
            together = (error.code, error.flag)
        assert alone == together, f"{flag}={value!r}"


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_cell_of_a_mixed_space_matches_plan(profile: Any) -> None:
    """The matrix and plan() run the same steps (`interlock.engine.stages.STEPS`);
    what differs is how they read the flags (each value alone, or all at once) and the
    memo. Every cell of a space with refusals in every flag gives plan()'s refusal code
    and flag, or plan()'s summary."""
    cells = list(evaluate(profile, MIXED))
    assert len(cells) == MIXED.size()
    mismatches = [
        f"{cell}: matrix says {outcome}, plan() says {_direct(profile.name, cell, MIXED)}"
        for cell, outcome in cells
        if outcome != _direct(profile.name, cell, MIXED)
    ]
    assert not mismatches, "\n".join(mismatches[:20])
    assert len({outcome.split()[0] for _, outcome in cells}) >= 4


@pytest.mark.timeout(400)  # the fixture evaluates 756,000 cells (under typeguard in CI)
def test_the_lock_round_trips(current: dict[Any, str]) -> None:
    layouts = par.outcomes()
    text = render(cells=current, parallelism=layouts)
    assert parse(text) == current
    assert parse_parallelism(text) == layouts
    assert list(parse_parallelism(text)) == list(layouts), "the section keeps table order"
    assert len(text) < 4_000_000, f"the lock file grew to {len(text)} bytes"


@pytest.mark.timeout(400)
def test_the_committed_lock_matches_the_engine(current: dict[Any, str]) -> None:
    committed = parse((ROOT / LOCK_PATH).read_text(encoding="utf-8"))
    changed = differences(committed, current)
    assert not changed, (
        "the engine's outcomes differ from matrix.lock; if the change is intended, run "
        "`nox -s matrix -- --update` and commit the file. Changed cells:\n" + "\n".join(changed)
    )


def test_the_matrix_runs_the_parallelism_stage() -> None:
    """A registered row whose options ask for a degree the devices cannot hold is
    refused by the parallelism stage: the matrix says so, as plan() does."""
    model_parallel = interlock.registered(interlock.StrategySpec)["model_parallel"]
    spec = dataclasses.replace(model_parallel, name="matrix_test_tp3",
                               options={"tensor_parallel_size": 3})
    interlock.register(spec)
    try:
        space = dataclasses.replace(FLAG_SPACE, accelerators=("cpu",), devices=(2,),
                                    precisions=("32-true",), num_nodes=(1,),
                                    strategy_names=("matrix_test_tp3",))
        profile = profile_named("cpu-laptop")
        cell, outcome = next((cell, outcome) for cell, outcome in evaluate(profile, space)
                             if cell.strategy == "matrix_test_tp3")
        assert outcome == "invalid-parallelism parallelism", outcome
        assert outcome == _direct(profile.name, cell)
    finally:
        interlock.unregister(interlock.StrategySpec, spec.name)


def test_differences_read_well() -> None:
    before = {("p", "cpu", "ddp", "32-true", "2", 1): "ok ddp subprocess local 2 32-true"}
    after = {("p", "cpu", "ddp", "32-true", "2", 1): "invalid-devices devices"}
    assert differences(before, after) == [
        "p: accelerator=cpu devices=2 strategy=ddp precision=32-true num_nodes=1: "
        "ok ddp subprocess local 2 32-true -> invalid-devices devices"
    ]


def test_the_committed_lock_pins_the_parallelism_section() -> None:
    committed = parse_parallelism((ROOT / LOCK_PATH).read_text(encoding="utf-8"))
    current = par.outcomes()
    assert len(current) == (len(par.SETTINGS) * len(par.LAYOUTS) * len(par.strategies()))
    changed = differences(committed, current)
    assert not changed, (
        "the engine's parallelism answers differ from matrix.lock; if the change is "
        "intended, run `nox -s matrix -- --update` and commit the file. Changed cells:\n"
        + "\n".join(changed)
    )


def test_parallelism_lock_tokens_are_plans_answers() -> None:
    for (profile, layout_key, strategy), token in par.outcomes().items():
        setting = next(s for s in par.SETTINGS if s.profile == profile)
        layout = next(lay for lay in par.LAYOUTS if lay.key == layout_key)
        try:
            result = interlock.plan(
                strategy=strategy, devices=setting.devices, num_nodes=setting.num_nodes,
                machine=profile_named(profile).machine,
                parallelism=None if layout.flag is None else dict(layout.flag))
        except ResolutionError as error:
            assert token == f"{error.code} {error.flag}"
            continue
        degrees = ",".join(f"{d}={n}" for d, n in result.parallelism.degrees().items()
                           if n != 1)
        assert token == f"ok {degrees}"


def test_parallelism_differences_read_well() -> None:
    before = {("cuda-8", "tp-8", "fsdp"): "ok tp=8"}
    after = {("cuda-8", "tp-8", "fsdp"): "unsupported-parallelism parallelism"}
    assert differences(before, after) == [
        "cuda-8: parallelism layout tp-8 strategy=fsdp: ok tp=8 -> "
        "unsupported-parallelism parallelism"
    ]


@pytest.mark.parametrize("damage", ["rows", "binary", "directory"])
def test_the_lock_check_refuses_a_lock_it_cannot_read_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        damage: str) -> None:
    monkeypatch.chdir(tmp_path)
    if damage == "rows":
        LOCK_PATH.write_text("# cells: 3; columns (devices/num_nodes): 1/1\n[x]\n"
                             "cpu ddp 32-true: z\n", encoding="utf-8")
    elif damage == "binary":
        LOCK_PATH.write_bytes(b"\xff\xfe\x00lock")
    else:
        LOCK_PATH.mkdir()
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("matrix.lock cannot be read (")
    assert "Traceback" not in err
    if damage == "rows":
        assert "line 3: outcome id 'z' is used but never defined" in err
