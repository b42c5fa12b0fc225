"""`interlock.matrix.diff`: which cells changed between two locks, and why."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from typeguard import suppress_type_checks

import interlock
from interlock import ResolutionError
from interlock.engine.errors import BUILD_ERROR_CODES, ERROR_CODES
from interlock.engine.stages import STAGES
from interlock.matrix import diff
from interlock.matrix import lock as lockfile
from interlock.matrix.diff import (
    LockCells,
    LockDiff,
    LockFileError,
    current_lock,
    diff_locks,
    read_lock,
    render_text,
    run_diff,
    to_json,
)
from interlock.matrix.lock import CellKey
from interlock.matrix.parallelism import ParallelismKey
from interlock.matrix.profiles import PROFILES, profile_named
from interlock.matrix.space import FlagSpace

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "matrix.lock"
HINT = "`interlock matrix --format lock --output PATH`"
DAMAGED = f"; the lock is damaged (regenerate it with the interlock version it pins: {HINT})"

# cells of the committed lock, and what the engine answers for them
STRATEGY_CELL: CellKey = ("cuda-8", "cuda", "ddp", "32-true", "2", 1)  # ddp subprocess 2
REFUSED_CELL: CellKey = ("cpu-laptop", "cuda", "ddp", "32-true", "1", 1)  # no CUDA here
WORLD_CELL: CellKey = ("cuda-8", "cuda", "ddp", "32-true", "4", 1)  # world size 4
RESOLVED_CELL: CellKey = ("cuda-8", "cuda", "ddp", "16-mixed", "2", 1)
REFUSAL_CELL: CellKey = ("cuda-1", "cuda", "ddp", "32-true", "2", 1)  # 2 of 1 GPU
PRECISION_CELL: CellKey = ("cuda-8", "cuda", "ddp", "bf16", "2", 1)  # bf16-mixed
CLUSTER_CELL: CellKey = ("cuda-8", "cuda", "ddp", "16-true", "2", 1)
MESH_CELL: ParallelismKey = ("cuda-8-extras", "not-given", "ddp")  # dp_replicate=8
DROPPED_LAYOUT: ParallelismKey = ("cpu-laptop", "tp-3", "deepspeed_stage_3")


# lock text surgery ------------------------------------------------------------------


def _columns(lines: list[str]) -> list[tuple[str, int]]:
    spec = next(line for line in lines if line.startswith("# cells:")).split("): ", 1)[1]
    return [(c.rpartition("/")[0], int(c.rpartition("/")[2])) for c in spec.split(" ")]


def _set_cells(text: str, changes: Mapping[CellKey, str]) -> str:
    """``text`` with each cell of ``changes`` set to its outcome (defining new ids)."""
    lines = text.splitlines()
    ids = {line[1:].partition(" ")[2]: line[1:].partition(" ")[0]
           for line in lines if line.startswith("@")}
    last = max(i for i, line in enumerate(lines) if line.startswith("@"))
    for outcome in sorted(set(changes.values()) - set(ids)):
        ids[outcome] = f"test{len(ids)}"
        last += 1
        lines.insert(last, f"@{ids[outcome]} {outcome}")
    columns = _columns(lines)
    out: list[str] = []
    profile = ""
    for line in lines:
        if line.startswith("["):
            profile = line[1:line.index("]")]
        if not line or line[0] in "#@[" or line.startswith("parallelism "):
            out.append(line)
            continue
        head, _, row = line.partition(": ")
        accelerator, strategy, precisions = head.split(" ")
        tokens = [t.partition("*") for t in row.split(" ")]
        expanded = [ident for ident, _, n in tokens for _ in range(int(n or 1))]
        touched = False
        for precision in precisions.split(","):
            row_ids = list(expanded)
            for i, (devices, nodes) in enumerate(columns):
                key = (profile, accelerator, strategy, precision, devices, nodes)
                if key in changes:
                    row_ids[i] = ids[changes[key]]
            if row_ids != expanded:
                touched = True
            out.append(f"{accelerator} {strategy} {precision}: {' '.join(row_ids)}")
        if not touched:
            out[-len(precisions.split(",")):] = [line]
    return "\n".join(out) + "\n"


def _set_layouts(text: str, changes: Mapping[ParallelismKey, str | None]) -> str:
    """``text`` with each parallelism cell of ``changes`` set (None: the line dropped)."""
    out: list[str] = []
    for line in text.splitlines():
        key = tuple(line.partition(": ")[0].split(" ")[1:])
        if line.startswith("parallelism ") and key in changes:
            outcome = changes[key]  # type: ignore[index]
            if outcome is not None:
                out.append(f"{line.partition(': ')[0]}: {outcome}")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def _write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return path


def _refusal_rule(key: CellKey) -> str | None:
    profile, accelerator, strategy, precision, devices, nodes = key
    with pytest.raises(ResolutionError) as caught:
        interlock.plan(accelerator=accelerator, devices=int(devices), strategy=strategy,
                       precision=precision, num_nodes=nodes,
                       machine=profile_named(profile).machine)
    return caught.value.rule


# fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text() -> str:
    return LOCK.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def committed() -> LockCells:
    return read_lock(LOCK)


@pytest.fixture(scope="module")
def live() -> LockCells:
    """This engine's cells (kept by current_lock() for the tests after). typeguard steps
    aside: 756,000 cells take most of a minute under it, and the engine's types are
    checked by the engine's own tests."""
    with suppress_type_checks():
        return current_lock()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("locks")


