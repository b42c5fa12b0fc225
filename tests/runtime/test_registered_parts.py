"""A registered part row is built by the runtime from its factory, like a built-in one:
``resolve()`` wires the registered precision and the detected registered cluster
environment into the strategy, and training runs through them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import sharded_workloads as sw
import torch
from harness import close, launch_forked
from third_party_parts import CountingPrecision, GradSumPrecision, GridEnvironment

import interlock
from interlock import CheckpointIORow, ClusterRow, Machine, PrecisionRow
from interlock.strategies.base import Strategy
from interlock.strategies.fsdp import FSDPStrategy
from interlock.strategies.precision.fsdp import FSDPPrecision

COUNTING = PrecisionRow(
    name="32-counting", param_dtype="float32", compute_dtype="float32", scaler=False,
    plugin="counting", description="float32 that counts its batches",
    factory="third_party_parts:CountingPrecision", accelerators=frozenset({"cpu"}),
    strategies=frozenset({"single_device", "ddp"}),
)


def _grid(env: Mapping[str, str]) -> bool:
    return "PROBE_GRID_JOB" in env


GRID = ClusterRow(
    name="probe_grid", detect=_grid, detect_doc="PROBE_GRID_JOB is set", external=False,
    variables=("PROBE_GRID_JOB",), description="an in-house grid scheduler",
    factory="third_party_parts:GridEnvironment",
)


@pytest.fixture
def registered() -> Iterator[None]:
    interlock.register(COUNTING)
    interlock.register(GRID)
    try:
        yield
    finally:
        interlock.unregister(interlock.PrecisionRow, COUNTING.name)
        interlock.unregister(interlock.ClusterRow, GRID.name)


def test_a_registered_precision_is_built_from_its_factory_and_trains(registered: None) -> None:
    strategy = interlock.resolve(accelerator="cpu", strategy="single_device",
                                 precision="32-counting", machine=Machine())
    assert type(strategy.precision) is CountingPrecision
    assert strategy.precision.precision == "32-counting"
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    strategy.setup_environment()
    module, [optimizer] = strategy.setup_module_and_optimizers(
        model, [torch.optim.SGD(model.parameters(), lr=0.1)])
    batch = torch.randn(4, 3)
    loss = module(batch).square().sum()
    strategy.backward(loss, module)
    strategy.optimizer_step(optimizer)
    assert strategy.precision.inputs == 1, "the forward did not go through the precision"
    plain_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(batch).square().sum().backward()
    plain_optimizer.step()
    torch.testing.assert_close(model.weight, reference.weight, rtol=0, atol=0)


GRAD_SUM = PrecisionRow(
    name="32-grad-sum", param_dtype="float32", compute_dtype="float32", scaler=False,
    plugin="grad_sum", description="float32 that sums each parameter's gradients",
    factory="third_party_parts:GradSumPrecision", accelerators=frozenset({"cpu"}),
    strategies=frozenset({"fsdp"}),
)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_fsdp_wraps_a_registered_precision_and_its_state_survives_a_checkpoint(
        kind: str, tmp_path: Path) -> None:
    interlock.register(GRAD_SUM)
    try:
        def fsdp() -> FSDPStrategy:
            built = interlock.resolve(strategy=FSDPStrategy(state_dict_type=kind),
                                      accelerator="cpu", devices=2, precision=GRAD_SUM.name,
                                      machine=Machine())
            assert isinstance(built, FSDPStrategy)
            return built

        strategy = fsdp()
        assert isinstance(strategy.precision, FSDPPrecision)
        assert type(strategy.precision.inner) is GradSumPrecision
        assert strategy.precision.mixed_precision_policy is None
        path = tmp_path / "ckpt"
        saved = launch_forked(strategy, sw.train_and_save, str(path), 3)
        per_parameter = saved["optimizer"]["state"].values()
        assert per_parameter and all(GradSumPrecision.KEY in v for v in per_parameter), (
            "the precision's own step did not run under FSDP")
        loaded = launch_forked(fsdp(), _load_on_every_rank, str(path))
        for rank, state in enumerate(loaded):
            close(state, saved["optimizer"], f"a {kind} checkpoint's optimizer state as "
                  f"rank {rank} loaded it, the precision's keys included")
    finally:
        interlock.unregister(interlock.PrecisionRow, GRAD_SUM.name)


def _load_on_every_rank(strategy: FSDPStrategy, path: str) -> list[object]:
    """Every rank's optimizer state after loading ``path`` into a fresh model."""
    state = sw.load_into_fresh(strategy, path)["optimizer"]
    gathered: list[object] = strategy.collective.all_gather_object(state)
    return gathered


