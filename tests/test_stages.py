"""The stages are pure functions over frozen inputs, and their rules keep to their part:
predicates never write, actions write only their stage's outputs."""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import interlock
import machines
from interlock import ResolutionError, StrategySpec, registered
from interlock.engine.planner import clear_cache
from interlock.engine.registry import current_parts
from interlock.engine.rules import (
    Decision,
    DevicesRequest,
    Draft,
    Rule,
    Stage,
    always,
    audited,
    run_stage,
)
from interlock.engine.stages import STAGES
from interlock.engine.stages.accelerator import AcceleratorInput, choose_accelerator
from interlock.engine.stages.devices import DevicesInput, place_devices
from interlock.engine.stages.flags import read_flag, read_flags
from interlock.engine.written import Written
from interlock.matrix.profiles import PROFILES
from interlock.matrix.space import FLAG_SPACE
from plugins import (
    BF16Plugin,
    LocalCluster,
    MyCheckpointIO,
    MyCluster,
    StandInAccelerator,
    StandInStrategy,
)


def _plan_all(cases: list[dict[str, Any]]) -> tuple[int, int]:
    planned = refused = 0
    for flags in cases:
        try:
            interlock.plan(**flags)
            planned += 1
        except ResolutionError:
            refused += 1
    return planned, refused


def _matrix_sample() -> list[dict[str, Any]]:
    cells = itertools.product(FLAG_SPACE.accelerators, FLAG_SPACE.devices,
                              FLAG_SPACE.strategies(), FLAG_SPACE.precisions,
                              FLAG_SPACE.num_nodes)
    sample = list(itertools.islice(cells, 0, None, 409))  # a prime: every flag varies
    return [dict(accelerator=a, devices=d, strategy=s, precision=p, num_nodes=n,
                 machine=profile.machine)
            for profile in PROFILES for a, d, s, p, n in sample]


def _edge_cases() -> list[dict[str, Any]]:
    slurm = machines.slurm(8, "4", 2)
    elastic = machines.torchelastic(8, 4, 2)
    return [
        dict(plugins=[BF16Plugin(), MyCheckpointIO()], machine=machines.CPU),
        dict(plugins=MyCluster(), devices=2, machine=machines.CPU),
        dict(plugins=LocalCluster(), devices=2, machine=machines.EIGHT_GPUS),
        dict(plugins="bf16", machine=machines.CPU),
        dict(plugins=[BF16Plugin(), BF16Plugin()], machine=machines.CPU),
        dict(plugins=BF16Plugin(), precision="16-mixed", machine=machines.CPU),
        dict(accelerator=StandInAccelerator("cuda"), machine=machines.EIGHT_GPUS),
        dict(strategy=StandInStrategy("ddp", devices=("cuda:0", "cuda:1"), num_nodes=2),
             machine=machines.EIGHT_GPUS),
        dict(strategy=StandInStrategy("ddp", precision=BF16Plugin()), precision="bf16-mixed",
             machine=machines.EIGHT_GPUS),
        dict(strategy=StandInStrategy("ddp", devices=("cuda:0",)), accelerator="cpu",
             machine=machines.EIGHT_GPUS),
        dict(devices="auto", num_nodes=2, machine=slurm),
        dict(devices=4, num_nodes=2, machine=slurm),
        dict(devices=3, num_nodes=2, machine=slurm),
        dict(devices="auto", num_nodes=2, machine=elastic),
        dict(devices=2, num_nodes=3, machine=elastic),
        dict(devices="auto", machine=machines.EIGHT_GPUS_NOTEBOOK),
        dict(strategy="single_device", devices="auto", machine=machines.EIGHT_GPUS),
        dict(accelerator="tpu", devices=[3], machine=machines.TPU),
        dict(strategy="dp", machine=machines.CPU),
        dict(devices=10**9, machine=machines.CPU),
        dict(precision=16, machine=machines.CPU),
    ]


def test_no_rule_writes_what_it_must_not() -> None:
    """Under `audited`, every predicate tried and every action applied is checked
    against its draft: a sample of the matrix on every profile, and the flags the
    matrix leaves out (plugins, instances, clusters, aliases, absurd values)."""
    cases = _matrix_sample() + _edge_cases()
    clear_cache()  # memoised plans would skip the rules
    with audited():
        planned, refused = _plan_all(cases)
    assert planned > 150 and refused > 1000, (planned, refused)


@dataclass(slots=True, kw_only=True)
class _Toy(Draft):
    OUTPUTS: ClassVar[frozenset[str]] = frozenset({"answer"})
    question: int
    answer: int = 0


def _toy_stage(rule: Rule[_Toy]) -> Stage[_Toy]:
    return Stage(name="toy", doc="", decisions=(
        Decision(id="toy/one", doc="", rules=(rule,)),))


