"""What is wrong with a would-be part row, as sentences (empty when it is valid).

One function per part kind whose row type lives in `interlock.engine.tables`, like
`interlock.engine.spec_problems.spec_problems` for strategies, and the checks every
kind shares (`common_problems`, `requires_problems`), which a kind whose row type has a
module of its own uses beside it (`interlock.engine.optimizers`). Each checks a row
against the rows already registered (``known``): a row may only refer to what exists
when it is registered. Entry point groups load in the order precisions, accelerators,
cluster environments, launchers, strategies, so each relation is declared by the row
that comes later: an accelerator names its precisions, a strategy its accelerators,
precisions and launcher, and a precision or an accelerator may name the already
registered (usually built-in) strategies that take it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from interlock.engine.limits import MAX_DEVICES_PER_NODE, int_in, short_repr
from interlock.engine.model import MAX_BYTES
from interlock.engine.registration import FACTORY_PATTERN, NAME_PATTERN
from interlock.engine.tables import (
    ACCELERATOR_ALIASES,
    ACCELERATOR_CHOOSERS,
    ACCELERATORS,
    EXTRA_DEVICES_FACT,
    LEGACY_PRECISIONS,
    REGISTERED_PRECISION_REFUSALS,
    START_METHODS,
    STRATEGY_PRECISION_PLUGINS,
    AcceleratorRow,
    CheckpointIORow,
    ClusterRow,
    LauncherRow,
    PackageRow,
    PrecisionRow,
)

#: the most state tensors per parameter an optimizer or precision row may declare
MAX_STATE_TENSORS = 16

#: Names of precisions: ``"bf16-mixed"``, ``"fp8-e4m3"``.
PRECISION_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_DTYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

#: Cluster environment names that would give a detection rule the id of another rule
#: of the cluster stage (``cluster/<name>``).
RESERVED_ENVIRONMENT_NAMES: frozenset[str] = frozenset({"plugin", "consistent"})

#: Conformance runners named by the built-in accelerator rows.
RUNNERS: tuple[str, ...] = tuple(r.runner for r in ACCELERATORS if r.runner is not None)


#: The rows registered so far, which a new row may refer to: every kind's rows by name,
#: keyed by kind (``known["precisions"]``); strategy specs are typed loosely, as the
#: specs module depends on this one.
Known = Mapping[str, Mapping[str, Any]]


def _is_str(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def common_problems(row: Any, pattern: re.Pattern[str], problems: list[str]) -> None:
    """Add to ``problems`` what is wrong with the fields every part row has: its
    ``name`` (against ``pattern``), ``factory`` and ``description``."""
    name = row.name
    if not isinstance(name, str) or not pattern.match(name):
        allowed = ("lowercase letters, digits and underscores, starting with a letter"
                   if pattern is NAME_PATTERN else
                   "lowercase letters, digits, '-', '_' and '.', starting with a letter "
                   "or digit")
        problems.append(f"name {name!r} must be {allowed}")
    if not isinstance(row.factory, str) or not FACTORY_PATTERN.match(row.factory):
        problems.append(f"factory {row.factory!r} must look like 'package.module:attribute'")
    if not _is_str(row.description):
        problems.append("description must be a non-empty string")


def _names(value: object, field: str, problems: list[str]) -> frozenset[str]:
    if not isinstance(value, frozenset) or not all(isinstance(v, str) for v in value):
        problems.append(f"{field} must be a set of names, got {type(value).__name__}")
        return frozenset()
    return value


def requires_problems(value: object, packages: Mapping[str, PackageRow]) -> list[str]:
    """What is wrong with a row's ``requires``: not a tuple of names, or names no
    package row (built-in or registered before it) declares."""
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        return [f"requires must be a tuple of package names, got {short_repr(value)}"]
    unknown = sorted(p for p in value if p not in packages)
    if unknown:
        return [f"requires {unknown} are not optional packages the engine knows (register "
                "a PackageRow for them first, or through the interlock.packages entry "
                f"point group); known: {', '.join(packages)}"]
    return []


#: Optional package names: importable top-level module names.
_MODULE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def package_problems(row: PackageRow, known: Known) -> list[str]:
    """What is wrong with a `PackageRow` (empty when it is valid)."""
    problems: list[str] = []
    if not isinstance(row.name, str) or not _MODULE_PATTERN.match(row.name):
        problems.append(f"name {short_repr(row.name)} must be an importable top-level "
                        "module name (letters, digits and underscores)")
    if not _is_str(row.install):
        problems.append("install must be a non-empty string (how to install the package)")
    return problems


def _bool(row: Any, field: str, problems: list[str]) -> None:
    if not isinstance(getattr(row, field), bool):
        problems.append(f"{field} must be a bool, got {getattr(row, field)!r}")


def _strategies(value: frozenset[str], known: Known, problems: list[str],
                own_precision: PrecisionRow | None) -> None:
    """Check the strategies a row names; for a precision row (``own_precision``), that
    each takes a precision's own plugin."""
    unknown = sorted(s for s in value if s not in known["strategies"])
    if unknown:
        problems.append(f"strategies {unknown} are not registered; a row may name only "
                        "strategies registered before it (a third-party strategy declares "
                        "this row in its own StrategySpec instead)")
    if own_precision is None:
        return
    for name in sorted(value):
        family = getattr(known["strategies"].get(name), "precision_plugin", None)
        if family is None:
            continue
        why = REGISTERED_PRECISION_REFUSALS.get(family, "its precision plugin is its own")
        if why is not None:
            problems.append(f"strategy {name!r} builds every precision itself ({why}); "
                            "name strategies that take a precision's own plugin")
        elif own_precision.scaler:
            problems.append(f"strategy {name!r} shards gradients, and a loss scaler of "
                            "the precision's own would not agree across the shards on "
                            "which steps to skip; a precision with scaler=True may not "
                            "name it")


