"""The suite's test items (collected by ``pytest --pyargs interlock.conformance``).

Without ``--interlock-strategy`` the module collects nothing but one skipped item that
says how to run it.
"""

from __future__ import annotations

import pytest

from interlock.conformance.cases import Case
from interlock.conformance.plugin import suite_state
from interlock.conformance.table import CHECKS_BY_ID, InPytest


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    state = suite_state(metafunc.config)
    metafunc.parametrize("case", [
        pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(c.group))
        for c in ([] if state is None else state.selection.cases)
    ])


def test_conformance(case: Case, request: pytest.FixtureRequest) -> None:
    if case.skip is not None:
        pytest.skip(case.skip)
    runs = CHECKS_BY_ID[case.check].runs
    if isinstance(runs, InPytest):  # nothing to launch: it runs here
        runs.run(case.strategy, case.runner)
        return
    state = suite_state(request.config)
    assert state is not None, "the interlock plugin is not active"
    record = state.result(case)
    if isinstance(record.get("seconds"), float):
        request.node.user_properties.append(("interlock_seconds", record["seconds"]))
    if record["status"] == "skipped":
        pytest.skip(record["message"])
    if record["status"] != "passed":
        pytest.fail(f"{case.check} ({case.strategy} on {case.runner}, {case.world_size} "
                    f"rank(s), {case.precision}): {record['status']}: {record['message']}",
                    pytrace=False)

