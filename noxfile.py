"""Development sessions: tests, typecheck, lint, docs, bench.

The torch requirement comes from INTERLOCK_TORCH (default ``torch==2.13.0``, a CPU
build on machines that carry it locally); set it to test against another release.
"""

from __future__ import annotations

import os

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "typecheck"]

TORCH = os.environ.get("INTERLOCK_TORCH", "torch==2.13.0")
# None: the interpreter nox itself runs on
PYTHON = os.environ.get("INTERLOCK_PYTHON") or None


def _install(session: nox.Session, extra: str) -> None:
    # torch first and pinned, so that nothing pulls an unpinned (CUDA, multi-GB) build
    session.install(TORCH)
    session.install("-e", f".[{extra}]", TORCH)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite, in parallel, under typeguard's import hook for interlock."""
    _install(session, "test")
    workers = os.environ.get("INTERLOCK_TEST_WORKERS", "auto")
    session.run(
        "pytest", "-n", workers, "--typeguard-packages=interlock", *session.posargs
    )


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the tests and this file."""
    _install(session, "dev")
    session.run("mypy", "--strict", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the package and the tests."""
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "noxfile.py", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Regenerate docs/rules.md from the engine's tables."""
    _install(session, "test")
    session.run("python", "-m", "interlock.connector.docs")


@nox.session(python=PYTHON)
def matrix(session: nox.Session) -> None:
    """Check matrix.lock against the engine; ``-- --update`` rewrites it and regenerates
    docs/rules.md and the compatibility pages."""
    _install(session, "test")
    session.run("python", "-m", "interlock.matrix.lock", *session.posargs)
    if "--update" in session.posargs:
        session.run("python", "-m", "interlock.connector.docs")
        session.run("python", "-m", "interlock.matrix.compat")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Side-by-side measurements: plan() latency and import cost vs Lightning's
    connector; DDP step time, launch latency and resolve() vs raw torch and Fabric.

    Lightning lives only in this session's environment, never in interlock's
    dependencies. ``nox -s bench -- plan ARGS`` or ``-- runtime ARGS`` runs one script
    with its own arguments; without arguments both run with their defaults.
    """
    session.install(TORCH)
    session.install("-r", "benchmarks/requirements.txt", TORCH)
    session.install("-e", ".", TORCH)
    which, *rest = session.posargs or [""]
    if which in ("", "plan"):
        session.run("python", "benchmarks/bench_plan.py", *rest)
    if which in ("", "runtime"):
        session.run("python", "benchmarks/bench_runtime.py", *rest)
    if which not in ("", "plan", "runtime"):
        session.error(f"unknown benchmark {which!r}: use 'plan' or 'runtime'")
