"""The stage runner: steps declare what they read and write, `plan()` and the matrix
run the same steps, and a memoised run reuses a step's result only for equal reads."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from interlock import Machine, ResolutionError
from interlock.engine.registry import current_parts, registered
from interlock.engine.runner import (
    SEEDS,
    Memo,
    Run,
    Step,
    check_steps,
    fact,
    run_memoised,
    run_steps,
)
from interlock.engine.specs import StrategySpec
from interlock.engine.stages import STAGES, STEPS
from interlock.engine.stages.flags import read_flags, seeds
from interlock.engine.stages.strategy import StrategyChoice
from interlock.engine.written import Written


class Counted(NamedTuple):
    value: str
    notes: tuple[str, ...] = ()
    trace: tuple[()] = ()


def test_the_steps_are_the_stages_after_flags_in_order() -> None:
    assert [step.name for step in STEPS] == [stage.name for stage in STAGES[1:]]


def test_every_seed_is_given_and_read_by_some_step() -> None:
    """The flags stage gives every seed (a flag of `Written` it does not parse, as
    written), and each is read by some step: none is parsed for nothing."""
    assert set(_seeds()) == SEEDS
    read = {fact for step in STEPS for fact in step.reads}
    assert SEEDS - read == set()
    assert {"launcher_flag", "parallelism_flag", "model_flag"} <= SEEDS


class ReadsPrecision(NamedTuple):
    precision: str


class ReadsColour(NamedTuple):
    colour: str


class ReadsFlags(NamedTuple):
    precision_flag: str
    num_nodes: int = 1


def _echo(inputs: tuple[object, ...]) -> Counted:
    return Counted("-".join(map(str, inputs)))


def test_a_step_reading_a_fact_nobody_gives_is_refused_at_once() -> None:
    with pytest.raises(RuntimeError, match=r"'early' reads \['precision'\]"):
        check_steps((Step("early", _echo, ReadsPrecision, writes={}),))
    with pytest.raises(RuntimeError, match=r"reads \['colour'\]"):
        check_steps((Step("odd", _echo, ReadsColour, writes={}),))
    # once a step before it writes the fact, it may be read
    check_steps((Step("first", _echo, ReadsFlags, writes={"value": "precision"}),
                 Step("then", _echo, ReadsPrecision, writes={})))


def test_a_step_must_declare_its_input_as_named_facts() -> None:
    with pytest.raises(RuntimeError, match="not a NamedTuple of the facts it reads"):
        Step("vague", _echo, tuple, writes={})


def test_a_fact_is_read_typed_or_not_at_all() -> None:
    facts = _seeds()
    assert fact(facts, "num_nodes", int) == 1
    with pytest.raises(RuntimeError, match="fact 'num_nodes' is 1, not a str"):
        fact(facts, "num_nodes", str)


def test_a_run_keeps_each_stage_result_and_the_facts_it_wrote() -> None:
    facts = _seeds(strategy_flag="ddp")
    done = run_steps(STEPS, Run(facts))
    strategy = done.result("strategy", StrategyChoice)
    assert strategy.spec.name == "ddp" and facts["spec"] is strategy.spec
    assert done.trace[0].stage == "accelerator" and done.trace[-1].stage == "plugins"
    assert set(done.results) == {step.name for step in STEPS} - {"memory"}, (
        "the memory stage runs only with a model's shape")


def test_a_memoised_step_runs_once_per_distinct_value_it_reads() -> None:
    calls: list[tuple[str, int]] = []

    def choose(inputs: ReadsFlags) -> Counted:
        calls.append((inputs.precision_flag, inputs.num_nodes))
        if inputs.num_nodes > 2:
            raise ResolutionError("invalid-num-nodes", flag="num_nodes",
                                  value=inputs.num_nodes, reason="too many for this test")
        return Counted(f"{inputs.precision_flag}x{inputs.num_nodes}")

    steps = check_steps((Step("choose", choose, ReadsFlags, writes={"value": "precision"}),))
    memo: Memo = {}
    results = []
    for precision, nodes in [("a", 1), ("a", 1), ("b", 1), ("a", 2), ("a", 3), ("a", 3)]:
        facts = _seeds(precision_flag=precision, num_nodes=nodes)
        refused = run_memoised(steps, facts, memo)
        results.append(refused.code if refused else facts["precision"])
    assert results == ["ax1", "ax1", "bx1", "ax2", "invalid-num-nodes", "invalid-num-nodes"]
    assert calls == [("a", 1), ("b", 1), ("a", 2), ("a", 3)], "a refusal is memoised too"


def _seeds(**flags: object) -> dict[str, object]:
    parts = current_parts()
    specs = registered(StrategySpec)
    facts = seeds(read_flags(Written(accelerator="cpu", devices=1, strategy="auto",
                                     precision="32-true", num_nodes=1),
                             specs=specs, parts=parts),
                  machine=Machine(), parts=parts, specs=specs)
    facts.update(flags)
    return facts
