"""Registries of part rows: precisions, accelerators, cluster environments, launchers.

A registered row takes part in `plan()` like a built-in one, refusals name it, an entry
point of each part group loads lazily (rows all or none), a broken one is named rather
than dropped, and every registration changes the version the plan memo is keyed by.
Entry points are simulated by replacing `importlib.metadata.entry_points`.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from collections.abc import Iterator, Mapping
from importlib import metadata
from importlib.metadata import EntryPoint, EntryPoints
from typing import Any

import pytest

from interlock import (
    Machine,
    PackageRow,
    RegistrationError,
    ResolutionError,
    StrategySpec,
    plan,
    register,
    registered,
    unregister,
)
from interlock.engine import registry
from interlock.engine.docs import render_rules_markdown
from interlock.engine.registry import broken_entry_points, entry_points, registry_version
from interlock.engine.tables import (
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PrecisionRow,
)
from machines import CPU, ONE_GPU

FP8 = PrecisionRow(
    name="fp8-ilk", param_dtype="bfloat16", compute_dtype="float8_e4m3fn", scaler=False,
    plugin="ilk_fp8", description="bfloat16 parameters, an in-house float8 kernel",
    factory="ilk_parts:FP8Precision", accelerators=frozenset({"cpu"}),
    strategies=frozenset({"single_device", "ddp"}),
)

NPU = AcceleratorRow(
    name="ilk_npu", machine_fact="extra_devices", precisions=frozenset({"32-true", "bf16-mixed"}),
    backend="hccl", description="an in-house NPU", factory="ilk_parts:NPUAccelerator",
    strategies=frozenset({"single_device", "ddp"}),
)


def _grid_detect(env: Mapping[str, str]) -> bool:
    return "ILK_GRID_JOB" in env


GRID = ClusterRow(
    name="ilk_grid", detect=_grid_detect, detect_doc="ILK_GRID_JOB is set", external=True,
    variables=("ILK_GRID_JOB", "ILK_GRID_SIZE", "ILK_GRID_LOCAL_RANK"),
    world_size_vars=("ILK_GRID_SIZE",), local_rank_vars=("ILK_GRID_LOCAL_RANK",),
    description="an in-house grid scheduler", factory="ilk_parts:GridEnvironment",
)
GRID_JOB = {"ILK_GRID_JOB": "7", "ILK_GRID_SIZE": "2", "ILK_GRID_LOCAL_RANK": "0"}
#: what torchrun-like launchers export as well; the grid is detected before `external`
TORCH_VARIABLES = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "m",
                   "MASTER_PORT": "1234"}

RAY = LauncherRow(name="ilk_ray", start_method=None, interactive=True, launches_single=True,
                  description="Ray actors", factory="ilk_parts:RayLauncher")


@pytest.fixture
def clean() -> Iterator[None]:
    """Every registry (parts and strategies) as it was, whatever the test registers."""
    with registry.isolated():
        yield


def _plugin_module(monkeypatch: pytest.MonkeyPatch, name: str, **attributes: object) -> None:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def _install(monkeypatch: pytest.MonkeyPatch, *entries: tuple[str, str, str]) -> None:
    """Make ``(group, name, "module:attribute")`` the installed entry points, and make
    every registry load its group again on next use."""
    installed = EntryPoints(EntryPoint(name=n, value=v, group=g) for g, n, v in entries)

    def entry_points(**params: Any) -> EntryPoints:
        return installed.select(**params) if params else installed

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    registry.forget_entry_points()


def _refusal(**flags: Any) -> ResolutionError:
    with pytest.raises(ResolutionError) as info:
        plan(**flags)
    return info.value


# --------------------------------------------------------------------------- precisions


@pytest.mark.usefixtures("clean")
def test_a_registered_precision_works_where_its_row_says_and_nowhere_else() -> None:
    register(FP8)
    assert plan(precision="fp8-ilk", machine=CPU).precision == "fp8-ilk"
    assert plan(precision="fp8-ilk", strategy="ddp", devices=2, machine=CPU).world_size == 2
    # a preset of a strategy the row names follows it
    assert plan(precision="fp8-ilk", strategy="ddp_find_unused_parameters_true", devices=2,
                machine=CPU).precision == "fp8-ilk"
    # so do ddp's launch-style presets and ddp under another launcher
    assert plan(precision="fp8-ilk", strategy="ddp_spawn", devices=2,
                machine=CPU).precision == "fp8-ilk"
    assert plan(precision="fp8-ilk", strategy="ddp", launcher="fork", devices=2,
                machine=CPU).precision == "fp8-ilk"
    # a strategy the row does not name refuses it, and lists what it takes
    error = _refusal(precision="fp8-ilk", strategy="model_parallel", devices=2, machine=CPU)
    assert (error.code, error.rule) == ("unsupported-precision",
                                        "precision/unsupported-by-strategy")
    assert "fp8-ilk" not in error.choices and "32-true" in error.choices
    # an accelerator the row does not name refuses it
    error = _refusal(precision="fp8-ilk", accelerator="cuda", machine=ONE_GPU)
    assert (error.code, error.rule) == ("unsupported-precision",
                                        "precision/unsupported-by-accelerator")
    assert "fp8-ilk" not in str(error).split("supports", 1)[1], str(error)
    # and it is offered where it works
    error = _refusal(precision="transformer-engine", machine=CPU)
    assert "fp8-ilk" in error.choices, error.choices


@pytest.mark.usefixtures("clean")
def test_a_registered_precision_is_a_choice_and_a_did_you_mean() -> None:
    register(FP8)
    error = _refusal(precision="fp8-ilj", machine=CPU)
    assert error.code == "unknown-precision"
    assert error.suggestion == "fp8-ilk" and "fp8-ilk" in error.choices


@pytest.mark.usefixtures("clean")
def test_unregistering_restores_the_built_in_answer() -> None:
    before = _refusal(precision="fp8-ilk", machine=CPU)
    register(FP8)
    plan(precision="fp8-ilk", machine=CPU)
    unregister(PrecisionRow, "fp8-ilk")
    after = _refusal(precision="fp8-ilk", machine=CPU)
    assert (after.code, after.choices, after.rule) == (before.code, before.choices, before.rule)
    assert "fp8-ilk" not in registered(PrecisionRow)


@pytest.mark.usefixtures("clean")
def test_every_registration_changes_the_memo_version() -> None:
    first = plan(machine=CPU)
    assert plan(machine=CPU) is first  # memoised
    for row in (FP8, NPU, GRID, RAY):
        version = registry_version()
        register(row)
        assert registry_version() != version, f"registering {row.name} kept the version"
        assert plan(machine=CPU) is not first, f"{row.name}: a plan from the memo survived"
        version = registry_version()
        register(row)  # the same row again: harmless, nothing changes
        assert registry_version() == version
        unregister(type(row), row.name)
        assert registry_version() != version, f"unregistering {row.name} kept the version"


@pytest.mark.usefixtures("clean")
def test_registration_refuses_a_taken_name_and_built_in_removal() -> None:
    clash = dataclasses.replace(FP8, name="bf16-mixed")
    with pytest.raises(RegistrationError, match=r"precision 'bf16-mixed' from "
                       r"register\(\): the name is already taken by a built-in "
                       r"precision \(interlock\.strategies\.precision\.mixed:MixedPrecision\)"):
        register(clash)
    with pytest.raises(RegistrationError, match="cannot unregister built-in accelerator 'cuda'"):
        unregister(AcceleratorRow, "cuda")
    with pytest.raises(RegistrationError, match="expected a PackageRow, PrecisionRow, "
                       "CheckpointIORow, AcceleratorRow, ClusterRow, LauncherRow, "
                       "OptimizerRow, StrategySpec, StrategyPreset; got str"):
        register("not a row")
    register(FP8)
    assert registered(PrecisionRow)["fp8-ilk"] is FP8


def test_the_views_are_read_only() -> None:
    with pytest.raises(TypeError):
        registered(PrecisionRow)["x"] = FP8  # type: ignore[index]


@pytest.mark.usefixtures("clean")
def test_a_malformed_row_lists_every_problem() -> None:
    bad = PrecisionRow(
        name="16", param_dtype="Float 16", compute_dtype="float16", scaler="no",  # type: ignore[arg-type]
        plugin="fsdp", description="", factory="no-colon", requires=("apex",),
        accelerators=frozenset({"tpu9"}), strategies=frozenset({"deepspeed", "nope"}),
    )
    with pytest.raises(RegistrationError) as info:
        register(bad)
    message = str(info.value)
    for fragment in ("legacy precision alias (of '16-mixed')", "param_dtype 'Float 16'",
                     "scaler must be a bool", "plugin 'fsdp' is a strategy's own",
                     "description", "factory 'no-colon'", "['apex']", "['tpu9'] are unknown",
                     "strategies ['nope'] are not registered",
                     "strategy 'deepspeed' builds every precision itself (DeepSpeed's "
                     "engine casts, scales and steps by its own config"):
        assert fragment in message, f"{fragment!r} missing from: {message}"
    # FSDP wraps a registered precision's own plugin, but not its own loss scaler
    scaled = dataclasses.replace(FP8, strategies=frozenset({"fsdp"}), scaler=True)
    with pytest.raises(RegistrationError, match="a loss scaler of the precision's own "
                       "would not agree across the shards"):
        register(scaled)
    assert "fp8-ilk" not in registered(PrecisionRow)
    bad_npu = dataclasses.replace(NPU, name="gpu", machine_fact="cuda_devices",
                                  precisions=frozenset({"fp4"}), backend="", max_devices=0)
    with pytest.raises(RegistrationError) as info:
        register(bad_npu)
    message = str(info.value)
    for fragment in ("name 'gpu' is an accelerator input of its own",
                     "machine_fact must be 'extra_devices'", "precisions ['fp4'] are unknown",
                     "backend must name", "max_devices must be None or an int"):
        assert fragment in message, f"{fragment!r} missing from: {message}"
    bad_grid = dataclasses.replace(GRID, name="plugin", local_size_vars=("ILK_UNDECLARED",),
                                   detect="yes")  # type: ignore[arg-type]
    with pytest.raises(RegistrationError) as info:
        register(bad_grid)
    message = str(info.value)
    for fragment in ("name 'plugin' is reserved", "detect must be None or a callable",
                     "local_size_vars reads ['ILK_UNDECLARED']"):
        assert fragment in message, f"{fragment!r} missing from: {message}"
    with pytest.raises(RegistrationError, match="start_method 'thread' is unknown"):
        register(dataclasses.replace(RAY, start_method="thread"))


@pytest.mark.usefixtures("clean")
def test_strategies_may_declare_registered_parts() -> None:
    register(dataclasses.replace(FP8, strategies=frozenset()))
    register(NPU)
    register(RAY)
    spec = StrategySpec(
        name="ilk_ray_ddp", factory="ilk_parts:RayDDP", description="DDP over Ray actors",
        family="ddp", accelerators=frozenset({"cpu", "ilk_npu"}),
        precisions=frozenset({"32-true", "fp8-ilk"}), launcher="ilk_ray",
    )
    registry.register(spec)
    result = plan(strategy="ilk_ray_ddp", precision="fp8-ilk", devices=2, machine=CPU)
    assert (result.launcher, result.precision) == ("ilk_ray", "fp8-ilk")
    assert spec.interactive  # from the registered launcher row
    # nobody else takes the precision now: the row names no strategy
    assert _refusal(precision="fp8-ilk", machine=CPU).code == "unsupported-precision"


def test_the_rules_page_documents_the_built_in_rows_only(clean: None) -> None:
    committed = render_rules_markdown()
    register(FP8)
    register(NPU)
    register(GRID)
    assert render_rules_markdown() == committed


# --------------------------------------------------------------------------- accelerators


@pytest.mark.usefixtures("clean")
def test_an_accelerator_row_names_its_checkpoint_io() -> None:
    tagged = CheckpointIORow(name="ilk_tagged", factory="ilk_parts:TaggedIO",
                             description="torch's format under another name")
    with pytest.raises(RegistrationError, match="checkpoint_io 'ilk_tagged' is unknown"):
        register(dataclasses.replace(NPU, checkpoint_io="ilk_tagged"))
    register(tagged)
    register(dataclasses.replace(NPU, checkpoint_io="ilk_tagged"))
    npus = Machine(extra_devices={"ilk_npu": 2})
    result = plan(accelerator="ilk_npu", machine=npus)
    assert result.checkpoint_io == "ilk_tagged"
    assert "plugins/checkpoint-io-ilk_tagged" in [step.rule for step in result.trace]
    assert plan(machine=CPU).checkpoint_io == "torch"  # the others keep theirs
    assert registered(CheckpointIORow)["ilk_tagged"] == tagged
    # its plans must not silently save another way: the accelerator goes first
    with pytest.raises(RegistrationError, match="cannot unregister checkpoint IO "
                       "'ilk_tagged': the accelerator ilk_npu saves through it"):
        unregister(CheckpointIORow, "ilk_tagged")
    unregister(AcceleratorRow, "ilk_npu")
    unregister(CheckpointIORow, "ilk_tagged")
    assert "ilk_tagged" not in registered(CheckpointIORow)


@pytest.mark.usefixtures("clean")
def test_a_registered_accelerator_counts_its_devices_when_the_machine_is_probed() -> None:
    register(dataclasses.replace(NPU, device_count="plugins:three_devices"))
    probed = Machine.probe()
    assert probed.extra_devices == {"ilk_npu": 3}
    result = plan()  # this machine, probed: the counter says three NPUs
    assert result.accelerator == "ilk_npu" and result.devices == 3


@pytest.mark.parametrize(("counter", "why"), [
    ("plugins:failing_device_count", r"failed \(RuntimeError: the driver is not loaded\)"),
    ("plugins:junk_device_count", "returned '3', not a count from 0 to 4096"),
    ("ilk_no_such_module:count", r"failed \(ImportError: the device counter of "
     r"accelerator 'ilk_npu' is implemented by ilk_no_such_module:count, which cannot be "
     r"imported: No module named 'ilk_no_such_module'"),
])
@pytest.mark.usefixtures("clean")
def test_a_device_counter_that_fails_is_reported_and_counts_none(counter: str,
                                                                 why: str) -> None:
    register(dataclasses.replace(NPU, device_count=counter))
    with pytest.warns(RuntimeWarning, match=f"accelerator 'ilk_npu' counts its devices "
                      f"with {counter}, which {why}"):
        probed = Machine.probe()
    assert probed.extra_devices == {"ilk_npu": 0}
    assert plan().accelerator == "cpu"


@pytest.mark.usefixtures("clean")
def test_a_device_counter_must_name_a_function() -> None:
    with pytest.raises(RegistrationError, match=re.escape(
            "device_count 'torch.xpu.device_count' must be None or look like "
            "'package.module:function'")):
        register(dataclasses.replace(NPU, device_count="torch.xpu.device_count"))


@pytest.mark.usefixtures("clean")
def test_a_registered_accelerator_takes_part_in_auto() -> None:
    register(NPU)
    npus = Machine(extra_devices={"ilk_npu": 4})
    result = plan(machine=npus)
    assert (result.accelerator, result.strategy) == ("ilk_npu", "ddp")
    assert result.parallel_devices == ("ilk_npu:0", "ilk_npu:1", "ilk_npu:2", "ilk_npu:3")
    fired = [step.rule for step in result.trace]
    assert "accelerator/auto-ilk_npu" in fired and "devices/ilk_npu-all" in fired, fired
    assert plan(devices=1, machine=npus).strategy == "single_device"
    assert plan(devices=[2], accelerator="ilk_npu", machine=npus).parallel_devices == (
        "ilk_npu:2",)
    # after the built-in device kinds: CUDA still wins where it is present
    both = Machine(cuda_devices=2, extra_devices={"ilk_npu": 4})
    assert plan(machine=both).accelerator == "cuda"
    assert plan(accelerator="ilk_npu", machine=both).accelerator == "ilk_npu"
    # without its devices it is refused with the machine fact
    error = _refusal(accelerator="ilk_npu", machine=CPU)
    assert error.code == "accelerator-unavailable"
    assert "this machine has 0 ilk_npu devices" in error.reason
    assert _refusal(accelerator="ilk_npu", devices=8, machine=npus).code == (
        "devices-unavailable")
    assert _refusal(accelerator="ilk_npu", precision="16-mixed", machine=npus).code == (
        "unsupported-precision")
    assert _refusal(accelerator="ilk_npu", strategy="fsdp", machine=npus).code == (
        "unsupported-accelerator")
    error = _refusal(accelerator="ilk_npv", machine=npus)
    assert error.suggestion == "ilk_npu" and "ilk_npu" in error.choices


def test_machine_extra_devices_are_validated() -> None:
    assert Machine(extra_devices={"ilk_npu": 2}) != Machine()
    assert Machine(extra_devices={"ilk_npu": 2}).to_dict()["extra_devices"] == {"ilk_npu": 2}
    assert "extra_devices" not in Machine().to_dict()
    for bad, fragment in (({"cuda": 1}, "built-in accelerator 'cuda'"),
                          ({"NPU": 1}, "not an accelerator name"),
                          ({"ilk_npu": -1}, "must be an int >= 0"),
                          ({"ilk_npu": True}, "must be an int >= 0"),
                          ({"ilk_npu": 10**6}, "at most 4096")):
        with pytest.raises(ValueError, match=fragment):
            Machine(extra_devices=bad)


# --------------------------------------------------------------------------- environments


@pytest.mark.usefixtures("clean")
def test_an_environment_from_an_entry_point_is_detected_and_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _plugin_module(monkeypatch, "ilk_parts", ENVIRONMENTS=lambda: [GRID])
    _install(monkeypatch, ("interlock.environments", "grid", "ilk_parts:ENVIRONMENTS"))
    result = plan(devices=2, machine=Machine(environ=GRID_JOB))
    assert (result.cluster_environment, result.launcher) == ("ilk_grid", "external")
    assert "cluster/ilk_grid" in [step.rule for step in result.trace]
    assert "cluster environment:  ilk_grid" in result.explain()
    (status,) = entry_points("environments")
    assert (status.name, status.names, status.broken) == ("grid", ("ilk_grid",), False)
    assert registered(ClusterRow)["ilk_grid"] is GRID
    # before `external`, which torch's variables alone would choose
    both = Machine(environ={**GRID_JOB, **TORCH_VARIABLES})
    assert plan(devices=2, machine=both).cluster_environment == "ilk_grid"
    # after the built-in detectors of specific clusters
    elastic = Machine(environ={**GRID_JOB, **TORCH_VARIABLES, "TORCHELASTIC_RUN_ID": "r"})
    assert plan(devices=2, machine=elastic).cluster_environment == "torchelastic"
    # its variables describe the job's geometry, checked like a built-in cluster's
    error = _refusal(devices=4, machine=Machine(environ=GRID_JOB))
    assert (error.code, error.rule) == ("cluster-mismatch", "cluster/world-size-mismatch")


@pytest.mark.usefixtures("clean")
def test_probing_keeps_a_registered_environments_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register(GRID)
    for name, value in GRID_JOB.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ILK_UNDECLARED", "x")
    environ = Machine.probe().environ
    assert {k: environ.get(k) for k in GRID_JOB} == GRID_JOB
    assert "ILK_UNDECLARED" not in environ


@pytest.mark.usefixtures("clean")
def test_an_entry_point_registers_its_rows_all_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = dataclasses.replace(FP8, name="fp8-bad", plugin="deepspeed")
    _plugin_module(monkeypatch, "ilk_parts", PRECISIONS=(FP8, bad), ONE=NPU)
    _install(monkeypatch, ("interlock.precisions", "fp8", "ilk_parts:PRECISIONS"),
             ("interlock.accelerators", "npu", "ilk_parts:ONE"))
    with pytest.warns(RuntimeWarning, match=r"entry point 'fp8' \(ilk_parts:PRECISIONS\) "
                      r"failed to load, so the precisions it provides are unavailable"):
        rows = registered(PrecisionRow)
    assert "fp8-ilk" not in rows and "fp8-bad" not in rows
    (broken,) = broken_entry_points()
    assert broken.names == ("fp8", "fp8-ilk", "fp8-bad")
    assert "plugin 'deepspeed' is a strategy's own precision family" in str(broken.error)
    assert "ilk_npu" in registered(AcceleratorRow)  # the other group is not affected


# --------------------------------------------------------------------------- broken


@pytest.mark.usefixtures("clean")
def test_a_broken_entry_point_of_each_kind_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.matrix.doctor import doctor_report

    _install(monkeypatch,
             ("interlock.precisions", "fp8", "ilk_missing_precision:ROWS"),
             ("interlock.accelerators", "npu", "ilk_missing_accelerator:ROWS"),
             ("interlock.environments", "grid", "ilk_missing_environment:ROWS"),
             ("interlock.launchers", "ray", "ilk_missing_launcher:ROWS"))
    with pytest.warns(RuntimeWarning) as warned:
        statuses = entry_points()
    assert len(warned) == 4, [str(w.message) for w in warned]
    assert [(ep.group, ep.name, ep.broken) for ep in statuses] == [
        ("interlock.precisions", "fp8", True), ("interlock.accelerators", "npu", True),
        ("interlock.environments", "grid", True), ("interlock.launchers", "ray", True)]
    for ep in statuses:
        assert "ModuleNotFoundError" in str(ep.error), ep

    # a precision or accelerator name nobody registered points at the broken plugin
    error = _refusal(precision="fp8-ilk", machine=CPU)
    assert error.code == "unknown-precision"
    assert ("the entry point 'fp8' (ilk_missing_precision:ROWS) failed to load and may "
            "provide it: ModuleNotFoundError") in error.reason, error.reason
    error = _refusal(accelerator="ilk_npu", machine=CPU)
    assert error.code == "unknown-accelerator"
    assert "entry point 'npu' (ilk_missing_accelerator:ROWS) failed to load" in error.reason
    # and a name the broken plugin stands for (its entry point's name) is its own refusal
    for flags in ({"precision": "fp8"}, {"accelerator": "NPU"}):
        error = _refusal(machine=CPU, **flags)
        assert (error.code, error.flag) == ("broken-entry-point", next(iter(flags))), error
        assert "failed to load (ModuleNotFoundError" in error.reason, error.reason
    # a plan chosen without the environments a broken plugin provides says so
    notes = plan(machine=CPU).notes
    assert any("entry point 'grid' (ilk_missing_environment:ROWS), which failed to load"
               in note and "local was chosen without them" in note for note in notes), notes
    # a strategy naming the launcher a broken plugin provides is refused, naming it
    with pytest.raises(RegistrationError, match=r"launcher 'ilk_ray' is unknown.*entry "
                       r"point 'ray' \(ilk_missing_launcher:ROWS\) failed to load"):
        registry.register(StrategySpec(
            name="ilk_ray_ddp", factory="ilk_parts:RayDDP", description="DDP over Ray",
            family="ddp", accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
            launcher="ilk_ray"))
    # and the doctor lists each group's entry points with the error
    report = doctor_report(CPU)
    for group, name in (("interlock.precisions", "fp8"), ("interlock.accelerators", "npu"),
                        ("interlock.environments", "grid"), ("interlock.launchers", "ray")):
        assert f"({group}):" in report, report
        assert f"no  entry point {name!r} (ilk_missing_" in report, report


# --------------------------------------------------------------------------- packages and
# launchers that place ranks on a cluster of their own


HAS_GRID = PackageRow(name="ilk_gridlib", install="pip install ilk-gridlib")
#: a launcher that runs its ranks in an environment of its own, as a Ray launcher does
PLACER = LauncherRow(name="ilk_placer", start_method=None, interactive=True,
                     launches_single=True, description="places ranks on the grid",
                     factory="ilk_parts:Placer", environment="ilk_grid",
                     placement=lambda *, accelerator, devices_per_node, num_nodes:
                     f"{num_nodes} grid nodes of {devices_per_node} {accelerator} slots")


def _grid_ddp(**changes: Any) -> StrategySpec:
    fields: dict[str, Any] = {
        "name": "ilk_grid_ddp", "factory": "interlock.strategies.ddp:DDPStrategy",
        "description": "DDP on the grid", "family": "ddp",
        "accelerators": frozenset({"cpu", "cuda"}), "precisions": frozenset({"32-true"}),
        "launcher": "ilk_placer", "requires": ("ilk_gridlib",)}
    return StrategySpec(**{**fields, **changes})


@pytest.mark.usefixtures("clean")
def test_a_registered_package_is_required_probed_and_hinted() -> None:
    with pytest.raises(RegistrationError, match="not optional packages the engine knows"):
        register(_grid_ddp(launcher="subprocess"))
    register(HAS_GRID)
    register(_grid_ddp(launcher="subprocess"))
    error = _refusal(strategy="ilk_grid_ddp", devices=2, machine=CPU)
    assert error.code == "missing-package" and "pip install ilk-gridlib" in str(error)
    present = Machine(packages=frozenset({"ilk_gridlib"}))
    assert plan(strategy="ilk_grid_ddp", devices=2, accelerator="cpu",
                machine=present).strategy == "ilk_grid_ddp"
    # probing looks for registered packages too ("json" is importable everywhere)
    register(PackageRow(name="json", install="(the standard library)"))
    assert "json" in Machine.probe().packages
    with pytest.raises(ValueError, match="does not consult"):
        Machine(packages=frozenset({"ilk_not_registered"}))


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(("row", "problem"), [
    (PackageRow(name="ilk-gridlib", install="pip install x"), "importable top-level"),
    (PackageRow(name="a.b", install="pip install x"), "importable top-level"),
    (PackageRow(name="ilk_ok", install=" "), "install must be"),
])
def test_a_malformed_package_row_is_refused(row: PackageRow, problem: str) -> None:
    with pytest.raises(RegistrationError, match=problem):
        register(row)


@pytest.mark.usefixtures("clean")
def test_a_launcher_that_places_ranks_elsewhere_names_their_environment() -> None:
    with pytest.raises(RegistrationError, match="environment 'ilk_grid' is not a cluster"):
        register(PLACER)
    with pytest.raises(RegistrationError, match=r"placement .* needs environment set"):
        register(dataclasses.replace(RAY, placement=lambda **_: "x"))
    register(GRID)
    register(PLACER)
    register(HAS_GRID)
    register(_grid_ddp())
    result = plan(strategy="ilk_grid_ddp", devices=2, num_nodes=3, accelerator="cpu",
                  machine=Machine(packages=frozenset({"ilk_gridlib"})))
    assert (result.launcher, result.cluster_environment) == ("ilk_placer", "ilk_grid")
    step = next(s for s in result.trace if s.rule == "launcher/own-environment")
    assert "3 grid nodes of 2 cpu slots" in step.reason
    # inside a rank the grid started (detected, external), the ranks run in place
    inside = plan(strategy="ilk_grid_ddp", devices=2, accelerator="cpu",
                  machine=Machine(packages=frozenset({"ilk_gridlib"}), environ=GRID_JOB))
    assert (inside.launcher, inside.cluster_environment) == ("external", "ilk_grid")


@pytest.mark.usefixtures("clean")
def test_a_placement_description_that_fails_does_not_fail_the_plan() -> None:
    def broken(**_: Any) -> str:
        raise KeyError("slots")

    register(GRID)
    register(dataclasses.replace(PLACER, placement=broken))
    register(HAS_GRID)
    register(_grid_ddp())
    result = plan(strategy="ilk_grid_ddp", devices=2, accelerator="cpu",
                  machine=Machine(packages=frozenset({"ilk_gridlib"})))
    step = next(s for s in result.trace if s.rule == "launcher/own-environment")
    assert "placement description failed (KeyError" in step.reason


@pytest.mark.usefixtures("clean")
def test_a_package_a_registered_row_requires_cannot_be_unregistered() -> None:
    register(HAS_GRID)
    register(_grid_ddp(launcher="subprocess"))
    with pytest.raises(RegistrationError, match="strategy 'ilk_grid_ddp' require it"):
        unregister(PackageRow, "ilk_gridlib")
    with pytest.raises(RegistrationError, match="cannot unregister built-in"):
        unregister(PackageRow, "deepspeed")
    registry.unregister(StrategySpec, "ilk_grid_ddp")
    unregister(PackageRow, "ilk_gridlib")
    assert "ilk_gridlib" not in registry.registered(PackageRow)