@pytest.fixture(scope="module")
def one_cell(text: str, folder: Path) -> Path:
    """The committed lock with STRATEGY_CELL pinned to ddp_spawn."""
    return _write(folder, "one-cell.lock",
                  _set_cells(text, {STRATEGY_CELL: "ok ddp_spawn spawn local 2 32-true"}))


@pytest.fixture(scope="module")
def one_layout(text: str, folder: Path) -> Path:
    """The committed lock with MESH_CELL pinned to another mesh."""
    return _write(folder, "one-layout.lock", _set_layouts(text, {MESH_CELL: "ok dp_shard=8"}))


@pytest.fixture(scope="module")
def one_cell_read(one_cell: Path) -> LockCells:
    return read_lock(one_cell)


@pytest.fixture(scope="module")
def one_layout_read(one_layout: Path) -> LockCells:
    return read_lock(one_layout)


@pytest.fixture(scope="module")
def small_text() -> str:
    """A real lock over a small flag space on two profiles (for the damaged files)."""
    space = FlagSpace(accelerators=("cpu", "cuda"), devices=("auto", 2),
                      precisions=("32-true", "bf16"), num_nodes=(1, 2), strategy_names=("ddp",))
    return lockfile.render(profiles=PROFILES[:2], space=space,
                           parallelism={("cpu-laptop", "ddp", "ddp"): "ok dp_replicate=4"})


# the committed lock and the live engine ----------------------------------------------


def test_the_committed_lock_is_what_the_engine_decides(committed: LockCells,
                                                       live: LockCells) -> None:
    found = diff_locks(committed, live)
    assert found.empty and not found and found.groups == () and found.changed == 0
    assert found.total_cells == len(live.cells) + len(live.parallelism)
    assert len(committed.cells) == len(live.cells) == 756_000
    assert committed.source == str(LOCK) and not committed.live
    assert live.source == f"interlock {interlock.__version__} (this installation)"
    assert live.live
    assert render_text(found, committed, live) == (
        f"matrix diff: {LOCK} -> {live.source}\n"
        f"no cell changed ({found.total_cells} cells)")


def test_read_lock_reads_what_lock_parse_reads(small_text: str, tmp_path: Path) -> None:
    read = read_lock(_write(tmp_path, "small.lock", small_text))
    assert read.cells == lockfile.parse(small_text)
    assert read.parallelism == lockfile.parse_parallelism(small_text)
    assert read.source == str(tmp_path / "small.lock")


def test_the_tables_name_decisions_the_engine_has() -> None:
    """diff's tables of which decisions set which field name the engine's decisions: a
    renamed decision would otherwise leave the rules of a diff quietly empty."""
    decisions = {d.id for stage in STAGES for d in stage.decisions}
    named = {d for ds in diff._FIELD_DECISIONS.values() for d in ds}
    assert named | set(diff._MESH_DECISIONS) <= decisions


