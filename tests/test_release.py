"""What a release promises besides its code: one version everywhere, the files a
distribution must carry, and the install line the suite's refusal names."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import interlock
from interlock.cli import CONFORMANCE_INSTALL

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def test_the_package_metadata_and_the_changelog_agree_on_the_version() -> None:
    releases = RELEASE.findall(CHANGELOG.read_text(encoding="utf-8"))
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' release heading"
    newest, _ = releases[0]
    assert newest == interlock.__version__, (
        f"the newest release in CHANGELOG.md is {newest}, the package says "
        f"{interlock.__version__}: add the release's entry (or fix the version)")
    assert importlib.metadata.version("interlock") == interlock.__version__, (
        "the installed metadata is of another version: reinstall (pip install -e .)")


def test_the_changelog_keeps_an_unreleased_section_above_the_releases() -> None:
    text = CHANGELOG.read_text(encoding="utf-8")
    unreleased = text.find("## [Unreleased]")
    first_release = RELEASE.search(text)
    assert unreleased != -1 and first_release is not None
    assert unreleased < first_release.start(), "## [Unreleased] must come first"
    # newest first, each release once
    versions = [tuple(map(int, v.split("."))) for v, _ in RELEASE.findall(text)]
    assert versions == sorted(set(versions), reverse=True), versions


def test_the_license_files_exist_and_are_named_in_the_metadata() -> None:
    metadata = importlib.metadata.metadata("interlock")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert sorted(metadata.get_all("License-File") or []) == ["LICENSE", "NOTICE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    assert "interlock" in (ROOT / "NOTICE").read_text()


def test_the_conformance_extra_brings_what_the_suite_runs_on() -> None:
    requires = importlib.metadata.requires("interlock") or []
    names = {re.split(r"[<>=\[ ;]", req, maxsplit=1)[0] for req in requires
             if req.replace('"', "'").endswith("extra == 'conformance'")}
    assert names == {"pytest"}
    assert "interlock[conformance]" in CONFORMANCE_INSTALL
    docs = (ROOT / "docs" / "conformance.md").read_text()
    assert CONFORMANCE_INSTALL.removeprefix("pip install ") in docs, (
        "docs/conformance.md must give the install line the refusal names")