def test_a_registered_precision_is_refused_where_its_row_does_not_reach(
        registered: None) -> None:
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="cpu", devices=2, strategy="fsdp", precision="32-counting",
                       machine=Machine())
    assert info.value.code == "unsupported-precision"


def test_a_registered_environment_is_detected_and_built_from_its_factory(
        registered: None) -> None:
    machine = Machine(environ={"PROBE_GRID_JOB": "1"})
    planned = interlock.plan(accelerator="cpu", devices=2, strategy="ddp_fork",
                             machine=machine)
    assert planned.cluster_environment == "probe_grid"
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp_fork",
                                 machine=machine)
    assert type(strategy.cluster_environment) is GridEnvironment


def test_unregistering_takes_the_part_out_of_plan_again() -> None:
    interlock.register(COUNTING)
    interlock.unregister(interlock.PrecisionRow, COUNTING.name)
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="cpu", precision="32-counting", machine=Machine())
    assert info.value.code == "unknown-precision"


def test_a_registered_checkpoint_io_is_built_from_its_row() -> None:
    from third_party_parts import TaggedCheckpointIO

    from interlock.strategies.io import checkpoint_io_for

    row = CheckpointIORow(name="probe_tagged", factory="third_party_parts:TaggedCheckpointIO",
                          description="torch's format under another name")
    broken = CheckpointIORow(name="probe_broken", factory="third_party_parts:NotACheckpointIO",
                             description="makes something else")
    interlock.register(row)
    interlock.register(broken)
    try:
        assert type(checkpoint_io_for("probe_tagged")) is TaggedCheckpointIO
        with pytest.raises(TypeError, match="made a NotACheckpointIO, not an interlock "
                           "CheckpointIO"):
            checkpoint_io_for("probe_broken")
    finally:
        interlock.unregister(interlock.CheckpointIORow, row.name)
        interlock.unregister(interlock.CheckpointIORow, broken.name)
    with pytest.raises(ValueError, match="unknown checkpoint IO 'probe_tagged'"):
        checkpoint_io_for("probe_tagged")


def test_a_plan_carries_the_rows_it_chose() -> None:
    planned = interlock.plan(accelerator="cpu", devices=2, strategy="ddp_fork",
                             precision="bf16-mixed", machine=Machine())
    rows = planned.rows
    assert {kind: row.name for kind, row in rows.items()} == {
        "strategies": "ddp_fork", "accelerators": "cpu", "precisions": "bf16-mixed",
        "environments": "local", "checkpoint_io": "torch", "launchers": "fork"}
    assert rows["strategies"] is planned.spec
    assert planned.row(PrecisionRow) is interlock.registered(PrecisionRow)["bf16-mixed"]
    assert planned.row(interlock.LauncherRow).start_method == "fork"
    single = interlock.plan(accelerator="cpu", strategy="single_device", machine=Machine())
    with pytest.raises(LookupError, match="this plan chose no launcher row"):
        single.row(interlock.LauncherRow)
    with pytest.raises(interlock.RegistrationError, match="int is no kind of row"):
        single.row(int)


def test_a_plan_builds_the_rows_it_planned_with_after_the_registry_changes() -> None:
    """Building reads the plan's rows, not the registry again: a precision unregistered
    after planning still builds, and one registered again under the same name with
    another factory does not replace the planned one."""
    import dataclasses

    interlock.register(COUNTING)
    try:
        planned = interlock.plan(accelerator="cpu", strategy="single_device",
                                 precision="32-counting", machine=Machine())
    finally:
        interlock.unregister(PrecisionRow, COUNTING.name)
    def built(plan: interlock.Plan) -> object:
        strategy = plan.build()
        assert isinstance(strategy, Strategy)
        return strategy.precision

    assert type(built(planned)) is CountingPrecision
    other = dataclasses.replace(COUNTING, factory="interlock.strategies.precision:TruePrecision")
    interlock.register(other)
    try:
        assert type(built(planned)) is CountingPrecision
        again = interlock.plan(accelerator="cpu", strategy="single_device",
                               precision="32-counting", machine=Machine())
        assert type(built(again)).__name__ == "TruePrecision"
    finally:
        interlock.unregister(PrecisionRow, COUNTING.name)


def test_a_pickled_plan_reads_the_rows_of_the_process_it_is_unpickled_in() -> None:
    """A spawned rank's strategy pickles its plan: the registry snapshot stays behind
    (its rows may hold callables that do not pickle), the rest arrives equal."""
    import pickle

    planned = interlock.plan(accelerator="cpu", devices=2, strategy="ddp_spawn",
                             machine=Machine(environ={"PROBE_GRID_JOB": "1"}))
    back = pickle.loads(pickle.dumps(planned))
    assert back == planned and back._tables is None and planned._tables is not None
    assert back.rows == planned.rows
