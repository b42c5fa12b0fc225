"""The registry's three verbs, and the 24 per-kind verbs they replace.

``register(row)``, ``unregister(RowType, name)`` and ``registered(RowType)`` serve
every kind of row; the verbs before 0.2.0 (``register_precision``, ``precision_rows``,
``strategy_specs``, ...) still work for one release, each warning with the verb that
replaces it.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from typeguard import suppress_type_checks

import interlock
from interlock import (
    InterlockDeprecationWarning,
    RegistrationError,
    StrategyPreset,
    StrategySpec,
    plan,
    register,
    registered,
    unregister,
)
from interlock.engine import registry
from interlock.engine.optimizers import OptimizerRow
from interlock.engine.retired_verbs import RETIRED
from interlock.engine.tables import (
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PackageRow,
    PrecisionRow,
)
from machines import CPU

ROW_TYPES = (PackageRow, PrecisionRow, CheckpointIORow, AcceleratorRow, ClusterRow,
             LauncherRow, OptimizerRow, StrategySpec)

FP8 = PrecisionRow(
    name="fp8-verbs", param_dtype="bfloat16", compute_dtype="float8_e4m3fn", scaler=False,
    plugin="ilk_fp8", description="an in-house float8 kernel",
    factory="ilk_parts:FP8Precision", accelerators=frozenset({"cpu"}),
    strategies=frozenset({"single_device"}),
)


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    with registry.isolated():
        yield


def _retired(module: str, name: str) -> object:
    with warnings.catch_warnings():  # interlock.connector's own warning, on first import
        warnings.simplefilter("ignore", InterlockDeprecationWarning)
        home = importlib.import_module(module)
    with pytest.warns(InterlockDeprecationWarning) as caught:
        found = getattr(home, name)
    _, replacement = RETIRED[name]
    message = str(caught[0].message)
    assert f"{module}.{name}" in message and replacement in message, message
    return found


# --------------------------------------------------------------------------- the verbs


@pytest.mark.parametrize("row_type", ROW_TYPES, ids=lambda t: t.__name__)
def test_every_kind_is_read_through_one_verb(row_type: type) -> None:
    rows: Mapping[str, Any] = registered(row_type)
    assert rows, f"no built-in {row_type.__name__} rows"
    assert all(isinstance(row, row_type) for row in rows.values())
    assert all(name == row.name for name, row in rows.items())
    with pytest.raises(TypeError):
        rows["x"] = next(iter(rows.values()))  # type: ignore[index]


def test_each_kind_a_plan_chooses_names_the_plan_field_that_holds_its_choice() -> None:
    """`Plan.rows` finds each kind's row through the Plan attribute its kind names: a
    kind naming no attribute, or one that is not a name, would silently lose its row."""
    fields = {f.name: f.type for f in dataclasses.fields(interlock.Plan)}
    planned = {k.kind: k.planned_as for k in registry.KINDS.values()}
    assert planned == {"packages": None, "precisions": "precision",
                       "checkpoint_io": "checkpoint_io", "accelerators": "accelerator",
                       "environments": "cluster_environment", "launchers": "launcher",
                       "optimizers": "optimizer", "strategies": "strategy"}
    for attribute in filter(None, planned.values()):
        assert fields[attribute] in ("str", "str | None"), (attribute, fields[attribute])
    with_everything = plan(accelerator="cpu", devices=2, strategy="ddp_spawn",
                           model=interlock.ModelShape(parameters=1000), machine=CPU)
    assert set(with_everything.rows) == {kind for kind, attribute in planned.items() if attribute}


def test_register_unregister_and_the_version_move_together() -> None:
    before = registry.registry_version()
    register(FP8)
    assert registered(PrecisionRow)["fp8-verbs"] is FP8
    assert registry.registry_version() > before
    assert plan(precision="fp8-verbs", machine=CPU).precision == "fp8-verbs"
    unregister(PrecisionRow, "fp8-verbs")
    assert "fp8-verbs" not in registered(PrecisionRow)
    unregister(PrecisionRow, "fp8-verbs")  # again: nothing to do, no error


def test_a_preset_is_registered_and_read_as_the_spec_it_expands_to() -> None:
    register(StrategyPreset(name="ddp_verbs", strategy="ddp", launcher="spawn",
                            description="ddp, spawned"))
    spec = registered(StrategySpec)["ddp_verbs"]
    assert isinstance(spec, StrategySpec)
    assert (spec.preset_of, spec.launcher) == ("ddp", "spawn")
    assert spec.family == registered(StrategySpec)["ddp"].family
    with pytest.raises(RegistrationError, match=r"StrategyPreset rows are kept as "
                       r"StrategySpec rows: use registered\(StrategySpec\)"):
        registered(StrategyPreset)
    unregister(StrategyPreset, "ddp_verbs")
    assert "ddp_verbs" not in registered(StrategySpec)


@pytest.mark.parametrize("what", ["precisions", 3, None, dict, [1], {}])
def test_a_verb_given_no_row_type_says_which_types_there_are(what: object) -> None:
    """A user's script passes anything (typeguard would stop it first in these tests)."""
    types = r"PackageRow, PrecisionRow, .*StrategySpec, StrategyPreset"
    with suppress_type_checks():
        with pytest.raises(RegistrationError, match=r"is no kind of row; the row types "
                           r"are " + types):
            unregister(what, "fp8-verbs")  # type: ignore[arg-type]
        with pytest.raises(RegistrationError, match=r"is no kind of row; the row types "
                           r"are " + types):
            registered(what)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match=r"cannot register .* from register\(\): "
                       r"expected a " + types):
        register(what)


