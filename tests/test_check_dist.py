"""tools/check_dist.py, the check of what a build ships (nox -s package runs it on the
real wheel and sdist): each kind of problem it exists for is caught and named."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import interlock
from tool_modules import load_tool

ROOT = Path(__file__).resolve().parent.parent
VERSION = interlock.__version__
INFO = f"interlock-{VERSION}.dist-info"
SOURCES = {"interlock/__init__.py", "interlock/cli.py", "_interlock_conformance_pytest/__init__.py"}
METADATA = (f"Metadata-Version: 2.4\nName: interlock\nVersion: {VERSION}\n"
            "License-Expression: Apache-2.0\nProvides-Extra: conformance\n")
ENTRY_POINTS = ("[console_scripts]\ninterlock = interlock.cli:main\n\n"
                "[pytest11]\ninterlock = _interlock_conformance_pytest\n")


def _tool() -> ModuleType:
    return load_tool("check_dist")


def _wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def _good() -> dict[str, str]:
    files = {name: "" for name in SOURCES}
    files.update({
        "interlock/py.typed": "", "interlock/conformance/test_conformance.py": "",
        f"{INFO}/METADATA": METADATA, f"{INFO}/entry_points.txt": ENTRY_POINTS,
        f"{INFO}/licenses/LICENSE": "Apache", f"{INFO}/licenses/NOTICE": "interlock",
    })
    return files


def test_a_complete_wheel_passes(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "good.whl", _good())
    assert _tool().wheel_problems(wheel, sources=SOURCES) == []


def test_each_problem_of_a_wheel_is_named(tmp_path: Path) -> None:
    files = _good()
    del files["interlock/py.typed"], files["interlock/cli.py"]
    del files[f"{INFO}/licenses/NOTICE"]
    files["tests/test_cli.py"] = ""
    files["interlock/__pycache__/cli.cpython-311.pyc"] = ""
    files["interlock/leftover.py"] = ""
    files[f"{INFO}/METADATA"] = METADATA.replace("Provides-Extra: conformance\n", "")
    files[f"{INFO}/entry_points.txt"] = "[console_scripts]\ninterlock = interlock.cli:main\n"
    problems = _tool().wheel_problems(_wheel(tmp_path / "bad.whl", files), sources=SOURCES)
    assert problems == [
        "bad.whl: interlock/__pycache__/cli.cpython-311.pyc: junk that must not ship",
        "bad.whl: tests/: not a package of interlock's (tests, examples and tools stay in "
        "the sdist)",
        "bad.whl: interlock/cli.py: missing",
        "bad.whl: interlock/py.typed: missing",
        "bad.whl: interlock/leftover.py: not a tracked source file",
        f"bad.whl: {INFO}/licenses/NOTICE: missing",
        "bad.whl: METADATA has no 'conformance' extra ([])",
        "bad.whl: entry_points.txt lacks 'interlock = _interlock_conformance_pytest'",
    ]


def test_a_wheel_of_another_version_is_named(tmp_path: Path) -> None:
    files = {k.replace(INFO, "interlock-9.9.9.dist-info"): v for k, v in _good().items()}
    problems = _tool().wheel_problems(_wheel(tmp_path / "old.whl", files), sources=SOURCES)
    assert problems == [
        "old.whl: interlock-9.9.9.dist-info/: not a package of interlock's (tests, examples "
        "and tools stay in the sdist)",
        f"old.whl: no {INFO}/ (the wheel is of another version than the sources' {VERSION})",
    ]


def test_a_rebuilt_wheel_must_match_byte_for_byte(tmp_path: Path) -> None:
    first = _wheel(tmp_path / "a.whl", _good())
    changed = _good()
    changed["interlock/cli.py"] = "# edited\n"
    del changed["interlock/py.typed"]
    second = _wheel(tmp_path / "b.whl", changed)
    assert _tool().rebuild_problems(first, second) == [
        "b.whl: interlock/py.typed: only in the wheel built from the tree",
        "b.whl: interlock/cli.py: differs from the wheel built from the tree",
    ]
    assert _tool().rebuild_problems(first, first) == []


def test_an_sdist_without_its_license_or_with_an_environment_is_named(tmp_path: Path) -> None:
    sdist = tmp_path / f"interlock-{VERSION}.tar.gz"
    tool = _tool()
    with tarfile.open(sdist, "w:gz") as archive:
        for name in [*tool.SDIST_REQUIRED, ".venv/bin/python"]:
            if name == "LICENSE":
                continue
            data = b"x"
            info = tarfile.TarInfo(f"interlock-{VERSION}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    assert tool.sdist_problems(sdist) == [
        f"{sdist.name}: .venv/bin/python: junk that must not ship",
        f"{sdist.name}: LICENSE: missing",
    ]
