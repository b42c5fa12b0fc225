"""The check table is the suite's one list of checks: the docs page shows it as it is,
every check function has exactly one row, every row is reached by the driver or the
pytest items, and ids and skip reasons stay what reports and skip files name."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from interlock import StrategySpec, registered
from interlock.conformance import (
    checks,
    declaration,
    docs,
    driver,
    launch_checks,
    memory_checks,
    mesh_checks,
    recipes,
    reference,
)
from interlock.conformance.cases import cases_for
from interlock.conformance.runners import RUNNERS
from interlock.conformance.table import (
    CHECKS,
    Check,
    InDriver,
    InPytest,
    InRanks,
    WorldSizes,
    skip_reason,
)
from interlock.engine import registry
from interlock.engine.parallelism import DIMS
from interlock.engine.tables import ACCELERATORS, PRECISION_NAMES

ROOT = Path(__file__).resolve().parents[2]
#: the modules that hold check functions (``check_*``)
CHECK_MODULES: tuple[ModuleType, ...] = (checks, launch_checks, declaration, mesh_checks,
                                         recipes, memory_checks)


def _functions(check: Check) -> list[tuple[Callable[..., None], tuple[Any, ...]]]:
    """The functions a row runs, each with the arguments a `partial` binds (the mesh
    checks are one function bound to each dimension)."""
    runs = check.runs
    found: list[Callable[..., None]] = (
        [runs.run, runs.then_in_driver]
        if isinstance(runs, InRanks) and runs.then_in_driver is not None else [runs.run])
    bound: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    for fn in found:
        bound.append((fn.func, fn.args) if isinstance(fn, partial) else (fn, ()))
    return bound


def test_the_committed_table_of_checks_is_current() -> None:
    page = (ROOT / docs.CONFORMANCE_PATH).read_text(encoding="utf-8")
    assert docs.with_checks_table(page) == page, (
        "the table of checks in docs/conformance.md differs from "
        "interlock/conformance/table.py: run `python -m interlock.conformance.docs` and "
        "commit the result")


def test_the_generator_rewrites_only_what_lies_between_the_markers(tmp_path: Path) -> None:
    page = f"# Title\n\nhand-written\n\n{docs.BEGIN}\nold table\n{docs.END}\n\nmore text\n"
    (tmp_path / "docs").mkdir()
    (tmp_path / docs.CONFORMANCE_PATH).write_text(page, encoding="utf-8")
    assert docs.main([str(tmp_path)]) == 0
    written = (tmp_path / docs.CONFORMANCE_PATH).read_text(encoding="utf-8")
    assert written.startswith("# Title\n\nhand-written\n\n" + docs.BEGIN)
    assert written.endswith(docs.END + "\n\nmore text\n")
    assert "old table" not in written
    for check in CHECKS:
        assert f"| `{check.id}` |" in written, f"{check.id} is missing from the table"
    assert docs.main([str(tmp_path)]) == 0
    assert (tmp_path / docs.CONFORMANCE_PATH).read_text(encoding="utf-8") == written


def test_a_page_without_both_markers_is_refused() -> None:
    for page in ("no markers", docs.BEGIN, f"{docs.END}\n{docs.BEGIN}"):
        with pytest.raises(ValueError, match="around the table of checks"):
            docs.with_checks_table(page)


def test_every_check_function_is_declared_exactly_once() -> None:
    defined = {fn for module in CHECK_MODULES
               for name, fn in inspect.getmembers(module, inspect.isfunction)
               if name.startswith("check_") and fn.__module__ == module.__name__}
    declared = Counter(bound for check in CHECKS for bound in _functions(check))
    twice = sorted(f"{fn.__name__}{args}" for (fn, args), count in declared.items()
                   if count > 1)
    assert not twice, f"check functions in more than one row of the table: {twice}"
    functions = {fn for fn, _ in declared}
    undeclared = sorted(f"{fn.__module__}.{fn.__name__}" for fn in defined - functions)
    assert not undeclared, f"check functions no row of the table declares: {undeclared}"
    stray = sorted(f"{fn.__module__}.{fn.__name__}" for fn in functions - defined)
    assert not stray, f"rows whose function is not a check_* of {CHECK_MODULES}: {stray}"


#: checks added after the first committed reports, and the day they were added: a
#: report written before then (the GPU and TPU runners' need their machines) lacks them
CHECKS_ADDED: dict[str, str] = {"recipe_parity": "2026-12-03", "recipe_resume": "2026-12-03",
                                "memory": "2026-12-04"}


def test_check_ids_are_unique_and_those_the_committed_reports_name() -> None:
    ids = [check.id for check in CHECKS]
    assert len(ids) == len(set(ids)), f"ids declared twice: {Counter(ids).most_common(3)}"
    assert set(CHECKS_ADDED) <= set(ids)
    for path in sorted((ROOT / "docs").glob("conformance-report*.json")):
        report = json.loads(path.read_text())
        named = {r["check"] for r in report["records"]}
        assert not named - set(ids), (
            f"{path.name} names checks {sorted(named - set(ids))} that the table lacks: "
            "check ids are public, keep them")
        newer = {c for c, added in CHECKS_ADDED.items() if str(report["date"]) < added}
        assert set(ids) - named == newer - named, (
            f"{path.name} (dated {report['date']}) lacks {sorted(set(ids) - named)}; only "
            f"checks added after it may be missing ({sorted(newer)})")


def test_runners_come_from_the_accelerator_table() -> None:
    assert dict(RUNNERS) == {row.runner: row.name for row in ACCELERATORS if row.runner}
    assert dict(RUNNERS) == {"cpu": "cpu", "cuda": "cuda", "tpu": "xla"}


# ------------------------------------------------------------------ gating


def test_skip_reasons_keep_their_wording() -> None:
    by_id = {check.id: check for check in CHECKS}
    everything = frozenset({"accumulation", "clipping", "timeout", "resharding"})

    def why(check_id: str, capabilities: frozenset[str] = everything,
            precision: str | None = None, world_size: int = 2) -> str | None:
        return skip_reason(by_id[check_id], capabilities=capabilities,
                           precision=precision, world_size=world_size)

    assert why("accumulation_parity", frozenset()) == (
        "the strategy does not declare 'accumulation'")
    assert why("clipping", frozenset()) == "the strategy does not declare 'clipping'"
    assert why("scaler_skip", precision="32-true") == "32-true uses no loss scaler"
    assert why("scaler_skip", precision="16-mixed") is None
    assert why("interrupted_save") == ("runs at world size 1, where a failing save "
                                       "cannot strand ranks waiting in its barrier")
    assert why("interrupted_save", world_size=1) is None
    assert why("failure_propagation", world_size=1) == "needs at least 2 ranks"
    # a missing capability is named before a world size that does not fit
    assert why("collective_timeout", frozenset(), world_size=1) == (
        "the strategy does not declare 'timeout'")
    assert why("collective_timeout", world_size=1) == "needs at least 2 ranks"
    assert why("resharding", frozenset(), world_size=1) == (
        "the strategy does not declare 'resharding'")
    assert why("resharding", world_size=4) == (
        "runs with world size 2 (saves at 2, loads at 1)")
    assert why("resharding") is None


def test_every_check_applies_somewhere() -> None:
    """No row is gated so that nothing could ever run it."""
    capabilities = frozenset(c.capability for c in CHECKS if c.capability)
    for check in CHECKS:
        admitted = [(p, w) for p in PRECISION_NAMES for w in range(1, 5)
                    if skip_reason(check, capabilities=capabilities,
                                   precision=p if check.per_precision else None,
                                   world_size=w, parallel_dims=frozenset(DIMS)) is None]
        assert admitted, f"{check.id} applies at no precision and world size"


def test_each_mesh_check_runs_a_layout_of_its_dimension_on_four_ranks() -> None:
    everything = frozenset(DIMS)
    assert mesh_checks.layout_for(everything, "tp") == {
        "pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    assert mesh_checks.layout_for(everything, "dp_shard") == {
        "pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 1}
    assert mesh_checks.layout_for(frozenset({"dp_replicate"}), "dp_replicate") == {
        "pp": 1, "dp_replicate": 4, "dp_shard": 1, "cp": 1, "tp": 1}
    by_id = {check.id: check for check in CHECKS}
    why = skip_reason(by_id["mesh_tp"], capabilities=frozenset(), precision=None,
                      world_size=2, parallel_dims=frozenset({"dp_replicate"}))
    assert why == ("the strategy does not declare the 'tp' dimension "
                   "(StrategySpec.parallel_dims)")


def test_a_mesh_seen_wrongly_is_described_rank_by_rank() -> None:
    from interlock.engine.parallelism import MeshLayout, Parallelism

    layout = MeshLayout.of(Parallelism(dp_shard=2, tp=2))
    right = [{"rank": r, "coords": layout.coordinates(r),
              "flattened": {n: list(layout.flattened(n, r)) for n in
                            ("dp", "dp_shard_cp", "dp_cp")},
              "data": list(layout.flattened("dp", r))} for r in range(4)]
    assert mesh_checks._mesh_problems({"ranks": right}, layout) == []
    wrong = [dict(seen) for seen in right]
    wrong[1]["data"] = [1, 2]  # rank 1 reads the next shard, not its tp neighbour's
    problems = mesh_checks._mesh_problems({"ranks": wrong}, layout)
    assert problems == ["rank 1 reads data shard (1, 2) (rank, size), expected (0, 2)"]
    assert "not every rank's view" in mesh_checks._mesh_problems(None, layout)[0]


def test_a_misdeclared_row_is_refused() -> None:
    with pytest.raises(ValueError, match="loss scaler"):
        Check(id="x", runs=InDriver(run=launch_checks.check_relaunch), loss_scaler=True,
              guarantees="", why="")
    with pytest.raises(ValueError, match="launches nothing"):
        Check(id="x", runs=InPytest(run=declaration.check_declaration),
              world_sizes=WorldSizes(least=2, why=""), guarantees="", why="")


# ------------------------------------------------------------------ reachability


def test_the_cases_list_every_check() -> None:
    spec = registered(StrategySpec)["ddp"]
    listed = {case.check for case in cases_for(spec, "cpu", [1, 2])}
    assert listed == {check.id for check in CHECKS}


class _Strategy:
    """Just what the rank loop touches outside the checks."""

    global_rank = 0

    def __init__(self) -> None:
        from interlock.strategies.precision import Precision

        self.calls: list[str] = []
        self.precision = Precision()  # each check starts from its state

    def barrier(self) -> None:
        self.calls.append("barrier")

    def complete(self, plan: Any) -> None:
        self.calls.append(f"complete {plan.precision}")


def _recording(calls: list[str]) -> tuple[Check, ...]:
    """The table with every function replaced by one that records its check's id."""
    def recorder(check_id: str) -> Callable[[Any], None]:
        def record(ctx: Any) -> None:
            precision = getattr(ctx, "precision", None)
            calls.append(check_id if precision is None else f"{check_id} {precision}")
        return record

    rows = []
    for check in CHECKS:
        runs: InPytest | InRanks | InDriver = check.runs
        if isinstance(runs, InRanks):
            runs = dataclasses.replace(runs, run=recorder(check.id), then_in_driver=(
                None if runs.then_in_driver is None else recorder(f"{check.id} driver")))
        elif isinstance(runs, InDriver):
            runs = dataclasses.replace(runs, run=recorder(check.id))
        rows.append(dataclasses.replace(check, runs=runs))
    return tuple(rows)