def test_every_refusal_code_has_the_decisions_that_refuse_it() -> None:
    """A refusal that now resolves is explained by the rules of the decisions that
    refuse its code (`Rule.refuses`): a code no rule declares would find none."""
    for code in set(ERROR_CODES) - BUILD_ERROR_CODES:
        assert diff._refusing(code), code
    assert diff._refusing("devices-unavailable") == ("devices/place",)


# one changed cell ------------------------------------------------------------------


def test_one_changed_cell_against_the_engine(one_cell: Path, one_cell_read: LockCells,
                                              live: LockCells) -> None:
    old = one_cell_read
    found = diff_locks(old, live)
    assert found.changed == 1 and bool(found)
    (group,) = found.groups
    assert group.section == "cells"
    assert group.reason == "strategy ddp_spawn -> ddp, launcher spawn -> subprocess"
    assert group.rule == "strategy/explicit, launcher/own"
    assert group.planned == 1
    (cell,) = group.cells
    assert cell.key == STRATEGY_CELL
    assert (cell.old, cell.new) == ("ok ddp_spawn spawn local 2 32-true",
                                    "ok ddp subprocess local 2 32-true")
    assert render_text(found, old, live) == "\n".join([
        f"matrix diff: {one_cell} -> {live.source}",
        f"1 of {found.total_cells} cells changed, in 1 group",
        "[1 cell] strategy ddp_spawn -> ddp, launcher spawn -> subprocess",
        "  rule: strategy/explicit, launcher/own",
        "  cuda-8: accelerator=cuda devices=2 strategy=ddp precision=32-true num_nodes=1: "
        "ok ddp_spawn spawn local 2 32-true -> ok ddp subprocess local 2 32-true",
    ])


def test_run_diff_against_this_installation(one_cell: Path, live: LockCells) -> None:
    assert current_lock() is live, "kept while the registries do not change"
    code, shown = run_diff(str(one_cell), None)
    assert code == 1
    assert shown.splitlines()[0] == (
        f"matrix diff: {one_cell} -> interlock {interlock.__version__} (this installation)")
    assert "  rule: strategy/explicit, launcher/own" in shown.splitlines()


def test_each_kind_of_change_against_the_engine(text: str, folder: Path,
                                                live: LockCells) -> None:
    # every ddp_spawn cell of cuda-8 pinned as refused: more cells than are re-planned
    spawn = {k: "invalid-devices devices" for k in live.cells
             if k[:3] == ("cuda-8", "cuda", "ddp_spawn")}
    altered = _set_cells(text, {
        **spawn,
        REFUSED_CELL: "ok ddp subprocess local 1 32-true",
        WORLD_CELL: "ok ddp subprocess local 2 32-true",
        RESOLVED_CELL: "devices-unavailable devices",
        REFUSAL_CELL: "invalid-devices devices",
        PRECISION_CELL: "ok ddp subprocess local 2 16-mixed",
        CLUSTER_CELL: "ok ddp subprocess slurm 2 16-true",
    })
    altered = _set_layouts(altered, {MESH_CELL: "ok dp_shard=8", DROPPED_LAYOUT: None})
    old = read_lock(_write(folder, "kinds.lock", altered))
    found = diff_locks(old, live)
    by_reason = {g.reason: g for g in found.groups}
    ruled = {reason: g.rule for reason, g in by_reason.items() if g.count == 1}
    assert ruled == {
        "resolved -> refused accelerator-unavailable (accelerator)":
            "accelerator/explicit-unavailable",
        "world size changed":
            "devices/cuda-count, cluster/devices-as-placed, strategy/devices-as-placed",
        # the decision that refused it (devices/place) now places the devices
        "refused devices-unavailable (devices) -> resolved": "devices/cuda-count",
        "refused invalid-devices (devices) -> refused devices-unavailable (devices)":
            _refusal_rule(REFUSAL_CELL),
        "precision 16-mixed -> bf16-mixed": "precision/flag",
        "cluster slurm -> local": "cluster/local, launcher/own",
        "mesh dp_shard=8 -> dp_replicate=8": "parallelism/row-default, parallelism/fits",
        "new cell: refused missing-package (strategy)": "strategy/missing-package",
    }
    assert ruled["resolved -> refused accelerator-unavailable (accelerator)"] == (
        _refusal_rule(REFUSED_CELL))
    keys = {g.reason: g.cells[0].key for g in found.groups if g.count == 1}
    assert keys["world size changed"] == WORLD_CELL
    assert keys["mesh dp_shard=8 -> dp_replicate=8"] == MESH_CELL
    assert by_reason["new cell: refused missing-package (strategy)"].section == "parallelism"
    # the ddp_spawn cells that resolve: sampled, and said so
    sampled = by_reason["refused invalid-devices (devices) -> resolved"]
    assert sampled.count > diff.RULE_SAMPLE == sampled.planned
    assert sampled.rule is not None
    # every decision that can refuse invalid-devices, as it decided in the cells: the
    # checks every cell passes first (most frequent), then each spelling's placement
    assert sampled.rule.split(", ")[:2] == ["devices/within-limits", "strategy/supported"]
    assert {"devices/cuda-all", "devices/cuda-ids"} <= set(sampled.rule.split(", "))
    assert all(c.key[:3] == ("cuda-8", "cuda", "ddp_spawn") for c in sampled.cells)
    shown = render_text(found, old, live, limit=2)
    assert f"  rule: {sampled.rule} (from 50 of {sampled.count} cells)" in shown
    assert f"  ... and {sampled.count - 2} more" in shown
    assert ("  cuda-8-extras: parallelism layout not-given strategy=ddp: ok dp_shard=8 -> "
            "ok dp_replicate=8") in shown
    assert ("  cpu-laptop: parallelism layout tp-3 strategy=deepspeed_stage_3: "
            "(no such cell) -> missing-package strategy") in shown
    assert found.changed == sum(g.count for g in found.groups)
    assert found.changed == 8 + sum(1 for k in spawn if live.cells[k] != spawn[k])
    counts = [(-g.count, g.reason) for g in found.groups]
    assert counts == sorted(counts)