def precision_problems(row: PrecisionRow, known: Known) -> list[str]:
    """Everything wrong with a would-be precision row."""
    problems: list[str] = []
    common_problems(row, PRECISION_NAME_PATTERN, problems)
    if isinstance(row.name, str) and (row.name in LEGACY_PRECISIONS or row.name.isdigit()):
        meaning = LEGACY_PRECISIONS.get(row.name)
        problems.append(f"name {row.name!r} is a legacy precision alias"
                        + (f" (of {meaning!r})" if meaning else " or reads as one"))
    for field in ("param_dtype", "compute_dtype"):
        value = getattr(row, field)
        if not isinstance(value, str) or not _DTYPE_PATTERN.match(value):
            problems.append(f"{field} {value!r} must be a dtype name such as 'bfloat16'")
    if not isinstance(row.output_dtype, str) or not _DTYPE_PATTERN.match(row.output_dtype):
        problems.append(f"output_dtype {row.output_dtype!r} must be 'default' or a dtype name")
    _bool(row, "scaler", problems)
    if not isinstance(row.plugin, str) or not _DTYPE_PATTERN.match(row.plugin):
        problems.append(f"plugin {row.plugin!r} must name a precision plugin family "
                        "(lowercase letters, digits and underscores)")
    elif row.plugin in STRATEGY_PRECISION_PLUGINS:
        problems.append(f"plugin {row.plugin!r} is a strategy's own precision family "
                        f"({', '.join(STRATEGY_PRECISION_PLUGINS)}), not a precision's")
    problems.extend(requires_problems(row.requires, known["packages"]))
    accelerators = _names(row.accelerators, "accelerators", problems)
    unknown = sorted(a for a in accelerators if a not in known["accelerators"])
    if unknown:
        problems.append(f"accelerators {unknown} are unknown; known: "
                        f"{', '.join(known['accelerators'])}")
    _strategies(_names(row.strategies, "strategies", problems), known, problems,
                own_precision=row)
    state_tensors_problems(row, problems)
    return problems


def state_tensors_problems(row: Any, problems: list[str]) -> None:
    """Add to ``problems`` what is wrong with a row's ``state_tensors``."""
    value = row.state_tensors
    if not int_in(value, 0, MAX_STATE_TENSORS):
        problems.append(f"state_tensors must be an int from 0 to {MAX_STATE_TENSORS}, got "
                        f"{short_repr(value)}")


