"""Declared warm-up: a strategy that deviates only after step 3 passes the parity
checks at their default step counts, and fails them once it declares ``parity_steps``
beyond its warm-up; the recipe check, which trains 10 steps, fails it either way (one
pytest run of the suite, world size 2, 32-true)."""

from __future__ import annotations

from typing import Any

import pytest
from suite_runs import run_suite

PARITY = {"training_parity", "accumulation_parity", "launch_arguments"}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The suite's report records over both registrations, by strategy."""
    run = run_suite(tmp_path_factory.mktemp("warm-up"), "warm_up_strategies",
                    ["warm_up_undeclared", "warm_up_declared"], timeout=600)
    by_strategy: dict[str, list[dict[str, Any]]] = {}
    for record in run["report"]["records"]:
        by_strategy.setdefault(record["strategy"], []).append(record)
    return by_strategy


def _outcomes(records: list[dict[str, Any]]) -> dict[str, str]:
    return {r["check"]: r["status"] for r in records if r["check"] in PARITY}


@pytest.mark.timeout(660)
def test_without_a_declared_warm_up_only_the_recipe_sees_the_deviation(
    records: dict[str, list[dict[str, Any]]],
) -> None:
    """The short parity checks stay inside the warm-up; the recipe trains past it."""
    mine = records["warm_up_undeclared"]
    failed = {r["check"]: r["message"][:300] for r in mine if r["status"] == "failed"}
    assert set(failed) == {"recipe_parity"}, f"the undeclared strategy failed {failed}"
    assert _outcomes(mine) == dict.fromkeys(PARITY, "passed")


@pytest.mark.timeout(660)
def test_declared_parity_steps_make_the_parity_checks_catch_it(
    records: dict[str, list[dict[str, Any]]],
) -> None:
    mine = records["warm_up_declared"]
    failed = {r["check"] for r in mine if r["status"] == "failed"}
    details = "\n".join(f"  {r['check']}: {r['message'][:300]}" for r in mine
                        if r["status"] == "failed")
    assert failed == PARITY | {"recipe_parity"}, (
        f"failed {sorted(failed)}, expected {sorted(PARITY)} and recipe_parity\n{details}")
    messages = {r["check"]: r["message"] for r in mine if r["check"] in PARITY}
    assert "parameters after 5 steps on 2 ranks" in messages["training_parity"]
    assert "parameters after 5 steps of 2 micro-batches" in messages["accumulation_parity"]
