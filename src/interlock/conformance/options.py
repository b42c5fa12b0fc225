"""The suite's options, checked before anything runs.

Both ways in (``interlock conformance`` and ``pytest --interlock-strategy ...``) pass
their raw option values through :func:`validate`, which either returns a typed
:class:`SuiteOptions` or raises :class:`OptionError` with one line that names the
option, what was wrong and what is accepted. The command prints that line and exits
with 2; pytest reports it as a usage error. Nothing is imported, launched or written
before the options are known to be good.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from interlock.conformance.runners import RUNNERS
from interlock.engine.specs import StrategySpec

#: runner names the options accept (``auto``: every runner this machine has)
RUNNER_CHOICES: tuple[str, ...] = ("auto", *RUNNERS)
#: the largest world size the suite launches: every rank is a process on one machine
MAX_WORLD_SIZE = 64
#: concurrent driver launches at most
MAX_WORKERS = 64

#: each option of a run: `validate`'s keyword, and the pytest option that carries it
#: (``interlock conformance`` passes its own options on as these)
PYTEST_OPTIONS: tuple[tuple[str, str], ...] = (
    ("strategies", "--interlock-strategy"), ("runner", "--interlock-runner"),
    ("world_sizes", "--interlock-world-sizes"), ("precisions", "--interlock-precisions"),
    ("imports", "--interlock-import"), ("skips_file", "--interlock-skips-file"),
    ("xfails_file", "--interlock-xfails-file"), ("report", "--interlock-report"),
    ("allow_missing", "--interlock-allow-missing-runner"),
    ("keep_workdir", "--interlock-keep-workdir"), ("workers", "--interlock-workers"),
    ("checks", "--interlock-checks"))


class OptionError(ValueError):
    """An option the suite cannot run with (the message is one line)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteOptions:
    """What one run of the suite was asked for, validated.

    Attributes:
        strategies: the names given (``all`` kept as such; expanded by the cases).
        runner: ``auto`` or one runner name.
        world_sizes: distinct positive world sizes, in the order given.
        precisions: canonical precision names to restrict to, or None for every
            declared one.
        imports: modules imported to register strategies (already imported).
        skips, xfails: test-id prefixes read from the skips and xfails files.
        report: where the JSON report goes, or None.
        allow_missing: a requested runner this machine lacks, or a strategy whose
            required packages are missing, is recorded as skipped instead of failing
            the run.
        keep_workdir: keep the temporary directory with the drivers' logs.
        workers: how many driver launches run at once (0 and 1: one at a time).
        checks: the check ids to run, or None for every check. A run of a subset is
            partial: its report says so and verifies no cell.
    """

    strategies: tuple[str, ...]
    runner: str
    world_sizes: tuple[int, ...]
    precisions: tuple[str, ...] | None
    imports: tuple[str, ...] = ()
    skips: tuple[str, ...] = ()
    xfails: tuple[str, ...] = ()
    report: Path | None = None
    allow_missing: bool = False
    keep_workdir: bool = False
    workers: int = 0
    checks: tuple[str, ...] | None = None

    @property
    def partial(self) -> bool:
        """Whether the run leaves checks out (``checks`` given)."""
        return self.checks is not None


def validate(
    *,
    strategies: Sequence[str],
    runner: str,
    world_sizes: str,
    precisions: str | None,
    imports: Sequence[str] = (),
    skips_file: str | None = None,
    xfails_file: str | None = None,
    report: str | None = None,
    allow_missing: bool = False,
    keep_workdir: bool = False,
    workers: int = 0,
    checks: str | None = None,
) -> SuiteOptions:
    """Check every option; import the ``imports`` (they may register strategies that
    the strategy names refer to).

    Raises:
        OptionError: one line naming the option and what it accepts.
    """
    if runner not in RUNNER_CHOICES:
        raise OptionError(f"--runner {runner!r}: choose one of {', '.join(RUNNER_CHOICES)}")
    sizes = _world_sizes(world_sizes)
    check_workers(workers)
    chosen_checks = _checks(checks)
    chosen_precisions = _precisions(precisions)
    for module in imports:
        _import(module)
    names = _strategies(strategies)
    return SuiteOptions(
        strategies=names, runner=runner, world_sizes=sizes, precisions=chosen_precisions,
        imports=tuple(imports), skips=_read_ids("--skips-file", skips_file),
        xfails=_read_ids("--xfails-file", xfails_file), report=_report(report),
        allow_missing=allow_missing, keep_workdir=keep_workdir, workers=workers,
        checks=chosen_checks,
    )