def accelerator_problems(row: AcceleratorRow, known: Known) -> list[str]:
    """Everything wrong with a would-be accelerator row."""
    problems: list[str] = []
    common_problems(row, NAME_PATTERN, problems)
    if row.name in ACCELERATOR_CHOOSERS or row.name in ACCELERATOR_ALIASES:
        problems.append(f"name {row.name!r} is an accelerator input of its own "
                        f"({', '.join((*ACCELERATOR_CHOOSERS, *ACCELERATOR_ALIASES))})")
    if row.checkpoint_io not in known["checkpoint_io"]:
        problems.append(f"checkpoint_io {short_repr(row.checkpoint_io)} is unknown; known: "
                        f"{', '.join(known['checkpoint_io'])}")
    if row.device_count is not None and not (
        isinstance(row.device_count, str) and FACTORY_PATTERN.match(row.device_count)
    ):
        problems.append(f"device_count {short_repr(row.device_count)} must be None or look "
                        "like 'package.module:function'")
    if row.machine_fact != EXTRA_DEVICES_FACT:
        problems.append(f"machine_fact must be {EXTRA_DEVICES_FACT!r}: a registered "
                        f"accelerator's devices are counted in Machine.{EXTRA_DEVICES_FACT}"
                        f"[{row.name!r}], got {row.machine_fact!r}")
    precisions = _names(row.precisions, "precisions", problems)
    if isinstance(row.precisions, frozenset) and not precisions:
        problems.append("precisions must name at least one precision")
    unknown = sorted(p for p in precisions if p not in known["precisions"])
    if unknown:
        problems.append(f"precisions {unknown} are unknown; known: "
                        f"{', '.join(known['precisions'])}")
    if not _is_str(row.backend):
        problems.append("backend must name a torch.distributed backend, e.g. 'gloo'")
    if row.runner is not None and row.runner not in RUNNERS:
        problems.append(f"runner {row.runner!r} is unknown; known: {', '.join(RUNNERS)} "
                        "or None")
    problems.extend(requires_problems(row.requires, known["packages"]))
    if row.max_devices is not None and not int_in(row.max_devices, 1, MAX_DEVICES_PER_NODE):
        problems.append(f"max_devices must be None or an int from 1 to {MAX_DEVICES_PER_NODE}")
    _strategies(_names(row.strategies, "strategies", problems), known, problems,
                own_precision=None)
    if not int_in(row.memory_reserve, 0, MAX_BYTES):
        problems.append(f"memory_reserve must be an int of bytes >= 0, got "
                        f"{short_repr(row.memory_reserve)}")
    return problems


def environment_problems(row: ClusterRow, known: Known) -> list[str]:
    """Everything wrong with a would-be cluster environment row."""
    problems: list[str] = []
    common_problems(row, NAME_PATTERN, problems)
    if row.name in RESERVED_ENVIRONMENT_NAMES:
        problems.append(f"name {row.name!r} is reserved (its detection rule's id, "
                        f"cluster/{row.name}, is another rule's)")
    if row.detect is not None and not callable(row.detect):
        problems.append("detect must be None or a callable taking the environment mapping")
    if not _is_str(row.detect_doc):
        problems.append("detect_doc must say in words when it is detected")
    _bool(row, "external", problems)
    _bool(row, "one_process_per_node", problems)
    variables = row.variables
    if not isinstance(variables, tuple) or not all(isinstance(v, str) for v in variables):
        problems.append(f"variables must be a tuple of variable names, got {variables!r}")
        variables = ()
    for field in ("world_size_vars", "local_size_vars", "nodes_vars", "local_rank_vars"):
        value = getattr(row, field)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            problems.append(f"{field} must be a tuple of variable names, got {value!r}")
            continue
        undeclared = [v for v in value if v not in variables]
        if undeclared:
            problems.append(f"{field} reads {undeclared}, which variables does not declare "
                            "(Machine.probe() keeps only declared variables)")
    return problems


def launcher_problems(row: LauncherRow, known: Known) -> list[str]:
    """Everything wrong with a would-be launcher row."""
    problems: list[str] = []
    common_problems(row, NAME_PATTERN, problems)
    if row.start_method is not None and row.start_method not in START_METHODS:
        problems.append(f"start_method {row.start_method!r} is unknown; known: "
                        f"{', '.join(START_METHODS)} or None")
    _bool(row, "interactive", problems)
    _bool(row, "launches_single", problems)
    _bool(row, "restarts", problems)
    if not _is_str(row.on_failure):
        problems.append("on_failure must say in words what happens when a rank fails")
    if row.environment is not None and row.environment not in known["environments"]:
        problems.append(f"environment {short_repr(row.environment)} is not a cluster "
                        "environment registered before it; known: "
                        f"{', '.join(known['environments'])}")
    if row.placement is not None and not callable(row.placement):
        problems.append("placement must be None or a callable returning a sentence")
    if row.placement is not None and row.environment is None:
        problems.append("placement describes where an environment's ranks go: it needs "
                        "environment set")
    problems.extend(requires_problems(row.requires, known["packages"]))
    _strategies(_names(row.strategies, "strategies", problems), known, problems,
                own_precision=None)
    return problems


def checkpoint_io_problems(row: CheckpointIORow, known: Known) -> list[str]:
    """Everything wrong with a would-be checkpoint IO row."""
    problems: list[str] = []
    common_problems(row, NAME_PATTERN, problems)
    problems.extend(requires_problems(row.requires, known["packages"]))
    return problems