# lock against lock -------------------------------------------------------------------


def test_two_altered_locks(one_cell: Path, one_layout: Path, one_cell_read: LockCells,
                           one_layout_read: LockCells) -> None:
    old, new = one_cell_read, one_layout_read
    found = diff_locks(old, new)
    assert found.changed == 2 and len(found.groups) == 2
    assert {(g.section, g.reason, g.rule) for g in found.groups} == {
        ("cells", "strategy ddp_spawn -> ddp, launcher spawn -> subprocess", None),
        ("parallelism", "mesh dp_replicate=8 -> dp_shard=8", None),
    }
    shown = render_text(found, old, new)
    assert shown.splitlines()[:2] == [f"matrix diff: {one_cell} -> {one_layout}",
                                      f"2 of {found.total_cells} cells changed, in 2 groups"]
    assert "rule:" not in shown
    assert "[1 cell] parallelism: mesh dp_replicate=8 -> dp_shard=8" in shown

    code, printed = run_diff(str(one_cell), str(one_layout), "json")
    assert code == 1
    report = json.loads(printed)
    assert report == json.loads(json.dumps(to_json(found, old, new)))
    assert report["old"] == {"source": str(one_cell), "live": False, "cells": 756_000,
                             "parallelism_cells": len(old.parallelism)}
    assert report["changed"] == 2 and report["total_cells"] == found.total_cells
    cells = {g["section"]: g["cells"] for g in report["groups"]}
    assert cells["cells"] == [{
        "key": {"profile": "cuda-8", "accelerator": "cuda", "strategy": "ddp",
                "precision": "32-true", "devices": "2", "num_nodes": 1},
        "old": "ok ddp_spawn spawn local 2 32-true", "new": "ok ddp subprocess local 2 32-true",
    }]
    assert cells["parallelism"] == [{
        "key": {"profile": "cuda-8-extras", "layout": "not-given", "strategy": "ddp"},
        "old": "ok dp_replicate=8", "new": "ok dp_shard=8",
    }]



def test_run_diff_of_a_lock_with_itself(small_text: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "small.lock", small_text)
    assert run_diff(str(path), str(path)) == (0, "\n".join([
        f"matrix diff: {path} -> {path}", "no cell changed (65 cells)"]))
    code, printed = run_diff(str(path), str(path), "json")
    assert code == 0
    assert json.loads(printed) == {
        "old": {"source": str(path), "live": False, "cells": 64, "parallelism_cells": 1},
        "new": {"source": str(path), "live": False, "cells": 64, "parallelism_cells": 1},
        "total_cells": 65, "changed": 0, "groups": []}


