"""Property-based: any flags on any machine give a sound Plan or a ResolutionError."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from typeguard import suppress_type_checks

from interlock import Machine, Plan, ResolutionError, StrategySpec, plan, registered
from interlock.engine.errors import ERROR_CODES, FLAGS
from interlock.engine.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_DEVICES_TEXT,
    MAX_NUM_NODES,
    MAX_WORLD_SIZE,
)
from interlock.engine.machine import OPTIONAL_PACKAGES, START_METHODS
from interlock.engine.tables import (
    ACCELERATOR_INPUTS,
    ACCELERATOR_ROWS,
    CLUSTER_ROWS,
    LEGACY_PRECISIONS,
    PRECISION_NAMES,
)
from plugins import BF16Plugin, HalfTruePlugin, MyCheckpointIO, MyCluster, NotAPlugin

_count = st.integers(min_value=0, max_value=12).map(str)
_environments = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {"TORCHELASTIC_RUN_ID": st.just("r"), "WORLD_SIZE": _count, "LOCAL_WORLD_SIZE": _count,
         "GROUP_WORLD_SIZE": _count}
    ),
    st.fixed_dictionaries(
        {"SLURM_NTASKS": _count, "SLURM_NTASKS_PER_NODE": st.one_of(_count, st.just("2(x2)")),
         "SLURM_NNODES": _count,
         "SLURM_JOB_NAME": st.sampled_from(["train", "bash", "interactive"])}
    ),
    st.fixed_dictionaries({"OMPI_COMM_WORLD_SIZE": _count}),
    st.fixed_dictionaries({"PMI_SIZE": _count, "MPI_LOCALNRANKS": _count}),
    st.dictionaries(
        st.sampled_from(["WORLD_SIZE", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "PMI_SIZE",
                         "LSB_JOBID", "JSM_NAMESPACE_SIZE", "KUBERNETES_PORT", "RANK"]),
        st.text(max_size=4),
    ),
)

machines = st.builds(
    Machine,
    cuda_devices=st.one_of(st.integers(min_value=0, max_value=16),
                           st.just(MAX_DEVICES_PER_NODE)),
    mps_available=st.booleans(),
    xla_devices=st.sampled_from([0, 0, 1, 4, 8]),
    environ=_environments,
    interactive=st.booleans(),
    start_methods=st.lists(st.sampled_from(START_METHODS), unique=True).map(tuple),
    packages=st.frozensets(st.sampled_from(OPTIONAL_PACKAGES)),
)

_names = st.sampled_from(sorted({"auto", *registered(StrategySpec)}))
_junk_text = st.text(max_size=12)

# Values that fit plan()'s annotations (checked by typeguard as usual).
typed_flags = st.fixed_dictionaries(
    {
        "accelerator": st.one_of(st.sampled_from(ACCELERATOR_INPUTS), _junk_text),
        "devices": st.one_of(
            st.sampled_from(["auto", "-1", "0,1", "1,", "[]", "0", "2", "1,1", " 4 "]),
            st.integers(min_value=-3, max_value=20),
            st.lists(st.integers(min_value=-1, max_value=17), max_size=4),
            _junk_text,
            # around the bound on devices per node, and far beyond it
            st.integers(min_value=MAX_DEVICES_PER_NODE - 2, max_value=2**70),
        ),
        "strategy": st.one_of(_names, _junk_text, st.sampled_from(["dp", "DDP", "Fsdp "])),
        "precision": st.one_of(
            st.sampled_from(PRECISION_NAMES),
            st.sampled_from(list(LEGACY_PRECISIONS)),
            st.integers(min_value=-1, max_value=100),
            _junk_text,
        ),
        "num_nodes": st.one_of(st.integers(min_value=-1, max_value=4),
                               st.integers(min_value=MAX_NUM_NODES - 1, max_value=2**70)),
        "plugins": st.one_of(
            st.none(),
            st.lists(
                st.sampled_from([BF16Plugin, HalfTruePlugin, MyCheckpointIO, MyCluster,
                                 NotAPlugin]).map(lambda cls: cls()),
                max_size=3,
            ),
        ),
    }
)

# Values outside the annotations, as an untyped caller (a YAML file) could pass.
_anything = st.one_of(st.none(), st.floats(allow_nan=True), st.booleans(),
                      st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
                      st.lists(st.one_of(st.text(max_size=2), st.floats()), max_size=2),
                      st.binary(max_size=3))
untyped_flags = st.fixed_dictionaries(
    {
        "accelerator": _anything,
        "devices": _anything,
        "strategy": _anything,
        "precision": _anything,
        "num_nodes": st.one_of(_anything, st.text(max_size=3)),
        "plugins": st.one_of(_anything, st.text(max_size=3)),
    }
)


def check_plan(result: Plan, flags: dict[str, Any], machine: Machine) -> None:
    spec = result.spec
    context = f"plan({flags}) on [{machine.describe()}] gave {result}"
    assert result.world_size == len(result.parallel_devices) * result.num_nodes, context
    assert result.devices <= MAX_DEVICES_PER_NODE and result.num_nodes <= MAX_NUM_NODES, context
    assert result.world_size <= MAX_WORLD_SIZE, context
    assert result.accelerator in spec.accelerators, context
    assert result.precision in spec.precisions, context
    assert result.precision in ACCELERATOR_ROWS[result.accelerator].precisions, context
    assert result.parallel_devices, context
    assert all(d.split(":")[0] == result.accelerator for d in result.parallel_devices), context
    assert len(set(result.parallel_devices)) == len(result.parallel_devices) or (
        result.accelerator == "cpu"), context
    if spec.max_devices is not None:
        assert result.devices <= spec.max_devices, context
    if result.num_nodes > 1:
        assert spec.multi_node, context
    assert set(spec.requires) <= machine.packages, context
    row = CLUSTER_ROWS.get(result.cluster_environment)
    if row is not None and row.external and spec.launcher is not None:
        assert result.launcher == "external", context
    if result.launcher not in (None, "external") and machine.interactive:
        assert spec.interactive or result.devices == 1, context
    assert [s.stage for s in result.trace][-1] == "plugins", context
    assert result == plan(machine=machine, **flags), f"not deterministic: {context}"


def check_error(error: ResolutionError, flags: dict[str, Any], machine: Machine) -> None:
    context = f"plan({flags}) on [{machine.describe()}]: {error}"
    assert error.code in ERROR_CODES, context
    assert error.flag in FLAGS, context
    assert error.rule is not None and error.reason, context
    assert str(error).startswith(f"[{error.code}]"), context
    assert all(isinstance(c, str) for c in error.choices), context


@settings(max_examples=1500, deadline=None)
@given(flags=typed_flags, machine=machines)
def test_typed_flags_give_a_sound_plan_or_a_resolution_error(
    flags: dict[str, Any], machine: Machine
) -> None:
    try:
        result = plan(machine=machine, **flags)
    except ResolutionError as error:
        check_error(error, flags, machine)
    else:
        check_plan(result, flags, machine)


@settings(max_examples=500, deadline=None)
@given(flags=untyped_flags, machine=machines)
def test_untyped_junk_gives_a_resolution_error(flags: dict[str, Any], machine: Machine) -> None:
    with suppress_type_checks():
        try:
            result = plan(machine=machine, **flags)
        except ResolutionError as error:
            check_error(error, flags, machine)
        else:
            raise AssertionError(f"junk plan({flags}) was accepted: {result}")


@settings(max_examples=300, deadline=None)
@given(flags=typed_flags, machine=machines)
def test_valid_plans_are_reproduced_by_their_own_outcome(
    flags: dict[str, Any], machine: Machine
) -> None:
    """Feeding a plan's canonical outcome back in gives the same outcome."""
    try:
        first = plan(machine=machine, **flags)
    except ResolutionError:
        return
    if first.accelerator in ("cpu", "xla"):
        devices: Any = first.devices
    else:
        devices = [int(d.split(":")[1]) for d in first.parallel_devices]
    has_precision_plugin = any(
        getattr(type(p), "interlock_part_kind", None) == "precision" for p in first.plugins
    )
    again = plan(
        accelerator=first.accelerator, devices=devices, strategy=first.strategy,
        precision="32-true" if has_precision_plugin else first.precision,
        num_nodes=first.num_nodes, plugins=list(first.plugins), machine=machine,
    )
    assert (again.accelerator, again.strategy, again.precision, again.parallel_devices,
            again.launcher, again.cluster_environment) == (
        first.accelerator, first.strategy, first.precision, first.parallel_devices,
        first.launcher, first.cluster_environment)


