"""The parallelism flag at plan time: reading it, the degrees, the mesh layout, and a
property over random degrees and worlds (tests/test_rules_each.py has one worked
example per rule)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typeguard import suppress_type_checks

from interlock import Machine, MeshLayout, Parallelism, ResolutionError, plan
from interlock.engine.errors import ERROR_CODES
from interlock.engine.parallelism import DIMS, FLATTENED
from machines import CPU, EIGHT_GPUS
from plugins import StandInModelParallel


def test_the_flag_reads_an_instance_a_mapping_and_text_alike() -> None:
    by_instance = plan(strategy="fsdp", devices=4, machine=CPU,
                       parallelism=Parallelism(dp_replicate=2))
    by_mapping = plan(strategy="fsdp", devices=4, machine=CPU,
                      parallelism={"dp_replicate": 2})
    by_text = plan(strategy="fsdp", devices=4, machine=CPU,
                   parallelism="dp_replicate=2, dp_shard=auto")
    by_minus_one = plan(strategy="fsdp", devices=4, machine=CPU,
                        parallelism={"dp_replicate": 2, "dp_shard": -1})
    for p in (by_instance, by_mapping, by_text, by_minus_one):
        assert p.parallelism == Parallelism(dp_replicate=2, dp_shard=2), p.parallelism
        assert p.mesh == MeshLayout(dims=DIMS, shape=(1, 2, 2, 1, 1))


@pytest.mark.parametrize(("flag", "says"), [
    ({"dp_shard": True}, "expected an int >= 1 or 'auto'"),
    ({"dp_shard": 0}, "dp_shard=0 is not a degree"),
    ({"dp_shard": 2.0}, "got float"),
    ({"tp": "auto"}, "dp_shard and tp are all 'auto'"),
    ({"dp_shard": 10**40}, "is not a degree"),
    ({7: 2}, "7 is not a dimension"),
    ("dp_shard", "'dp_shard' is not 'dimension=degree'"),
    ("", "no degrees given"),
    ("tp=2,tp=3", "'tp' is given twice"),
    (["dp_shard", 2], "got list"),
    ({"DP_Shard": "two"}, "expected an int >= 1 or 'auto'"),
])
def test_an_unreadable_flag_is_refused_with_the_reason(flag: object, says: str) -> None:
    """Values outside the flag's annotation must still meet a ResolutionError, so
    typeguard steps aside."""
    with suppress_type_checks(), pytest.raises(ResolutionError,
                                               match="invalid-parallelism") as info:
        plan(strategy="fsdp", devices=2, machine=CPU, parallelism=flag)  # type: ignore[arg-type]
    assert says in str(info.value)
    assert info.value.flag == "parallelism"


def test_a_parallelism_built_by_hand_is_checked_at_once() -> None:
    with pytest.raises(ResolutionError, match="only one degree can take"):
        Parallelism(tp="auto")
    assert Parallelism(tp=-1, dp_shard=1).tp == "auto"
    with suppress_type_checks(), pytest.raises(ResolutionError, match="got NoneType"):
        Parallelism(tp=None)  # type: ignore[arg-type]


def test_a_mismatch_shows_the_arithmetic_and_what_fits() -> None:
    with pytest.raises(ResolutionError) as info:
        plan(strategy="model_parallel", machine=EIGHT_GPUS,
             parallelism={"pp": 2, "dp_shard": 2, "tp": 4})
    error = info.value
    assert "pp=2 x dp_shard=2 x tp=4 = 16, but the world has 8 ranks" in str(error)
    assert set(error.choices) == {"pp=1", "dp_shard=1", "tp=2"}
    with pytest.raises(ResolutionError) as info:
        plan(strategy="fsdp", machine=EIGHT_GPUS, parallelism={"dp_replicate": 3})
    assert "dp_replicate=3 does not divide the world size 8" in str(info.value)
    assert info.value.choices == ("dp_replicate=2", "dp_replicate=4", "dp_replicate=8")


def test_the_older_model_parallel_options_are_translated_with_a_note() -> None:
    p = plan(strategy=_legacy(data_parallel_size=2, tensor_parallel_size=2),
             devices=4, machine=CPU)
    assert p.parallelism == Parallelism(dp_shard=2, tp=2)
    assert any("older spellings of parallelism={'dp_shard': 2, 'tp': 2}" in n
               for n in p.notes), p.notes
    # one left 'auto' takes what the other leaves
    p = plan(strategy=_legacy(tensor_parallel_size=4), devices=8, machine=CPU)
    assert p.parallelism == Parallelism(dp_shard=2, tp=4)
    # the flag agreeing with them is no conflict
    p = plan(strategy=_legacy(data_parallel_size=1, tensor_parallel_size=2),
             devices=2, machine=CPU, parallelism={"dp_shard": 1, "tp": 2})
    assert p.parallelism == Parallelism(dp_shard=1, tp=2)


def _legacy(**options: object) -> Any:
    """A model-parallel strategy instance given the older degree options."""
    return StandInModelParallel(**options)  # type: ignore[arg-type]


def test_a_strategy_with_one_layout_accepts_a_flag_that_asks_for_it() -> None:
    """DeepSpeed shards over every rank and nothing else: asking for exactly that is
    fine, asking for anything else is refused."""
    machine = Machine(cuda_devices=8, packages=frozenset({"deepspeed"}))
    for flag in ({}, {"dp_shard": "auto"}, "dp_shard=8"):
        assert plan(strategy="deepspeed", machine=machine,
                    parallelism=flag).parallelism == Parallelism(dp_shard=8), flag
    with pytest.raises(ResolutionError, match="'deepspeed' cannot run dp_replicate=8"):
        plan(strategy="deepspeed", machine=machine,
             parallelism={"dp_replicate": "auto", "dp_shard": 1})


def test_row_defaults() -> None:
    def degrees(strategy: str, **flags: Any) -> Parallelism:
        return plan(strategy=strategy, machine=EIGHT_GPUS, **flags).parallelism

    assert degrees("ddp") == Parallelism(dp_replicate=8, dp_shard=1)
    assert degrees("fsdp") == Parallelism(dp_shard=8)
    assert degrees("model_parallel") == Parallelism(dp_shard=1, tp=8)
    two_nodes = Machine(cuda_devices=4)
    assert plan(strategy="model_parallel", machine=two_nodes, num_nodes=2).parallelism == \
        Parallelism(dp_shard=2, tp=4)
    assert plan(machine=CPU).parallelism == Parallelism(dp_shard=1)


def test_explain_and_to_dict_show_the_degrees_and_the_mesh() -> None:
    p = plan(strategy="model_parallel", machine=EIGHT_GPUS, parallelism="pp=2,dp_shard=2,tp=2")
    text = p.explain()
    assert "parallelism:          pp=2 x dp_shard=2 x tp=2" in text
    assert "device mesh:          pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2" in text
    assert "parallelism/layout" in text
    view = p.to_dict()
    assert view["parallelism"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    assert view["mesh"] == {"dims": list(DIMS), "shape": [2, 1, 2, 1, 2]}


def test_the_same_flag_gives_the_same_plan_object() -> None:
    flag = Parallelism(dp_replicate=2)
    first = plan(strategy="fsdp", devices=4, machine=CPU, parallelism=flag)
    assert plan(strategy="fsdp", devices=4, machine=CPU,
                parallelism=Parallelism(dp_replicate=2)) is first
    assert plan(strategy="fsdp", devices=4, machine=CPU).parallelism != first.parallelism


def test_mesh_coordinates_are_row_major_with_tp_fastest() -> None:
    layout = MeshLayout.of(Parallelism(pp=2, dp_replicate=1, dp_shard=2, tp=2))
    assert [layout.coordinates(r)["tp"] for r in range(8)] == [0, 1] * 4
    assert [layout.coordinates(r)["pp"] for r in range(8)] == [0] * 4 + [1] * 4
    # the data-loading group ignores tp and pp: ranks 0, 1 (tp) and 4 (pp) share batch 0
    assert [layout.flattened("dp", r) for r in (0, 1, 2, 4)] == [(0, 2), (0, 2), (1, 2), (0, 2)]
    assert set(FLATTENED) == {"dp", "dp_shard_cp", "dp_cp"}
    with pytest.raises(ValueError, match="outside a mesh of 8 ranks"):
        layout.coordinates(8)


_degree = st.one_of(st.integers(min_value=1, max_value=8), st.just("auto"), st.just(-1))


@settings(max_examples=300, deadline=None)
@given(
    strategy=st.sampled_from(["ddp", "fsdp", "model_parallel", "deepspeed", "single_device"]),
    devices=st.integers(min_value=1, max_value=8),
    nodes=st.integers(min_value=1, max_value=3),
    degrees=st.dictionaries(st.sampled_from(DIMS), _degree, max_size=5),
    precision=st.sampled_from(["32-true", "bf16-mixed", "16-mixed", "16-true"]),
    accelerator=st.sampled_from(["cpu", "cuda"]),
)
def test_every_plan_multiplies_to_the_world_and_every_refusal_has_a_code(
    strategy: str, devices: int, nodes: int, degrees: dict[str, object], precision: str,
    accelerator: str,
) -> None:
    machine = Machine(cuda_devices=8, packages=frozenset({"deepspeed"}))
    try:
        p = plan(strategy=strategy, devices=devices, num_nodes=nodes, precision=precision,
                 accelerator=accelerator, machine=machine,
                 parallelism=degrees)  # type: ignore[arg-type]
    except ResolutionError as error:
        assert error.code in ERROR_CODES
        assert error.reason
        return
    assert p.parallelism.resolved
    assert math.prod(p.mesh.shape) == p.parallelism.world_size == p.world_size
    assert p.mesh.dims == DIMS
    spec = p.spec
    own = {d for d, v in spec.default_parallelism.items() if v != 1}
    for dim in DIMS:
        if dim not in spec.parallel_dims | own:
            assert getattr(p.parallelism, dim) == 1, (dim, p.parallelism)
    if nodes > 1 and int(p.parallelism.tp) <= devices:
        assert devices % int(p.parallelism.tp) == 0


def test_a_flattened_group_has_the_product_of_its_dimensions_degrees() -> None:
    degrees = Parallelism(pp=2, dp_replicate=3, dp_shard=5, cp=7, tp=11)
    assert [degrees.group_size(g) for g in ("dp", "dp_shard_cp", "dp_cp")] == \
        [3 * 5, 5 * 7, 3 * 5 * 7]
    assert degrees.data_parallel == 15
    with pytest.raises(ValueError, match=r"no flattened group 'tp'; the groups: dp, "
                       r"dp_shard_cp, dp_cp"):
        degrees.group_size("tp")
    with suppress_type_checks(), pytest.raises(ValueError, match="no flattened group"):
        degrees.group_size(["dp"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has an 'auto' degree in dp_shard_cp: no size"):
        Parallelism(dp_shard="auto", cp=2).group_size("dp_shard_cp")
