"""Dependencies point one way: the engine (``interlock.engine``) never imports the
runtime (``interlock.strategies``), and the runtime's modules import each other without
a cycle. Read from the source's syntax trees, so an import hidden inside a function or
under ``TYPE_CHECKING`` counts like any other."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import interlock

SRC = Path(interlock.__file__).resolve().parent.parent
PACKAGE = SRC / "interlock"

@dataclass(frozen=True)
class Import:
    """One import statement: who imports what, where, and whether it only type-checks."""

    module: str
    target: str
    line: int
    type_only: bool

    def __str__(self) -> str:
        kind = " (under TYPE_CHECKING)" if self.type_only else ""
        return f"{self.module}:{self.line} imports {self.target}{kind}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement may load: ``from a.b import c`` names ``a.b``
    and, when ``c`` is a submodule, ``a.b.c``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")[: None if is_package else -1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def imports(path: Path, module: str | None = None) -> Iterator[Import]:
    """Every import in ``path`` (the module ``module``, by default the one its place
    under ``src`` names): at module level, in functions, under TYPE_CHECKING, and
    ``importlib.import_module`` / ``__import__`` calls with a literal name."""
    module = module or module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            type_only.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(module, is_package, node):
                yield Import(module, target, node.lineno, id(node) in type_only)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            yield Import(module, node.args[0].value, node.lineno, id(node) in type_only)


def _within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_engine_never_imports_the_runtime() -> None:
    found = sorted({f"{i.module}:{i.line}" + (" (under TYPE_CHECKING)" if i.type_only else "")
                    for path in sorted((PACKAGE / "engine").rglob("*.py"))
                    for i in imports(path) if _within(i.target, "interlock.strategies")})
    assert not found, (
        "interlock.engine must not import interlock.strategies (not in a function, "
        "not for types); name the implementation in a row's factory string, or move the "
        "code beside the strategies:\n  " + "\n  ".join(found)
    )


def test_the_engine_never_leaves_its_package() -> None:
    """`Plan.build` reaches the builder through `interlock.engine.planner.use_builder`,
    which `interlock.resolving` calls at import: no engine module imports anything of
    interlock outside the engine."""
    found = sorted({str(i) for path in sorted((PACKAGE / "engine").rglob("*.py"))
                    for i in imports(path)
                    if _within(i.target, "interlock")
                    and not _within(i.target, "interlock.engine")})
    assert not found, ("interlock.engine imports interlock modules outside the "
                       "engine:\n  " + "\n  ".join(found))


def _graph(root: Path) -> dict[str, dict[str, Import]]:
    """module -> {module it imports: the first such import}, among the modules under
    ``root``, every import counted (module level, in functions, under TYPE_CHECKING).
    Importing ``a.b.c`` runs the packages ``a.b`` and ``a`` too, so each is an edge
    (except the importing module's own enclosing packages, which are always already
    running)."""
    paths = {module_name(p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, Import]] = {name: {} for name in paths}
    for name, path in paths.items():
        for found in imports(path):
            parts = found.target.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                if target in paths and target != name and not _within(name, target):
                    graph[name].setdefault(target, found)
    return graph


def _cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _describe(graph: dict[str, dict[str, Import]], cycle: list[str]) -> str:
    members = set(cycle)
    return "\n  ".join(str(graph[m][t]) for m in cycle for t in sorted(graph[m])
                       if t in members)


def test_no_module_of_the_package_imports_itself_in_a_circle() -> None:
    """Counting every import: a circle closed inside a function or under TYPE_CHECKING
    is a circle all the same (a helper that needs a strategy declares a Protocol of
    what it reads, as `strategies.checkpointing` does)."""
    graph = _graph(PACKAGE)
    cycles = _cycles(graph)
    assert not cycles, "import circles in interlock:\n  " + "\n\n  ".join(
        _describe(graph, c) for c in cycles)


def test_nothing_in_the_package_imports_the_engines_old_path() -> None:
    """`interlock.connector` is kept for users' old imports only: a module of interlock
    that imported it would warn on every user's first import."""
    found = sorted({str(i) for path in sorted(PACKAGE.rglob("*.py"))
                    if not _within(module_name(path), "interlock.connector")
                    for i in imports(path) if _within(i.target, "interlock.connector")})
    assert not found, "import interlock.engine instead:\n  " + "\n  ".join(found)
