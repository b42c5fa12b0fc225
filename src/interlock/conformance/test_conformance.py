"""The suite's test items (collected by ``pytest --pyargs interlock.conformance``).

Without ``--interlock-strategy`` the module collects nothing but one skipped item that
says how to run it.
"""

from __future__ import annotations

import pytest

from interlock.conformance.cases import (
    RUNNERS,
    Case,
    available_runners,
    broken_entry_points_asked,
    cases_for,
    resolve_strategies,
)
from interlock.conformance.checks import ANY_PRECISION
from interlock.conformance.declaration import check_declaration
from interlock.conformance.plugin import suite_state


def _cases(config: pytest.Config) -> list[Case]:
    names = config.getoption("--interlock-strategy", default=[])
    if not names:
        return []
    runner = config.getoption("--interlock-runner")
    if runner == "auto":
        runners = available_runners()
    elif runner in RUNNERS:
        runners = [runner]
    else:
        raise pytest.UsageError(f"--interlock-runner {runner!r}: choose cpu, cuda, tpu or auto")
    try:
        sizes = [int(w) for w in config.getoption("--interlock-world-sizes").split(",")]
    except ValueError as error:
        raise pytest.UsageError(f"--interlock-world-sizes: {error}") from None
    only = config.getoption("--interlock-precisions")
    try:
        specs = resolve_strategies(names)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    # an entry point that failed to load fails its declaration on every runner
    broken = [Case(ep.name, r, None, ANY_PRECISION, "declaration")
              for ep in broken_entry_points_asked(names) for r in runners]
    return broken + [case for spec in specs for r in runners
                     for case in cases_for(spec, r, sizes, only.split(",") if only else None)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    cases = _cases(metafunc.config)
    metafunc.parametrize("case", [
        pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(c.group)) for c in cases
    ])


def test_conformance(case: Case, request: pytest.FixtureRequest) -> None:
    if case.skip is not None:
        pytest.skip(case.skip)
    if case.check == "declaration":
        check_declaration(case.strategy, case.runner)
        return
    state = suite_state(request.config)
    assert state is not None, "the interlock plugin is not active"
    record = state.result(case)
    if record["status"] == "skipped":
        pytest.skip(record["message"])
    if record["status"] != "passed":
        pytest.fail(f"{case.check} ({case.strategy} on {case.runner}, {case.world_size} "
                    f"rank(s), {case.precision}): {record['status']}: {record['message']}",
                    pytrace=False)

