"""The suite schedules a registered precision for the strategies its row names, and
derives the single-process reference from the row's dtypes and scaler: a row it has no
reference for is refused with a message naming the row's facts, never compared
against the float32 baseline."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

import interlock
from interlock import PrecisionRow, StrategySpec, registered
from interlock.conformance import reference
from interlock.conformance.cases import cases_for, precisions_for
from interlock.conformance.checks import CheckFailed
from interlock.conformance.declaration import check_declaration
from interlock.conformance.options import validate


def _row(name: str, param: str, compute: str, scaler: bool = False) -> PrecisionRow:
    return PrecisionRow(
        name=name, param_dtype=param, compute_dtype=compute, scaler=scaler,
        plugin="probe", description="a precision registered by a test",
        factory="interlock.strategies.precision.base:Precision",
        accelerators=frozenset({"cpu"}), strategies=frozenset({"ddp_fork"}),
    )


Register = Callable[[PrecisionRow], None]


@pytest.fixture
def register() -> Iterator[Register]:
    """Registers rows, and unregisters them after the test."""
    rows: list[PrecisionRow] = []

    def add(row: PrecisionRow) -> None:
        interlock.register(row)
        rows.append(row)

    try:
        yield add
    finally:
        for row in rows:
            interlock.unregister(interlock.PrecisionRow, row.name)


def test_a_registered_precision_is_scheduled_for_the_strategies_its_row_names(
        register: Register) -> None:
    register(_row("32-probe", "float32", "float32"))
    specs = registered(StrategySpec)
    assert "32-probe" in precisions_for(specs["ddp_fork"], "cpu")
    listed = {c.precision for c in cases_for(specs["ddp_fork"], "cpu", [1]) if c.skip is None}
    assert "32-probe" in listed, f"ddp_fork's cases cover {sorted(listed)}"
    assert "32-probe" not in precisions_for(specs["single_device"], "cpu"), (
        "single_device is not named by the row, yet its cases include the precision")


def test_a_registered_precision_can_be_asked_for_by_name(
        register: Register) -> None:
    register(_row("32-probe", "float32", "float32"))
    options = validate(strategies=["ddp_fork"], runner="cpu", world_sizes="1",
                       precisions="32-probe")
    assert options.precisions == ("32-probe",)


@pytest.mark.parametrize(("name", "param", "autocast", "scaler", "compute"), [
    ("64-true", torch.float64, None, False, "float32"),
    ("32-true", torch.float32, None, False, "float32"),
    ("16-true", torch.float16, None, False, "half"),
    ("bf16-true", torch.bfloat16, None, False, "half"),
    ("16-mixed", torch.float32, torch.float16, True, "half"),
    ("bf16-mixed", torch.float32, torch.bfloat16, False, "half"),
    ("transformer-engine", torch.bfloat16, None, False, "float8"),
    ("transformer-engine-float16", torch.float16, None, False, "float8"),
])
def test_the_built_in_references_are_derived_as_before(
        name: str, param: torch.dtype, autocast: torch.dtype | None, scaler: bool,
        compute: str) -> None:
    assert reference.recipe(name) == reference.Recipe(param, autocast, scaler, compute)


def test_a_registered_row_gets_the_reference_its_dtypes_say(
        register: Register) -> None:
    register(_row("bf16-probe", "bfloat16", "bfloat16"))
    assert reference.recipe("bf16-probe") == reference.Recipe(
        torch.bfloat16, None, False, "half")
    assert reference.tolerance("bf16-probe", None) == reference.tolerance("bf16-true", None)
    got = reference.baseline("bf16-probe", 2)
    want = reference.baseline("bf16-true", 2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(("param", "compute", "scaler", "why"), [
    ("bfloat16", "float32", False, "neither one dtype nor float32 parameters"),
    ("float16", "float16", True, "a gradient scaler cannot unscale"),
    ("int8", "int8", False, "'int8' is not a parameter dtype"),
    ("float32", "float8", False, "FP8 compute is referenced over half-precision"),
])
def test_a_row_without_a_reference_is_refused_not_given_float32(
        register: Register, param: str, compute: str, scaler: bool,
        why: str) -> None:
    register(_row("odd-probe", param, compute, scaler))
    for attempt in (lambda: reference.recipe("odd-probe"),
                    lambda: reference.baseline("odd-probe", 1),
                    lambda: reference.tolerance("odd-probe", None)):
        with pytest.raises(reference.NoReference) as info:
            attempt()
        message = str(info.value)
        assert why in message, message
        assert f"param_dtype={param!r}, compute_dtype={compute!r}" in message, message


def test_the_declaration_fails_for_a_scheduled_precision_without_a_reference(
        register: Register) -> None:
    register(_row("odd-probe", "bfloat16", "float32"))
    with pytest.raises(CheckFailed, match="no single-process reference") as info:
        check_declaration("ddp_fork", "cpu")
    assert "odd-probe" in str(info.value)


def test_an_unregistered_precision_has_no_reference() -> None:
    with pytest.raises(reference.NoReference, match="not registered"):
        reference.recipe("no-such-precision")
