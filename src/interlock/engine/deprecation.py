"""Deprecations: the one way a public name, parameter or value is retired.

The policy (docs/api-policy.md): a deprecated thing keeps working and warns with
:class:`InterlockDeprecationWarning` for at least one whole minor release, naming the
replacement, the release that deprecated it and the first release that may remove it;
the CHANGELOG lists it under "Deprecated". Everything here goes through
:func:`warn_deprecated`, so the wording and the removal arithmetic are the same
everywhere.

It lives in the engine, which imports nothing of interlock outside itself, so that
every layer can retire a name through it; its public path is `interlock.deprecation`.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class InterlockDeprecationWarning(DeprecationWarning):
    """A public name, parameter or value of interlock that is going away.

    A DeprecationWarning: a framework's test suite shows it (pytest does), while the
    framework's own users are not shown it by default.
    """


def removal_version(since: str) -> str:
    """The first release that may remove what ``since`` deprecated: the minor release
    after the next one, so that one whole minor release warns (0.2.x deprecates, 0.3.x
    still warns, 0.4.0 may remove).

    Raises:
        ValueError: ``since`` is not ``major.minor.patch``.
    """
    match = _VERSION.fullmatch(since)
    if match is None:
        raise ValueError(f"a deprecation's 'since' must be a release 'X.Y.Z'; got {since!r}")
    major, minor = int(match[1]), int(match[2])
    return f"{major}.{minor + 2}.0"


def deprecation_message(what: str, *, replacement: str, since: str) -> str:
    """The sentence every deprecation warning of interlock says."""
    return (f"{what} is deprecated since interlock {since} and may be removed in "
            f"{removal_version(since)}; use {replacement} instead")


def warn_deprecated(what: str, *, replacement: str, since: str, stacklevel: int = 2) -> None:
    """Warn that ``what`` is deprecated, naming ``replacement``.

    Args:
        what: the thing as a user wrote it (``"interlock.connector"``,
            ``"resolve(launcher_type=...)"``).
        replacement: what to write instead.
        since: the release that deprecated it.
        stacklevel: as for :func:`warnings.warn`, counted from the caller of this
            function (2: the caller's caller, the user's line).
    """
    warnings.warn(deprecation_message(what, replacement=replacement, since=since),
                  InterlockDeprecationWarning, stacklevel=stacklevel + 1)


def deprecated(*, replacement: str, since: str) -> Callable[[F], F]:
    """Mark a function or method deprecated: every call warns, then runs it."""

    def wrap(function: F) -> F:
        what = f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn_deprecated(what, replacement=replacement, since=since)
            return function(*args, **kwargs)

        wrapper.__doc__ = (f"Deprecated since {since}: use {replacement}.\n\n"
                           + (function.__doc__ or ""))
        return wrapper  # type: ignore[return-value]

    return wrap


def deprecated_names(module: str, find: Callable[[str], tuple[Any, str] | None], *,
                     since: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that keeps retired names of ``module`` working.

    ``find(name)`` returns what an old name stands for and the replacement to name in
    the warning, or None for a name that never existed (an AttributeError, as usual).
    """

    def __getattr__(name: str) -> Any:
        found = find(name)
        if found is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value, replacement = found
        warn_deprecated(f"{module}.{name}", replacement=replacement, since=since)
        return value

    return __getattr__


def moved_names(module: str, moved: Mapping[str, str], *, since: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that keeps old names importable from ``module``.

    ``moved`` maps each old name to its new home as ``"package.module:name"``; reading
    the old name warns and returns the object from there (imported only then). Other
    names raise AttributeError as usual. Use as
    ``__getattr__ = moved_names(__name__, {...}, since="0.2.0")``.
    """
    table = dict(moved)

    def find(name: str) -> tuple[Any, str] | None:
        target = table.get(name)
        if target is None:
            return None
        home, _, attribute = target.partition(":")
        return getattr(importlib.import_module(home), attribute), f"{home}.{attribute}"

    return deprecated_names(module, find, since=since)


__all__ = ["InterlockDeprecationWarning", "deprecated", "deprecated_names",
           "deprecation_message", "moved_names",
           "removal_version", "warn_deprecated"]
