"""The generators of docs pages take one optional argument, the checkout, and nothing
else: an option or a path that is not a directory is refused, not written under."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from interlock.engine import docs
from interlock.matrix import compat, fits

GENERATORS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "rules": docs.main, "fits": fits.main, "compat": compat.main}


@pytest.mark.parametrize("name", GENERATORS)
def test_help_and_bad_arguments_write_nothing(name: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    main = GENERATORS[name]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    for argv in (["--bogus"], ["a-file"], ["missing-dir"], ["a", "b"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_checkout_gets_its_page(tmp_path: Path) -> None:
    # (the pages of what fits and of compatibility take seconds to render, and their
    # tests check what they render; the argument is read by the same function)
    assert docs.main([str(tmp_path)]) == 0
    assert (tmp_path / docs.RULES_PATH).read_text(encoding="utf-8").startswith("#")
