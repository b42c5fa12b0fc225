"""The one deprecation helper: its wording, its removal arithmetic, and that a
deprecated thing keeps working while it warns."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
import warnings

import pytest

import interlock
from interlock.deprecation import (
    InterlockDeprecationWarning,
    deprecated,
    moved_names,
    removal_version,
    warn_deprecated,
)
from interlock.strategies.precision.mixed import MixedPrecision


def test_one_whole_minor_release_warns_before_removal() -> None:
    assert removal_version("0.2.0") == "0.4.0"
    assert removal_version("0.2.5") == "0.4.0"
    assert removal_version("1.9.1") == "1.11.0"
    with pytest.raises(ValueError, match=r"'since' must be a release 'X.Y.Z'; got '0.2'"):
        removal_version("0.2")


def test_the_warning_names_the_replacement_the_release_and_the_removal() -> None:
    def old_api() -> None:
        warn_deprecated("resolve(old=...)", replacement="resolve(new=...)", since="0.2.0")

    with pytest.warns(InterlockDeprecationWarning) as caught:
        old_api()
    assert str(caught[0].message) == (
        "resolve(old=...) is deprecated since interlock 0.2.0 and may be removed in "
        "0.4.0; use resolve(new=...) instead")
    # the warning points at the user's line (this file), not at the helper
    assert caught[0].filename == __file__
    assert issubclass(interlock.InterlockDeprecationWarning, DeprecationWarning)


def test_a_deprecated_function_still_runs_and_warns_at_the_call() -> None:
    @deprecated(replacement="interlock.plan", since="0.2.0")
    def old_plan(x: int, *, y: int = 1) -> int:
        """Adds."""
        return x + y

    with pytest.warns(InterlockDeprecationWarning, match="old_plan is deprecated since "
                      "interlock 0.2.0 .* use interlock.plan instead") as caught:
        assert old_plan(2, y=3) == 5
    assert caught[0].filename == __file__
    assert old_plan.__name__ == "old_plan" and "Deprecated since 0.2.0" in (old_plan.__doc__
                                                                            or "")


def test_moved_names_keep_old_imports_working() -> None:
    module = types.ModuleType("interlock_old_home")
    module.__getattr__ = moved_names(  # type: ignore[method-assign]
        "interlock_old_home", {"plan": "interlock.engine.planner:plan"}, since="0.2.0")
    with pytest.warns(InterlockDeprecationWarning,
                      match="interlock_old_home.plan is deprecated .* use "
                      "interlock.engine.planner.plan instead"):
        assert module.plan is interlock.plan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
            _ = module.nothing


def test_a_plugin_marked_with_the_former_attribute_still_plans_and_warns() -> None:
    class OldStylePrecision:
        interlock_plugin_kind = "precision"  # the marker's name before 0.2.0
        precision = "bf16-mixed"

    plugin = OldStylePrecision()
    with pytest.warns(InterlockDeprecationWarning,
                      match=r"interlock_plugin_kind \(declared by .*OldStylePrecision\) is "
                      r"deprecated since interlock 0.2.0 .* use interlock_part_kind"):
        planned = interlock.plan(accelerator="cpu", devices=1, plugins=[plugin])
    assert planned.precision == "bf16-mixed" and plugin in planned.plugins
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the runtime's own plugins use the new name
        interlock.plan(accelerator="cpu", devices=1,
                       plugins=[MixedPrecision("bf16-mixed", "cpu")])


#: run in a fresh interpreter: the old path warns on its first import in a process
_OLD_PATH = textwrap.dedent("""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import interlock.connector.planner as old
        import interlock.connector.stages.flags.draft as old_draft
        from interlock.connector import ResolutionError, plan
        from interlock.connector.errors import ResolutionError as OldError
    import interlock
    import interlock.engine.planner as new
    import interlock.engine.stages.flags.draft as new_draft
    assert old is new and old_draft is new_draft, (old, new, old_draft, new_draft)
    assert new.__spec__.name == "interlock.engine.planner", new.__spec__
    assert new_draft.__spec__.name == "interlock.engine.stages.flags.draft"
    assert ResolutionError is OldError is interlock.ResolutionError
    assert plan is interlock.plan
    import interlock.connector.parts as old_queries
    import interlock.engine.runtime_queries as queries
    assert old_queries is queries
    print([str(w.message) for w in caught])
    try:
        import interlock.connector.no_such_module
    except ModuleNotFoundError as error:
        print(error.name)
""")


def test_the_engines_old_path_warns_once_and_is_the_same_modules() -> None:
    result = subprocess.run([sys.executable, "-c", _OLD_PATH], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    warned, missing = result.stdout.splitlines()
    assert warned == str([
        "interlock.connector is deprecated since interlock 0.2.0 and may be removed in "
        "0.4.0; use interlock.engine instead"])
    assert missing == "interlock.connector.no_such_module"