# Numbers beyond the bounds of interlock.engine.limits, in every form a flag takes.
_beyond = MAX_DEVICES_PER_NODE + 1
_big = st.integers(min_value=_beyond, max_value=10**120) | st.sampled_from([2**62, 10**100])
# more digits than Python turns into text (built by a map: hypothesis prints strategies)
_huge = _big | st.integers(min_value=4301, max_value=6000).map(lambda k: 10**k)
_digits = st.integers(min_value=5, max_value=6000).map(lambda k: "1" * k)  # 11111 and up
absurd_devices = st.one_of(
    _huge,
    _big.map(str),
    _digits,
    st.tuples(st.lists(st.integers(min_value=0, max_value=7), max_size=3), _huge).map(
        lambda t: [*t[0], t[1]]),
    st.tuples(st.lists(st.integers(min_value=0, max_value=7).map(str), max_size=3),
              _big.map(str) | _digits).map(lambda t: ",".join([*t[0], t[1]])),
    st.sampled_from([_beyond, 10**5, 10**6]).map(lambda n: list(range(n))),
    st.sampled_from([_beyond, 10**5]).map(lambda n: ",".join(map(str, range(n)))),
    st.just(MAX_DEVICES_TEXT).map(lambda n: " " * n + "1"),
)


@settings(max_examples=200, deadline=None)
@given(devices=absurd_devices, machine=machines, strategy=_names)
def test_absurd_devices_are_refused_before_anything_is_placed(
    devices: Any, machine: Machine, strategy: str
) -> None:
    try:
        result = plan(devices=devices, strategy=strategy, machine=machine)
    except ResolutionError as error:
        context = f"devices of type {type(devices).__name__} on [{machine.describe()}]: {error}"
        assert (error.code, error.rule) == ("invalid-devices", "flags/devices-beyond-limit"), \
            context
        assert {step.stage for step in error.trace} <= {"flags"}, context
        assert len(str(error)) < 1000, context
    else:
        raise AssertionError(f"absurd devices gave a plan: {result.summary()}")


@settings(max_examples=100, deadline=None)
@given(num_nodes=_huge.filter(lambda n: n > MAX_NUM_NODES)
       | st.integers(min_value=MAX_NUM_NODES + 1, max_value=2**64),
       machine=machines)
def test_absurd_num_nodes_are_refused_when_parsed(num_nodes: int, machine: Machine) -> None:
    try:
        result = plan(num_nodes=num_nodes, machine=machine)
    except ResolutionError as error:
        assert (error.code, error.rule) == ("invalid-num-nodes", "flags/num-nodes-beyond-limit")
        assert {step.stage for step in error.trace} <= {"flags"}
    else:
        raise AssertionError(f"num_nodes beyond the bound gave a plan: {result.summary()}")
