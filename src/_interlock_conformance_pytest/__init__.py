"""The pytest11 entry point of interlock's conformance suite.

Deliberately imports nothing from interlock: pytest loads entry-point plugins before
typeguard's import hook is installed, and a module imported that early cannot be
instrumented. The suite's hooks (``interlock.conformance.plugin``) are registered only
when ``--interlock-strategy`` is given.
"""

from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    """Add the suite's ``--interlock-*`` options (``pytest --help`` lists them): the
    same choices as the ``interlock conformance`` command, which passes them on."""
    group = parser.getgroup("interlock", "interlock conformance suite")
    group.addoption("--interlock-strategy", action="append", default=[], metavar="NAME",
                    help="strategy to check (repeatable; 'all' for every registered one)")
    group.addoption("--interlock-runner", default="auto",
                    help="cpu, cuda, tpu, or auto (every runner this machine has)")
    group.addoption("--interlock-world-sizes", default="1,2", help="comma-separated")
    group.addoption("--interlock-precisions", default=None,
                    help="comma-separated subset of the declared precisions")
    group.addoption("--interlock-report", default=None, metavar="PATH",
                    help="write the JSON report here")
    group.addoption("--interlock-import", action="append", default=[], metavar="MODULE",
                    help="import a module that registers strategies (repeatable)")
    group.addoption("--interlock-skips-file", default=None, metavar="PATH",
                    help="test ids (prefixes) to skip, one per line, '#' comments")
    group.addoption("--interlock-xfails-file", default=None, metavar="PATH",
                    help="test ids (prefixes) expected to fail (strict), one per line")
    group.addoption("--interlock-allow-missing-runner", action="store_true", default=False,
                    help="a requested runner this machine lacks, or a strategy with "
                    "nothing to check here, is reported instead of failing the run")
    group.addoption("--interlock-keep-workdir", action="store_true", default=False,
                    help="keep the temporary directory with the drivers' logs")
    group.addoption("--interlock-workers", type=int, default=0, metavar="N",
                    help="run N driver launches at once, the costliest first (0: one "
                    "at a time)")
    group.addoption("--interlock-checks", default=None, metavar="ID,...",
                    help="run only these checks (comma-separated ids); the report is "
                    "then partial and verifies no cell")


def pytest_configure(config: Any) -> None:
    """Register the suite's hooks (:mod:`interlock.conformance.plugin`) when
    ``--interlock-strategy`` is given; otherwise do nothing."""
    config.addinivalue_line("markers", "xdist_group(name): run these items on one worker")
    if not config.getoption("--interlock-strategy"):
        return
    from interlock.conformance import plugin

    config.pluginmanager.register(plugin, "interlock-conformance")
    plugin.activate(config)