def _grab(ctx: _Toy) -> bool:
    ctx.answer = 1
    return True


def _noting(ctx: _Toy) -> bool:
    ctx.note("a predicate that talks")
    return True


def _overwrite_input(ctx: _Toy) -> str:
    ctx.question = 0
    return "wrote its input"


def _answer(ctx: _Toy) -> str:
    ctx.answer = ctx.question * 2
    return "answered"


@pytest.mark.parametrize(("rule", "message"), [
    (Rule(id="toy/greedy", doc="", when=_grab, then=_answer),
     "predicate of rule 'toy/greedy' changed answer"),
    (Rule(id="toy/rude", doc="", when=always, then=_overwrite_input),
     "action of rule 'toy/rude' changed question"),
    (Rule(id="toy/chatty", doc="", when=_noting, then=_answer),
     "predicate of rule 'toy/chatty' changed notes"),
])
def test_the_audit_catches_a_rule_that_writes(rule: Rule[_Toy], message: str) -> None:
    parts = current_parts()
    run_stage(_toy_stage(rule), _Toy(question=3), parts)  # unaudited: nothing checks
    with audited(), pytest.raises(AssertionError, match=message):
        run_stage(_toy_stage(rule), _Toy(question=3), parts)


def test_an_action_that_writes_its_outputs_passes_the_audit() -> None:
    draft = _Toy(question=3)
    with audited():
        trace = run_stage(_toy_stage(Rule(id="toy/fine", doc="", when=always, then=_answer)),
                          draft, current_parts())
    assert draft.answer == 6 and [step.rule for step in trace] == ["toy/fine"]


def test_stage_results_are_frozen_and_inputs_compare_by_what_rules_read() -> None:
    parts, machine = current_parts(), machines.EIGHT_GPUS
    as_int = read_flag("devices", 2, specs=registered(StrategySpec), parts=parts)
    as_text = read_flag("devices", " 2", specs=registered(StrategySpec), parts=parts)
    assert as_int.devices == as_text.devices == DevicesRequest(kind="count", count=2)
    first = DevicesInput(machine=machine, parts=parts, accelerator="cuda",
                         devices=as_int.devices, num_nodes=1)
    second = DevicesInput(machine=machine, parts=parts, accelerator="cuda",
                          devices=as_text.devices, num_nodes=1)
    # the spelling is only quoted (it travels in `Written`): one input, one memo key
    assert first == second and hash(first) == hash(second)
    placed = place_devices(first, Written(devices=2))
    assert placed == place_devices(second, Written(devices=" 2"))
    assert placed.parallel_devices == ("cuda:0", "cuda:1")
    with pytest.raises(AttributeError):
        placed.parallel_devices = ()  # type: ignore[misc]
    choice = choose_accelerator(AcceleratorInput(machine=machine, parts=parts,
                                                 accelerator_flag="gpu"),
                                Written(accelerator="GPU"))
    assert choice.name == "cuda" and "accelerator='GPU'" in choice.reason


def test_a_refusal_carries_the_trace_of_every_stage_before_it() -> None:
    with pytest.raises(ResolutionError) as caught:
        interlock.plan(strategy="fsdp", precision="64-true", machine=machines.CPU,
                       devices=2)
    stages = [step.stage for step in caught.value.trace]
    assert stages[0] == "flags" and stages[-1] == "precision"
    assert {"accelerator", "devices", "cluster", "strategy"} <= set(stages)
    assert caught.value.rule is not None and caught.value.rule.startswith("precision/")


def test_the_flags_stage_reads_each_flag_alone_as_it_does_together() -> None:
    specs, parts = registered(StrategySpec), current_parts()
    together = read_flags(Written(accelerator="GPU", devices="0,1", strategy="DDP",
                                  precision="bf16", num_nodes=2),
                          specs=specs, parts=parts)
    assert together.accelerator == read_flag("accelerator", "GPU", specs=specs,
                                             parts=parts).accelerator == "gpu"
    assert together.devices == read_flag("devices", "0,1", specs=specs, parts=parts).devices
    assert together.strategy == read_flag("strategy", "DDP", specs=specs,
                                          parts=parts).strategy == "ddp"
    assert together.precision == read_flag("precision", "bf16", specs=specs,
                                           parts=parts).precision == "bf16-mixed"
    assert together.num_nodes == 2


def test_the_stages_run_in_the_documented_order() -> None:
    assert [stage.name for stage in STAGES] == [
        "flags", "sizing", "accelerator", "devices", "cluster", "strategy", "precision",
        "parallelism", "plugins", "memory"]
    for stage in STAGES:
        module = importlib.import_module(f"interlock.engine.stages.{stage.name}")
        assert getattr(module, f"{stage.name.upper()}_STAGE") is stage
