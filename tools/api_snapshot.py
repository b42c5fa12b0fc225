"""The public API of interlock as text: names, signatures, row fields, entry-point
groups, error codes, the report schema and the command line.

``python tools/api_snapshot.py`` prints it; ``--update`` rewrites docs/api-snapshot.txt;
``--check`` exits 1 (showing the difference) when the committed snapshot disagrees.
tests/test_api_snapshot.py runs the check, so a change to the public API fails the tests
until the snapshot is updated, and the policy (docs/api-policy.md) asks for a CHANGELOG
line in the same commit.

What counts as public is docs/api-policy.md's list; this script is its executable form.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import importlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parent.parent / "docs" / "api-snapshot.txt"

#: the classes whose public members are API beyond ``interlock.__all__``: the Strategy a
#: framework drives and the part classes a plugin author subclasses
CLASSES = (
    "interlock.strategies.base:Strategy",
    "interlock.strategies.parallel:ParallelStrategy",
    "interlock.strategies.accelerators.base:Accelerator",
    "interlock.strategies.precision.base:Precision",
    "interlock.strategies.io.base:CheckpointIO",
    "interlock.strategies.environments.base:ClusterEnvironment",
    "interlock.strategies.launchers.base:Launcher",
    "interlock.strategies.collectives.base:Collective",
)


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _members(cls: type) -> Iterator[str]:
    """The public members a class defines or inherits from interlock classes (not from
    object, ABC or typing machinery), sorted."""
    own = [c for c in cls.__mro__ if c.__module__.startswith("interlock")]
    seen: dict[str, str] = {}
    for klass in reversed(own):  # a subclass's definition wins
        for name, value in vars(klass).items():
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(value, property):
                seen[name] = f"  property {name}"
            elif isinstance(value, (classmethod, staticmethod)):
                kind = "classmethod" if isinstance(value, classmethod) else "staticmethod"
                seen[name] = f"  {kind} {name}{_signature(value.__func__)}"
            elif inspect.isfunction(value):
                abstract = " [abstract]" if getattr(value, "__isabstractmethod__", False) else ""
                seen[name] = f"  def {name}{_signature(value)}{abstract}"
            elif not inspect.isclass(value) and name not in getattr(klass, "__slots__", ()):
                seen[name] = f"  attribute {name}: {type(value).__name__}"
    yield from (seen[name] for name in sorted(seen))


def _describe(name: str, obj: Any) -> list[str]:
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        params = obj.__dataclass_params__  # type: ignore[attr-defined]
        flags = ",".join(f for f in ("frozen", "kw_only") if getattr(params, f, False))
        lines = [f"dataclass {name}" + (f" [{flags}]" if flags else "")]
        lines += [f"  field {f.name}: {f.type}" for f in dataclasses.fields(obj)
                  if not f.name.startswith("_")]
        lines += [m for m in _members(obj) if not m.startswith("  def __init__")]
        return lines
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return [f"enum {name}: {', '.join(m.name for m in obj)}"]
    if inspect.isclass(obj):
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        return [f"class {name}({bases})", *_members(obj)]
    if callable(obj):
        return [f"def {name}{_signature(obj)}"]
    if name == "ERROR_CODES":
        return [f"constant {name}: {', '.join(sorted(obj))}"]
    if name == "__version__":
        return []  # changes every release; the CHANGELOG and the version test cover it
    return [f"constant {name}: {type(obj).__name__}"]


def _cli() -> list[str]:
    from interlock.cli import build_parser

    parser = build_parser()
    lines = []
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for command, sub in sorted(action.choices.items()):  # type: ignore[union-attr]
            options = sorted(
                "/".join(a.option_strings) for a in sub._actions
                if a.option_strings and a.help != argparse.SUPPRESS
                and "-h" not in a.option_strings
            )
            lines.append(f"command interlock {command}: {' '.join(options)}")
    return lines


def snapshot() -> str:
    """The public API as sorted, diff-friendly lines."""
    import interlock
    from interlock.conformance.report import REPORT_SCHEMA, Record
    from interlock.engine.registry import KINDS

    lines = ["# the public API of interlock (tools/api_snapshot.py); see docs/api-policy.md",
             "", "## interlock"]
    for name in sorted(interlock.__all__):
        lines += _describe(name, getattr(interlock, name))
    lines += ["", "## classes a framework drives or a plugin author subclasses"]
    for path in CLASSES:
        lines += _describe(path.replace(":", "."), _load(path))
    lines += ["", "## entry-point groups"]
    groups = sorted(kind.group for kind in KINDS.values())
    lines += [f"group {g}" for g in groups] + ["group pytest11: interlock"]
    lines += ["", "## conformance report", f"schema {REPORT_SCHEMA}"]
    lines += [f"record field {f.name}: {f.type}" for f in dataclasses.fields(Record)]
    lines += ["", "## command line", *_cli()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true", help=f"rewrite {SNAPSHOT.name}")
    mode.add_argument("--check", action="store_true", help="compare with the snapshot")
    args = parser.parse_args(argv)
    text = snapshot()
    if args.update:
        SNAPSHOT.write_text(text, encoding="utf-8")
        print(f"wrote {SNAPSHOT.name}; add a CHANGELOG line for the change under "
              "[Unreleased]")
        return 0
    if args.check:
        committed = SNAPSHOT.read_text(encoding="utf-8") if SNAPSHOT.exists() else ""
        if committed == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            committed.splitlines(keepends=True), text.splitlines(keepends=True),
            "docs/api-snapshot.txt (committed)", "the installed interlock"))
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