def test_the_ranks_run_every_rank_check_in_table_order(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []
    monkeypatch.setattr(driver, "CHECKS", _recording(calls))
    # ddp as if it declared no capability: the gated checks are skipped
    spec = dataclasses.replace(registered(StrategySpec)["ddp"], capabilities=frozenset())
    real = registry.registered
    monkeypatch.setattr(registry, "registered", lambda row_type: (
        {"ddp": spec} if row_type is StrategySpec else real(row_type)))
    strategy = _Strategy()
    precisions = ["32-true", "16-mixed"]
    args = argparse.Namespace(strategy="ddp", accelerator="cpu", world_size=2)
    assert driver.run_rank_checks(strategy, args, precisions, str(tmp_path)) == 0

    expected: list[str] = []
    for index, precision in enumerate(precisions):
        for check in CHECKS:
            if not isinstance(check.runs, InRanks) or check.runs.when == "last" or (
                    check.runs.when == "once" and index):
                continue
            if skip_reason(check, capabilities=spec.capabilities,
                           precision=precision if check.per_precision else None,
                           world_size=2) is None:
                expected.append(f"{check.id} {precision}")
    expected += [f"{c.id} {precisions[-1]}" for c in CHECKS
                 if isinstance(c.runs, InRanks) and c.runs.when == "last"]
    assert calls == expected

    records = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()
               if json.loads(line)["status"] != "running"]
    reported = {(r["precision"], r["check"]): r for r in records}
    per_precision = [c.id for c in CHECKS if c.per_precision]
    once = [c.id for c in CHECKS if isinstance(c.runs, InRanks) and not c.per_precision]
    assert set(reported) == ({(p, c) for p in precisions for c in per_precision}
                             | {("*", c) for c in once})
    skipped = {key: r["message"] for key, r in reported.items() if r["status"] == "skipped"}
    assert skipped == {
        ("*", "interrupted_save"): "runs at world size 1, where a failing save cannot "
                                   "strand ranks waiting in its barrier",
        ("32-true", "scaler_skip"): "32-true uses no loss scaler",
        **{(p, "accumulation_parity"): "the strategy does not declare 'accumulation'"
           for p in precisions},
        **{(p, "clipping"): "the strategy does not declare 'clipping'" for p in precisions},
    }
    # one barrier after each check but the last, and the strategy re-completed once
    ran_before_last = len(records) - sum(
        1 for c in CHECKS if isinstance(c.runs, InRanks) and c.runs.when == "last")
    assert strategy.calls.count("barrier") == ran_before_last
    assert "complete 16-mixed" in strategy.calls


