"""Check what a build of interlock would ship, before anyone installs it.

``python tools/check_dist.py --wheel W --sdist S [--rebuilt R]``: the wheel holds every
module of the source tree and nothing else (no tests, no compiled files, no editor or
build junk), carries py.typed, the license files, the console script and the pytest
plugin, and its metadata says this version, the Apache-2.0 licence and the
``conformance`` extra; the sdist holds the sources, tests, docs and the license files and
no local environments; ``--rebuilt`` (the wheel built from the sdist) holds the same files
with the same bytes as the wheel built from the tree. Each problem is one line; exit 1
when there is any, 2 when a path cannot be read. ``nox -s package`` runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the top-level names a wheel may hold: the two packages and the metadata directory
PACKAGES = ("interlock", "_interlock_conformance_pytest")
#: never in a distribution
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.ruff_cache|\.nox|"
                  r"\.venv[^/]*|\.hypothesis|_build)(/|$)|\.(pyc|pyo|orig|rej|swp)$|~$|"
                  r"(^|/)\.DS_Store$")
#: what a wheel must carry besides the modules
WHEEL_REQUIRED = ("interlock/py.typed", "interlock/conformance/test_conformance.py")
SDIST_REQUIRED = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "CHANGELOG.md",
                  "src/interlock/__init__.py", "src/interlock/py.typed", "tests/conftest.py",
                  "matrix.lock", "docs/api-policy.md")


def tracked_sources() -> set[str]:
    """The package files git tracks under src/, as wheel paths."""
    listed = subprocess.run(["git", "ls-files", "src"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return {p.removeprefix("src/") for p in listed
            if p.endswith((".py", "py.typed")) and p.split("/")[1] in PACKAGES}


def _version() -> str:
    text = (ROOT / "src" / "interlock" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if found is None:
        raise SystemExit("error: no __version__ in src/interlock/__init__.py")
    return found[1]


def wheel_problems(wheel: Path, sources: set[str] | None = None) -> list[str]:
    """What is wrong with a built wheel (empty when nothing is)."""
    version = _version()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"interlock-{version}.dist-info"
        problems = [f"{wheel.name}: {name}: junk that must not ship" for name in names
                    if JUNK.search(name)]
        top = {name.split("/")[0] for name in names}
        problems += [f"{wheel.name}: {name}/: not a package of interlock's (tests, examples "
                     "and tools stay in the sdist)" for name in sorted(top)
                     if name not in PACKAGES and name != info]
        if info not in top:
            problems.append(f"{wheel.name}: no {info}/ (the wheel is of another version "
                            f"than the sources' {version})")
            return problems
        wanted = set(WHEEL_REQUIRED) | (sources if sources is not None else tracked_sources())
        problems += [f"{wheel.name}: {name}: missing" for name in sorted(wanted - set(names))]
        shipped = {n for n in names if n.split("/")[0] in PACKAGES}
        problems += [f"{wheel.name}: {name}: not a tracked source file" for name
                     in sorted(shipped - wanted) if not JUNK.search(name)]
        for license_file in ("LICENSE", "NOTICE"):
            if f"{info}/licenses/{license_file}" not in names:
                problems.append(f"{wheel.name}: {info}/licenses/{license_file}: missing")
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        if metadata["Version"] != version:
            problems.append(f"{wheel.name}: METADATA says version {metadata['Version']}, the "
                            f"sources {version}")
        if metadata["License-Expression"] != "Apache-2.0":
            problems.append(f"{wheel.name}: METADATA License-Expression is "
                            f"{metadata['License-Expression']!r}, not 'Apache-2.0'")
        extras = metadata.get_all("Provides-Extra") or []
        if "conformance" not in extras:
            problems.append(f"{wheel.name}: METADATA has no 'conformance' extra ({extras})")
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        for needed in ("interlock = interlock.cli:main",
                       "interlock = _interlock_conformance_pytest"):
            if needed not in entry_points:
                problems.append(f"{wheel.name}: entry_points.txt lacks {needed!r}")
    return problems


def sdist_problems(sdist: Path) -> list[str]:
    """What is wrong with a built sdist (empty when nothing is)."""
    with tarfile.open(sdist) as archive:
        names = [m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name]
    problems = [f"{sdist.name}: {name}: junk that must not ship" for name in names
                if JUNK.search(name)]
    problems += [f"{sdist.name}: {name}: missing" for name in SDIST_REQUIRED
                 if name not in names]
    return problems


def _contents(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: hashlib.sha256(archive.read(name)).hexdigest()
                for name in archive.namelist()}


def rebuild_problems(wheel: Path, rebuilt: Path) -> list[str]:
    """Differences between the wheel built from the tree and the one built from the
    sdist: every file, byte for byte."""
    first, second = _contents(wheel), _contents(rebuilt)
    problems = [f"{rebuilt.name}: {name}: only in the wheel built from the tree"
                for name in sorted(set(first) - set(second))]
    problems += [f"{rebuilt.name}: {name}: only in the wheel built from the sdist"
                 for name in sorted(set(second) - set(first))]
    problems += [f"{rebuilt.name}: {name}: differs from the wheel built from the tree"
                 for name in sorted(set(first) & set(second)) if first[name] != second[name]]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--sdist", type=Path)
    parser.add_argument("--rebuilt", type=Path, help="the wheel built from the sdist")
    args = parser.parse_args(argv)
    paths = [p for p in (args.wheel, args.sdist, args.rebuilt) if p is not None]
    unreadable = [p for p in paths if not p.is_file()]
    if unreadable:
        print(f"error: {unreadable[0]}: no such file", file=sys.stderr)
        return 2
    try:
        problems = wheel_problems(args.wheel)
        if args.sdist is not None:
            problems += sdist_problems(args.sdist)
        if args.rebuilt is not None:
            problems += rebuild_problems(args.wheel, args.rebuilt)
    except (zipfile.BadZipFile, tarfile.TarError, KeyError) as error:
        print(f"error: a distribution cannot be read: {error}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{args.wheel.name}: {len(_contents(args.wheel))} files, as they should be"
          + (f"; {args.sdist.name} complete" if args.sdist else "")
          + ("; the sdist rebuilds it byte for byte" if args.rebuilt else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