def test_a_subclass_of_a_row_type_is_a_row_of_its_kind() -> None:
    @dataclasses.dataclass(frozen=True)
    class NotedPrecision(PrecisionRow):
        note: str = ""

    row = NotedPrecision(**{f.name: getattr(FP8, f.name) for f in dataclasses.fields(FP8)},
                         note="kept")
    register(row)
    assert registered(PrecisionRow)["fp8-verbs"] is row


# --------------------------------------------------------------------------- retired


def test_every_retired_verb_is_listed_once_per_kind() -> None:
    nouns = ("strategy", "precision", "accelerator", "checkpoint_io", "environment",
             "launcher", "package", "optimizer")
    expected = {f"{verb}_{noun}" for noun in nouns for verb in ("register", "unregister")}
    expected |= {f"{noun}_rows" for noun in nouns if noun != "strategy"} | {"strategy_specs"}
    assert set(RETIRED) == expected and len(RETIRED) == 24
    assert not set(RETIRED) & set(interlock.__all__)


@pytest.mark.parametrize("module", ["interlock", "interlock.connector"])
@pytest.mark.parametrize("name", sorted(RETIRED))
def test_a_retired_verb_warns_naming_its_replacement(module: str, name: str) -> None:
    function = _retired(module, name)
    assert callable(function) and getattr(function, "__name__", None) == name


def test_the_retired_verbs_still_do_what_they_did() -> None:
    register_precision = _retired("interlock", "register_precision")
    precision_rows = _retired("interlock", "precision_rows")
    unregister_precision = _retired("interlock", "unregister_precision")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # calling them warns no more
        register_precision(FP8)  # type: ignore[operator]
        assert precision_rows()["fp8-verbs"] is FP8  # type: ignore[operator]
        assert precision_rows() is registered(PrecisionRow)  # type: ignore[operator]
        unregister_precision("fp8-verbs")  # type: ignore[operator]
    assert "fp8-verbs" not in registered(PrecisionRow)

    register_strategy = _retired("interlock", "register_strategy")
    register_strategy(StrategyPreset(  # type: ignore[operator]
        name="ddp_old_verb", strategy="ddp", launcher="fork", description="ddp, forked"))
    assert registered(StrategySpec)["ddp_old_verb"].launcher == "fork"
    strategy_specs = _retired("interlock.connector", "strategy_specs")
    assert "ddp_old_verb" in strategy_specs()  # type: ignore[operator]


def test_a_retired_verb_keeps_its_kind() -> None:
    """``register_precision`` registered precisions only: it still refuses other rows,
    in the words it used."""
    register_precision = _retired("interlock", "register_precision")
    accelerator = registered(AcceleratorRow)["cpu"]
    with pytest.raises(RegistrationError, match=r"cannot register precision 'cpu' from "
                       r"register_precision\(\): expected a PrecisionRow, got "
                       r"AcceleratorRow"):
        register_precision(accelerator)  # type: ignore[operator]


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'interlock' has no attribute "
                       "'register_widget'"):
        getattr(interlock, "register_widget")  # noqa: B009