def test_removed_and_added_cells(committed: LockCells) -> None:
    gone = ("mps", "cpu", "ddp_spawn")
    fewer = LockCells(cells={k: v for k, v in committed.cells.items() if k[:3] != gone},
                      parallelism=committed.parallelism, source="fewer", live=False)
    dropped = len(committed.cells) - len(fewer.cells)
    removed = diff_locks(committed, fewer)
    assert removed.changed == dropped == 15 * 20  # precisions x columns
    assert removed.total_cells == fewer.size
    assert all(g.reason.startswith("cell removed: ") and g.rule is None
               for g in removed.groups)
    assert all(c.new is None and c.key[:3] == gone for g in removed.groups for c in g.cells)
    assert "cell removed: resolved" in {g.reason for g in removed.groups}
    added = diff_locks(fewer, committed)
    assert added.changed == dropped
    assert {g.reason.replace("new cell: ", "cell removed: ") for g in added.groups} == {
        g.reason for g in removed.groups}
    cell = next(c for g in added.groups for c in g.cells)
    assert cell.old is None and cell.new == committed.cells[cell.key]  # type: ignore[index]
    assert f": (no such cell) -> {cell.new}" in render_text(added, fewer, committed)


# bad input ---------------------------------------------------------------------------


def _refused(path: Path) -> str:
    with pytest.raises(LockFileError) as caught:
        read_lock(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    # no chained traceback: the cause is not shown
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None or caught.value.__suppress_context__
    assert isinstance(caught.value, ValueError)
    return message


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "old.lock"
    assert _refused(path) == f"{path}: no such lock file (write one with {HINT})"
    with pytest.raises(LockFileError, match="no such lock file"):
        run_diff(str(path), None)


def test_a_directory(tmp_path: Path) -> None:
    assert _refused(tmp_path) == f"{tmp_path} is a directory, not a matrix lock file"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_an_unreadable_file(small_text: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "locked.lock", small_text)
    path.chmod(0)
    try:
        assert _refused(path) == f"{path} cannot be read: Permission denied"
    finally:
        path.chmod(0o600)


def test_a_conformance_report() -> None:
    path = ROOT / "docs" / "conformance-report.json"
    assert _refused(path) == (
        f"{path} is not an interlock matrix lock: its first line is '{{' (JSON, such as a "
        "conformance report); a lock's first line starts with '# interlock matrix lock'")


def test_other_text_and_empty_files(tmp_path: Path) -> None:
    path = _write(tmp_path, "notes.txt", "hello\nworld\n")
    assert _refused(path) == (
        f"{path} is not an interlock matrix lock: its first line is 'hello'; a lock's "
        "first line starts with '# interlock matrix lock'")
    empty = _write(tmp_path, "empty.lock", "")
    assert _refused(empty) == f"{empty} is not an interlock matrix lock: it is empty"


def test_binary_junk(tmp_path: Path) -> None:
    image = tmp_path / "image.lock"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64)
    assert _refused(image) == (f"{image} is not an interlock matrix lock: it is not UTF-8 "
                               "text (byte 0 is 0x89; binary data?)")
    controls = tmp_path / "controls.lock"
    controls.write_bytes(bytes(range(256)) * 4)
    assert _refused(controls) == (
        f"{controls} is not an interlock matrix lock: its first line is "
        "'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08\\t'; a lock's first line starts "
        "with '# interlock matrix lock'")
    tail = tmp_path / "tail.lock"
    tail.write_bytes(b"# interlock matrix lock\n\xff\xfe")
    assert _refused(tail) == (f"{tail} is not an interlock matrix lock: it is not UTF-8 "
                              "text (byte 24 is 0xff; binary data?)")


