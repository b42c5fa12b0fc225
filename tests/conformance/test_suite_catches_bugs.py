"""The conformance suite itself: broken strategies fail exactly the checks that should
catch their bug, and a correct one fails none (one pytest run of the suite, inspected
through its JSON report)."""

from __future__ import annotations

from typing import Any

import pytest
from suite_runs import run_suite

#: the slow tier (``nox -s slow``, which CI runs): one run of the whole suite over
#: sixteen strategies, about two minutes of both cores. The checks change rarely;
#: after changing one, run ``nox -s slow`` before CI does.
pytestmark = pytest.mark.slow

#: strategy -> the checks its bug must fail (at world size 2, 32-true)
EXPECTED_FAILURES: dict[str, set[str]] = {
    # summed gradients: every parity check, and the norm clipping measures doubles
    "broken_sums_gradients": {"training_parity", "accumulation_parity", "launch_arguments",
                              "clipping", "recipe_parity"},
    "broken_gathers_reversed": {"collectives"},
    "broken_leaks_process_group": {"teardown", "relaunch", "failure_propagation",
                                   "collective_timeout", "resharding"},
    "broken_miscounts_world": {"lifecycle", "collectives"},
    "broken_drops_optimizer_state": {"checkpoint_round_trip", "resharding"},
    # the example plugin's compression passes only with the tolerance it declares
    "broken_compresses_undeclared": {"training_parity", "accumulation_parity",
                                     "launch_arguments", "recipe_parity"},
    # the launcher's own teardown after the check's two raises too, so launch raises
    "broken_tears_down_once": {"teardown", "launch_result"},
    # its loader is not the strategy's (no set_epoch): the recipe cannot resume an epoch
    "broken_shards_no_data": {"data_loading", "recipe_parity"},
    "broken_prints_on_every_rank": {"rank_zero_print"},
    "broken_loads_halfway": {"load_refusal"},
    # relaunch reads what launch returns
    "broken_drops_result": {"launch_result", "relaunch", "resharding"},
    # tensor-parallel neighbours read different shards: only a mesh with tp and a
    # data-parallel dimension shows it (at world size 2 the default mesh is tp 2 alone)
    "broken_mesh_ignores_tp": {"mesh_tp"},
    # each rank clips by its own shards' norm: the clipping check, and the recipe,
    # whose clipping is always active, at world size 2 and on the dp_shard=4 mesh
    "broken_clips_local_shards": {"clipping", "recipe_parity", "mesh_dp_shard"},
    # a DDP registered with FSDP's memory traits: it holds twice what its plan says, at
    # world size 2 and on the dp_shard=4 mesh (four times)
    "broken_claims_sharding": {"memory", "mesh_dp_shard"},
    "correct_ddp_subclass": set(),
}


@pytest.fixture(scope="module")
def suite_run(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the suite once over the strategies above that the selected tests ask about
    (all of them unless ``-k`` leaves only per-strategy tests); return its report and
    output."""
    here = [item for item in request.session.items
            if getattr(item, "module", None) is request.module]
    asked = {getattr(getattr(item, "callspec", None), "params", {}).get("strategy")
             for item in here}
    strategies = [s for s in EXPECTED_FAILURES if None in asked or s in asked]
    return run_suite(tmp_path_factory.mktemp("suite"), "broken_strategies",
                     strategies, "--interlock-workers", "2")


@pytest.mark.timeout(960)
@pytest.mark.parametrize("strategy", list(EXPECTED_FAILURES))
def test_each_strategy_fails_exactly_the_checks_for_its_bug(suite_run: dict[str, Any],
                                                             strategy: str) -> None:
    records = [r for r in suite_run["report"]["records"] if r["strategy"] == strategy]
    assert records, f"the report has no records for {strategy}"
    failed = {r["check"] for r in records if r["status"] == "failed"}
    passed = {r["check"] for r in records if r["status"] == "passed"}
    details = "\n".join(f"  {r['check']}: {r['message'][:300]}" for r in records
                        if r["status"] == "failed")
    assert failed == EXPECTED_FAILURES[strategy], (
        f"{strategy}: failed {sorted(failed)}, expected {sorted(EXPECTED_FAILURES[strategy])}"
        f"\n{details}")
    assert {"declaration", "lifecycle", "training_parity"} - failed <= passed


@pytest.mark.timeout(960)
def test_the_run_reports_versions_machine_and_a_summary(suite_run: dict[str, Any]) -> None:
    report = suite_run["report"]
    assert report["torch"] and report["interlock"] and report["machine"]["cpus"]
    assert suite_run["returncode"] == 1, "broken strategies must make the run fail"
    assert "interlock conformance" in suite_run["stdout"]
    assert "broken_sums_gradients" in suite_run["stdout"]
