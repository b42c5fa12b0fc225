"""The public API is the committed snapshot (docs/api-policy.md): a change to a public
name, signature, row field, entry-point group, refusal code, the report schema or the
command line fails here until the snapshot (and the CHANGELOG) say so."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tool_modules import load_tool

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    return load_tool("api_snapshot")


def test_the_public_api_matches_the_committed_snapshot(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = _tool().main(["--check"])
    diff = capsys.readouterr().out
    assert code == 0, (
        "the public API differs from docs/api-snapshot.txt; if the change is intended, "
        "run `python tools/api_snapshot.py --update` and add a CHANGELOG line:\n" + diff)


def test_the_snapshot_names_each_kind_of_public_promise() -> None:
    text = _tool().snapshot()
    for expected in ("def plan(", "def resolve(", "dataclass StrategySpec", "  field name: str",
                     "class interlock.strategies.base.Strategy(", "  def launch(",
                     "group interlock.strategies", "group interlock.precisions",
                     "unsupported-precision", "## conformance report", "schema ",
                     "command interlock matrix: ", "--diff", "--compare"):
        assert expected in text, f"the snapshot lost {expected!r}"
    # the version is the CHANGELOG's business, not a signature change every release
    assert "__version__" not in text


def test_a_changed_signature_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import interlock

    tool = _tool()
    before = tool.snapshot()

    def seed_everything(seed: int, workers: bool = False) -> int:  # a new parameter
        return seed

    monkeypatch.setattr(interlock, "seed_everything", seed_everything)
    after = tool.snapshot()
    assert before != after
    assert "def seed_everything(seed: 'int', workers: 'bool' = False) -> 'int'" in after