@pytest.mark.parametrize(("old", "new", "problem"), [
    ("cpu ddp 32-true: 1541d 2fcb4*2 9df3b", "cpu ddp 32-true: 1541d 2fcb4 9df3b",
     "line {n}: the row gives 3 outcomes for 4 columns"),
    ("cpu ddp 32-true: 1541d 2fcb4*2 9df3b", "cpu ddp 32-true: 1541d 2fcb4*2 9df3b 9df3b",
     "line {n}: the row gives 5 outcomes for 4 columns"),
    ("cpu ddp 32-true: 1541d 2fcb4*2 9df3b", "cpu ddp 32-true: 1541d 2fcb4*2 fffff",
     "line {n}: outcome id 'fffff' is used but never defined (no '@fffff ...' line "
     "above it)"),
    ("cpu ddp 32-true: 1541d 2fcb4*2 9df3b", "cpu ddp 32-true: 1541d 2fcb4*x 9df3b",
     "line {n}: '2fcb4*x' does not repeat an id a whole number of times"),
    ("cpu ddp 32-true: 1541d 2fcb4*2 9df3b", "cpu ddp 32-true 1541d 2fcb4*2 9df3b",
     "line {n}: 'cpu ddp 32-true 1541d 2fcb4*2 9df3b' is not 'ACCELERATOR STRATEGY "
     "PRECISIONS: IDS'"),
    ("@1541d ok ddp subprocess local 1 32-true", "@1541d",
     "line {n}: outcome definition '@1541d' lacks an id or outcome"),
    ("parallelism cpu-laptop ddp ddp: ok dp_replicate=4", "parallelism cpu-laptop ddp: ok",
     "line {n}: a parallelism line is 'parallelism PROFILE LAYOUT STRATEGY: OUTCOME', not "
     "'parallelism cpu-laptop ddp: ok'"),
    ("[cpu-laptop] CPU-only laptop", "[cpu-laptop CPU-only laptop",
     "line {n}: profile header '[cpu-laptop CPU-only laptop' has no ']'"),
    ("# cells: 64; columns", "# cells: many; columns",
     "line {n}: the cell count 'many' is not a number"),
])
def test_a_damaged_line(small_text: str, tmp_path: Path, old: str, new: str,
                        problem: str) -> None:
    assert small_text.count(old) == 1
    number = small_text.splitlines().index(
        next(line for line in small_text.splitlines() if line.startswith(old))) + 1
    path = _write(tmp_path, "damaged.lock", small_text.replace(old, new))
    assert _refused(path) == f"{path}: {problem.format(n=number)}{DAMAGED}"


def test_a_damaged_lock(small_text: str, tmp_path: Path) -> None:
    lines = small_text.splitlines()
    truncated = _write(tmp_path, "truncated.lock",
                       "\n".join(line for line in lines if not line.startswith("cpu ddp ")))
    assert _refused(truncated) == (
        f"{truncated}: the lock declares 64 cells but its rows give 48 (truncated or "
        f"edited?){DAMAGED}")
    first_row = lines.index("cpu auto 32-true: b458d 2fcb4*2 9df3b")  # numbered from 0
    headless = _write(tmp_path, "headless.lock",
                      "\n".join(line for line in lines if not line.startswith("# cells:")))
    assert _refused(headless) == (
        f"{headless}: line {first_row}: row 'cpu auto 32-true: b458d 2fcb4*2 9df3b' comes "
        f"before the columns line{DAMAGED}")
    orphan = _write(tmp_path, "orphan.lock", "\n".join(
        line for line in lines if not line.startswith("[cpu-laptop]")))
    assert _refused(orphan) == (
        f"{orphan}: line {first_row}: row 'cpu auto 32-true: b458d 2fcb4*2 9df3b' comes "
        f"before the profile header{DAMAGED}")
    no_rows = _write(tmp_path, "no-rows.lock", "\n".join(lines[:2]))
    assert _refused(no_rows) == (
        f"{no_rows}: no '# cells:' line (the columns header) was found{DAMAGED}")


def test_run_diff_refuses_an_unknown_format(one_cell: Path) -> None:
    with pytest.raises(LockFileError) as caught:
        run_diff(str(one_cell), str(one_cell), "yaml")
    assert str(caught.value) == "unknown diff format 'yaml'; choices: text, json"


def test_an_empty_diff_is_falsy() -> None:
    empty = LockDiff(groups=(), total_cells=3, changed=0)
    cells = LockCells(cells={}, parallelism={}, source="a", live=False)
    assert not empty and empty.empty
    assert render_text(empty, cells, cells) == "matrix diff: a -> a\nno cell changed (3 cells)"
    assert to_json(empty, cells, cells)["groups"] == []