def check_workers(workers: int) -> int:
    """The number of driver launches run at once (0: one at a time)."""
    if not 0 <= workers <= MAX_WORKERS:
        raise OptionError(f"--workers {workers}: expected 0 (run in this process) to "
                          f"{MAX_WORKERS}")
    return workers


def _world_sizes(text: str) -> tuple[int, ...]:
    sizes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or len(part) > 4:
            raise OptionError(f"--world-sizes {text!r}: expected comma-separated whole "
                              f"numbers from 1 to {MAX_WORLD_SIZE}, e.g. 1,2")
        size = int(part)
        if not 1 <= size <= MAX_WORLD_SIZE:
            raise OptionError(f"--world-sizes {text!r}: {size} is not a world size the "
                              f"suite launches (1 to {MAX_WORLD_SIZE} processes)")
        if size not in sizes:
            sizes.append(size)
    return tuple(sizes)


def _checks(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    from interlock.conformance.table import CHECK_IDS

    return _known_names("--checks", "check", text, CHECK_IDS)


def _precisions(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    from interlock.engine.registry import current_parts

    return _known_names("--precisions", "precision", text, current_parts().precision_names)


def _known_names(option: str, noun: str, text: str, names: Sequence[str]) -> tuple[str, ...]:
    """The comma-separated ``text`` as distinct names, each one of ``names``; an unknown
    one is an OptionError with a did-you-mean."""
    chosen: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part not in names:
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionError(f"{option}: unknown {noun} {part!r}{hint}; the suite's "
                              f"{noun}s are {', '.join(names)}")
        if part not in chosen:
            chosen.append(part)
    return tuple(chosen)


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure is the module's own
        first = str(error).splitlines()[0] if str(error) else ""
        raise OptionError(f"--import {module!r}: importing it failed with "
                          f"{type(error).__name__}: {first}") from None


def _strategies(names: Sequence[str]) -> tuple[str, ...]:
    from interlock.engine.registry import broken_entry_points, registered

    if not names:
        raise OptionError("--strategy: name at least one registered strategy, or 'all'")
    specs = registered(StrategySpec)
    broken = {n for ep in broken_entry_points("strategies") for n in ep.strategies}
    for name in names:
        if name == "all" or name in specs or name in broken:
            continue
        close = difflib.get_close_matches(name, list(specs), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise OptionError(f"--strategy: unknown strategy {name!r}{hint}; `interlock "
                          "strategies` lists the registered ones (a third-party one may "
                          "need --import MODULE)")
    return tuple(dict.fromkeys(names))


def _read_ids(option: str, path: str | None) -> tuple[str, ...]:
    """Test-id prefixes from a skips or xfails file: one per line, ``#`` comments; a
    full node id works too (what is inside its brackets is kept)."""
    if not path:
        return ()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise OptionError(f"{option} {path!r}: cannot be read: {reason}") from None
    ids = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            if "[" in entry:
                entry = entry.split("[", 1)[1].rstrip("]")
            ids.append(entry)
    return tuple(ids)


def _report(path: str | None) -> Path | None:
    if not path:
        return None
    from interlock.output_files import unwritable_reason

    problem = unwritable_reason(path)
    if problem is not None:
        raise OptionError(f"--report {path!r}: {problem}")
    return Path(path)