def test_the_driver_runs_every_launch_check_and_each_driver_half(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    calls: list[str] = []
    monkeypatch.setattr(driver, "CHECKS", _recording(calls))
    spec = registered(StrategySpec)["model_parallel"]  # declares every capability and dimension
    assert {c.capability for c in CHECKS if c.capability} <= spec.capabilities | {
        "engine_gradients", "parameter_offload"}
    ctx = launch_checks.LaunchContext(
        strategy=_Strategy(), spec=spec, world_size=2, workdir=tmp_path,
        resolve=lambda precision, devices: None,
        resolve_layout=lambda precision, devices, layout: None, environ_before={},
        passed=reference.model(), passed_before={})
    records = driver.run_driver_checks(ctx)
    launch = [c.id for c in CHECKS if isinstance(c.runs, InDriver)]
    assert calls == launch
    assert [(r["check"], r["status"]) for r in records] == [(i, "passed") for i in launch]

    calls.clear()
    merged = [{"precision": "*", "check": c.id, "status": "passed", "message": ""}
              for c in CHECKS if isinstance(c.runs, InRanks)]
    driver._then_in_driver(merged, ctx)
    assert calls == [f"{c.id} driver" for c in CHECKS
                     if isinstance(c.runs, InRanks) and c.runs.then_in_driver]


def test_a_driver_half_that_fails_fails_its_check_only(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(ctx: Any) -> None:
        raise checks.CheckFailed("the caller's module changed")

    rows = tuple(dataclasses.replace(c, runs=dataclasses.replace(c.runs, then_in_driver=refuse))
                 if isinstance(c.runs, InRanks) and c.runs.then_in_driver else c
                 for c in CHECKS)
    monkeypatch.setattr(driver, "CHECKS", rows)
    ctx = launch_checks.LaunchContext(
        strategy=_Strategy(), spec=registered(StrategySpec)["ddp"], world_size=2, workdir=tmp_path,
        resolve=lambda precision, devices: None,
        resolve_layout=lambda precision, devices, layout: None, environ_before={},
        passed=reference.model(), passed_before={})
    records = [{"precision": "*", "check": c.id, "status": "passed", "message": "rank 1: ok"}
               for c in CHECKS if isinstance(c.runs, InRanks)]
    driver._then_in_driver(records, ctx)
    halves = {c.id for c in CHECKS if isinstance(c.runs, InRanks) and c.runs.then_in_driver}
    for record in records:
        if record["check"] in halves:
            assert (record["status"], record["message"]) == (
                "failed", "rank 1: ok; the caller's module changed")
        else:
            assert (record["status"], record["message"]) == ("passed", "rank 1: ok")


def test_the_generator_refuses_junk_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    from interlock.conformance.docs import main

    with pytest.raises(SystemExit) as info:
        main(["--bogus"])
    assert info.value.code == 2
    assert main([str(tmp_path)]) == 2, "a root without docs/conformance.md"
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "conformance.md"
    page.write_text("no markers here\n", encoding="utf-8")
    assert main([str(tmp_path)]) == 2, "a page without the table's markers"
    assert page.read_text(encoding="utf-8") == "no markers here\n"
    assert sorted(p.name for p in page.parent.iterdir()) == ["conformance.md"]
