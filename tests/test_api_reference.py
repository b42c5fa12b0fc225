"""The API reference (docs/api, built by ``nox -s apidocs``) cannot silently drift.

Sphinx documents members with ``:members:``, so a new method appears by itself, but only
if it has a docstring, and a new name in ``interlock.__all__`` appears only if a page
names it. These checks read the sources and docstrings; they do not need Sphinx.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import interlock

API_DOCS = Path(__file__).resolve().parents[1] / "docs" / "api"
PUBLIC_PAGE = API_DOCS / "public.rst"

_DIRECTIVE = re.compile(r"^\.\. (auto\w+|currentmodule)::\s*(\S+)\s*$")
_AUTOSUMMARY = re.compile(r"^\.\. autosummary::\s*$")
_ENTRY = re.compile(r"^ {3}~?([\w.]+)\s*$")


def _resolve(dotted: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"nothing importable in {dotted!r}")


def _references(page: Path) -> tuple[list[str], list[str], list[str]]:
    """What ``page`` names: (autosummary entries as full paths, targets of auto*
    directives other than automodule, automodule targets)."""
    entries: list[str] = []
    objects: list[str] = []
    modules: list[str] = []
    current = ""
    in_autosummary = False
    for line in page.read_text().splitlines():
        directive = _DIRECTIVE.match(line)
        if directive:
            kind, target = directive.groups()
            if kind == "currentmodule":
                current = "" if target == "None" else target
            elif kind == "automodule":
                modules.append(target)
            else:
                objects.append(target)
        if _AUTOSUMMARY.match(line):
            in_autosummary = True
            continue
        if in_autosummary:
            entry = _ENTRY.match(line)
            if entry and not line.strip().startswith(":"):
                name = entry.group(1)
                entries.append(name if name.startswith("interlock") or not current
                               else f"{current}.{name}")
            elif line.strip() and not line.startswith("   "):
                in_autosummary = False
    return entries, objects, modules


def _all_references() -> tuple[list[str], list[str]]:
    objects: list[str] = []
    modules: list[str] = []
    for page in sorted(API_DOCS.glob("*.rst")):
        _, page_objects, page_modules = _references(page)
        objects += page_objects
        modules += page_modules
    return objects, modules


def _fully_documented(name: str, objects: list[str], modules: list[str]) -> bool:
    """Whether some page gives ``interlock.<name>`` an entry of its own: an auto*
    directive naming it, or an automodule of the module that defines it (and exports it,
    when that module has ``__all__``)."""
    target = getattr(interlock, name)
    if any(_resolve(path) is target for path in objects):
        return True
    home = getattr(target, "__module__", None)
    if home not in modules:
        return False
    module = importlib.import_module(home)
    exported = getattr(module, "__all__", None)
    return exported is None or getattr(target, "__name__", name) in exported


def test_every_public_name_is_in_the_reference() -> None:
    entries, objects, _ = _references(PUBLIC_PAGE)
    listed = [_resolve(path) for path in entries + objects]
    all_objects, all_modules = _all_references()
    missing = [n for n in interlock.__all__
               if not any(obj is getattr(interlock, n) for obj in listed)]
    assert not missing, (
        f"interlock.__all__ names missing from {PUBLIC_PAGE.relative_to(API_DOCS.parents[1])}"
        f": {missing}; add each to one of its autosummary tables"
    )
    undocumented = [n for n in interlock.__all__
                    if not _fully_documented(n, all_objects, all_modules)]
    assert not undocumented, (
        f"interlock.__all__ names listed but given no entry of their own on any page of "
        f"docs/api: {undocumented}; add an auto* directive (or an automodule of the module "
        "that defines them)"
    )


def test_the_public_page_lists_only_public_names() -> None:
    entries, _, _ = _references(PUBLIC_PAGE)
    public = [getattr(interlock, n) for n in interlock.__all__]
    stale = [path for path in entries if not any(_resolve(path) is obj for obj in public)]
    assert not stale, f"public.rst lists names that interlock.__all__ does not export: {stale}"


def _strategy_classes() -> list[type]:
    from interlock.strategies.base import Strategy
    from interlock.strategies.parallel import ParallelStrategy

    return [Strategy, ParallelStrategy]


def _public_method_docs(cls: type) -> dict[str, str | None]:
    """Each public method (properties included) defined in ``cls``'s body, with its
    docstring. Read from the source: typeguard's import hook, under which the tests run,
    drops the docstring of a function whose body is nothing else (an abstract one)."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str | None] = {}
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (
                item.name.startswith("_")):
            # a property's setter has the getter's name: either one's docstring counts
            docs[item.name] = docs.get(item.name) or ast.get_docstring(item)
    return docs


@pytest.mark.parametrize("cls", _strategy_classes(), ids=lambda c: c.__name__)
def test_public_strategy_methods_have_docstrings(cls: type) -> None:
    docs = _public_method_docs(cls)
    assert docs, f"found no public methods on {cls.__name__}"
    # an override without a docstring shows the one it overrides (autodoc does the same)
    inherited = {name for base in cls.__mro__[1:] if base.__module__.startswith("interlock")
                 for name, doc in _public_method_docs(base).items() if doc}
    bare = sorted(name for name, doc in docs.items() if not doc and name not in inherited)
    assert not bare, (
        f"public members of {cls.__name__} without a docstring (the API reference would "
        f"leave them out): {bare}; add a short Google-style docstring"
    )


def test_strategy_class_attributes_have_doc_comments() -> None:
    """Class attributes (the engine's ``interlock_part_kind``, ``materializes_meta``, ...)
    are documented by a ``#:`` comment right above them, which autodoc reads."""
    from interlock.strategies.base import Strategy

    source = inspect.getsource(Strategy).splitlines()
    undocumented = []
    for name in Strategy.__annotations__:
        if name.startswith("_"):
            continue
        line = next(i for i, text in enumerate(source)
                    if re.match(rf"\s+{name}\s*:", text))
        if not source[line - 1].strip().startswith("#:"):
            undocumented.append(name)
    assert not undocumented, (
        f"Strategy class attributes without a '#:' doc comment above them: {undocumented}"
    )
