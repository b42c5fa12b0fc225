"""The rows, the plan they give and the pure placement arithmetic: no Ray cluster."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from interlock_ray import placement
from interlock_ray.environment import RayEnvironment, parse_slot

import interlock
from interlock import Machine, ResolutionError

PACKAGE = Path(__file__).parents[1] / "src" / "interlock_ray"

#: The only interlock modules this package may import: the documented public API.
PUBLIC = {"interlock", "interlock.strategies.launchers", "interlock.strategies.environments",
          "interlock.strategies.preemption"}

#: Each preset and the built-in strategy it names.
FOLLOWS = {"ray_ddp": "ddp", "ray_fsdp": "fsdp", "ray_model_parallel": "model_parallel"}
#: what a preset under the ray launcher has of its own
OWN_FIELDS = {"name", "description", "launcher", "launchers", "requires", "preset_of"}

CPU_MACHINE = Machine(packages=frozenset({"ray"}))


def test_the_package_imports_only_interlocks_public_api() -> None:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name == "interlock" or name.startswith("interlock."):
                    found.setdefault(name, set()).add(path.name)
    assert found, "the AST walk found no import of interlock at all"
    assert set(found) <= PUBLIC, {k: v for k, v in found.items() if k not in PUBLIC}


def test_the_rows_and_planning_import_neither_torch_nor_ray() -> None:
    code = ("import sys, interlock\n"
            "interlock.plan(strategy='ray_ddp', accelerator='cpu', devices=2,"
            " machine=interlock.Machine(packages={'ray'}))\n"
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize("name", sorted(FOLLOWS))
def test_each_preset_is_the_builtin_strategy_under_the_ray_launcher(name: str) -> None:
    specs = interlock.registered(interlock.StrategySpec)
    ours, theirs = specs[name], specs[FOLLOWS[name]]
    for field in dataclasses.fields(ours):
        if field.name not in OWN_FIELDS:
            assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
    assert (ours.launcher, ours.requires, ours.preset_of) == ("ray", ("ray",), FOLLOWS[name])
    # and the same plan as the strategy asked for under the launcher
    preset = interlock.plan(strategy=name, accelerator="cpu", devices=2, machine=CPU_MACHINE)
    axis = interlock.plan(strategy=FOLLOWS[name], launcher="ray", accelerator="cpu",
                          devices=2, machine=CPU_MACHINE)
    for fact in ("launcher", "cluster_environment", "world_size", "parallelism", "precision"):
        assert getattr(preset, fact) == getattr(axis, fact), fact


def test_the_ray_launcher_takes_the_strategies_its_row_names_and_no_other() -> None:
    row = interlock.registered(interlock.LauncherRow)["ray"]
    assert row.strategies == frozenset(FOLLOWS.values())
    with pytest.raises(ResolutionError) as caught:
        interlock.plan(strategy="deepspeed", launcher="ray", accelerator="cpu", devices=2,
                       machine=Machine(packages=frozenset({"ray", "deepspeed"})))
    assert caught.value.code == "unsupported-launcher"
    assert "strategy='fsdp'" in caught.value.choices


def test_the_parts_are_registered_through_entry_points_only() -> None:
    assert interlock.registered(interlock.PackageRow)["ray"].install.startswith("pip install")
    environment = interlock.registered(interlock.ClusterRow)["ray"]
    assert environment.factory == "interlock_ray.environment:RayEnvironment"
    row = interlock.registered(interlock.LauncherRow)["ray"]
    assert (row.environment, row.restarts, row.interactive) == ("ray", True, True)


@pytest.mark.parametrize("name", sorted(FOLLOWS))
@pytest.mark.parametrize("axis", [False, True])
def test_without_ray_the_rows_are_refused_with_an_install_hint(name: str, axis: bool) -> None:
    with pytest.raises(ResolutionError) as caught:
        interlock.plan(strategy=FOLLOWS[name] if axis else name,
                       launcher="ray" if axis else None, accelerator="cpu", devices=2,
                       machine=Machine())
    error = caught.value
    assert error.code == "missing-package"
    assert "pip install 'ray>=2.10'" in str(error)
    assert name not in error.choices


def test_the_plan_runs_its_ranks_in_the_ray_environment_and_says_how_they_are_placed() -> None:
    plan = interlock.plan(strategy="ray_ddp", accelerator="cpu", devices=2, num_nodes=3,
                          machine=CPU_MACHINE)
    assert (plan.launcher, plan.cluster_environment, plan.world_size) == ("ray", "ray", 6)
    step = next(s for s in plan.trace if s.rule == "launcher/own-environment")
    assert "3 bundles" in step.reason and "STRICT_SPREAD" in step.reason
    assert "not in this process's (local)" in step.reason
    gpu = interlock.plan(strategy="ray_fsdp", accelerator="cuda", devices=4,
                         machine=Machine(cuda_devices=4, packages=frozenset({"ray"})))
    step = next(s for s in gpu.trace if s.rule == "launcher/own-environment")
    assert "4 GPUs" in step.reason and "1 bundle" in step.reason
    assert gpu.parallelism is not None and gpu.parallelism.dp_shard == 4


def test_a_ray_environment_plugin_is_accepted_and_another_cluster_is_refused() -> None:
    env = RayEnvironment(cpus_per_rank=2)
    built = interlock.resolve(strategy="ray_ddp", accelerator="cpu", devices=2,
                              plugins=[env], machine=CPU_MACHINE)
    assert built.cluster_environment is env
    from interlock.strategies.environments import LocalEnvironment

    with pytest.raises(ResolutionError) as caught:
        interlock.plan(strategy="ray_ddp", accelerator="cpu", devices=2,
                       plugins=[LocalEnvironment()], machine=CPU_MACHINE)
    assert caught.value.code == "conflicting-flags"
    assert "ray cluster environment" in str(caught.value)
    # and the Ray environment given to a strategy another launcher starts
    with pytest.raises(ResolutionError) as caught:
        interlock.plan(strategy="ddp_spawn", accelerator="cpu", devices=2,
                       plugins=[RayEnvironment()], machine=CPU_MACHINE)
    assert (caught.value.code, caught.value.rule) == ("conflicting-flags",
                                                      "launcher/foreign-environment")
    assert "ray_ddp" in caught.value.choices
    # a strategy that runs under the ray launcher is told to ask for it
    with pytest.raises(ResolutionError) as caught:
        interlock.plan(strategy="fsdp", accelerator="cpu", devices=2,
                       plugins=[RayEnvironment()], machine=CPU_MACHINE)
    assert caught.value.choices[0] == "launcher='ray'"
    assert interlock.plan(strategy="fsdp", launcher="ray", accelerator="cpu", devices=2,
                          plugins=[RayEnvironment()], machine=CPU_MACHINE).launcher == "ray"


def test_bundles_hold_one_node_of_ranks_each() -> None:
    per_rank = placement.rank_resources("cuda", 2, {"trainer": 0.5})
    assert per_rank == {"CPU": 2.0, "GPU": 1.0, "trainer": 0.5}
    assert placement.bundles(per_rank, 4, 2) == [{"CPU": 8.0, "GPU": 4.0, "trainer": 2.0}] * 2
    with pytest.raises(ValueError, match="must reserve some resource"):
        placement.rank_resources("cpu", 0, {})
    assert placement.rank_resources("cuda", 0, {}) == {"GPU": 1.0}
    assert placement.strategy_for(1) == "PACK" and placement.strategy_for(2) == "STRICT_SPREAD"
    assert placement.slots(2, 2) == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]


def test_each_rank_sees_its_nodes_gpus_in_local_rank_order() -> None:
    # Ray gave node 0's ranks GPUs 3 and 1, node 1's ranks GPUs 0 and 2
    visible = placement.visible_devices([["3"], ["1"], ["0"], ["2"]], ranks_per_node=2)
    assert visible == ["3,1", "3,1", "0,2", "0,2"]
    # cuda:<local rank> is then the GPU Ray gave that rank
    assert [v.split(",")[i % 2] for i, v in enumerate(visible)] == ["3", "1", "0", "2"]
    with pytest.raises(ValueError, match="rank 1 was given 2 GPUs"):
        placement.visible_devices([["0"], ["1", "2"]], ranks_per_node=2)


def test_a_shortfall_is_described_with_what_the_cluster_has() -> None:
    text = placement.describe_shortfall(
        [{"CPU": 4.0}, {"CPU": 4.0}], "STRICT_SPREAD", {"CPU": 4.0, "memory": 1e9},
        {"CPU": 3.0}, nodes=2)
    assert "2 bundle(s) of CPU 4 on 2 different nodes" in text
    assert "CPU 8 in all" in text and "CPU 4 in all, CPU 3 free" in text
    assert "memory" not in text


@pytest.mark.parametrize("text", ["", "1", "a:b:c", "0:2:2", "-1:0:1", "0:0:0", "1:2:3:4"])
def test_a_damaged_slot_variable_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="INTERLOCK_RAY_SLOT"):
        parse_slot(text)


@pytest.mark.parametrize("kwargs", [
    {"cpus_per_rank": -1}, {"cpus_per_rank": float("nan")},
    {"cpus_per_rank": True}, {"resources_per_rank": {"GPU": 1}},
    {"resources_per_rank": {"x": -1}}, {"resources_per_rank": {"": 1}},
    {"placement_timeout": 0}, {"placement_timeout": float("inf")}, {"address": ""},
])
def test_absurd_settings_are_refused_when_the_environment_is_made(kwargs: dict[str, object]
                                                                  ) -> None:
    with pytest.raises(ValueError):
        RayEnvironment(**kwargs)  # type: ignore[arg-type]


def test_outside_a_rank_the_environment_is_rank_zero_of_one() -> None:
    env = RayEnvironment({})
    assert (env.global_rank(), env.local_rank(), env.node_rank(), env.world_size(),
            env.num_nodes()) == (0, 0, 0, 1, 1)
    assert not env.in_rank() and not RayEnvironment.detect({})
    import pickle

    copy = pickle.loads(pickle.dumps(RayEnvironment(cpus_per_rank=3,
                                                    resources_per_rank={"t": 1})))
    assert copy.cpus_per_rank == 3 and dict(copy.resources_per_rank) == {"t": 1.0}
