"""The declaration check: the spec, the class and the engine agree (no launch needed)."""

from __future__ import annotations

import inspect
from typing import Any

from interlock.conformance.checks import CheckFailed
from interlock.conformance.reference import NoReference, recipe
from interlock.conformance.runners import RUNNERS
from interlock.engine.errors import ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.planner import plan
from interlock.engine.registry import broken_entry_points, current_parts, registered
from interlock.engine.spec_problems import spec_problems
from interlock.engine.specs import StrategySpec
from interlock.strategies.build import check_options, load_factory


def strategy_precisions(spec: StrategySpec, accelerator: str) -> frozenset[str]:
    """The precisions the strategy takes on ``accelerator`` and the accelerator runs,
    as `plan()` reads them: the spec's own and the registered precisions whose rows
    name the strategy (or the one it presets), less those the spec refuses there."""
    parts = current_parts()
    taken = parts.strategy_precisions(spec) - set(spec.precision_refusals.get(accelerator, {}))
    return taken & parts.accelerator_precisions.get(accelerator, frozenset())


def strategy_accelerators(spec: StrategySpec) -> frozenset[str]:
    """The accelerators the strategy runs on: its spec's and the registered
    accelerators whose rows name it."""
    return current_parts().strategy_accelerators(spec)


def runner_machine(runner: str, requires: tuple[str, ...]) -> Machine:
    """A simulated machine of the runner's kind with the strategy's packages."""
    packages = frozenset(p for p in requires if p in current_parts().packages)
    if runner == "cuda":
        return Machine(cuda_devices=2, packages=packages)
    if runner == "tpu":
        # two devices: the declaration plans with devices=2 (an XLA strategy takes one
        # device, all of them or one index, so the machine has exactly two)
        return Machine(xla_devices=2, packages=packages | {"torch_xla"})
    return Machine(packages=packages)


def api_problems(cls: type) -> list[str]:
    """Where ``cls`` departs from the Strategy API: missing or abstract members, and
    overrides that do not accept the base method's parameters."""
    from interlock.strategies.base import Strategy

    problems = []
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        return [f"{cls!r} is not a subclass of interlock.strategies.base.Strategy"]
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        problems.append(f"{cls.__name__} leaves abstract members unimplemented: {missing}")
    for name, base_member in inspect.getmembers(Strategy):
        if name.startswith("_") or not callable(base_member) or isinstance(
            inspect.getattr_static(Strategy, name), (staticmethod, classmethod)
        ):
            continue
        member = getattr(cls, name)
        base_params = inspect.signature(base_member).parameters
        params = inspect.signature(member).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        missing_params = [p for p in base_params if p not in params
                          and base_params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                          inspect.Parameter.VAR_KEYWORD)]
        if missing_params:
            problems.append(f"{cls.__name__}.{name}{inspect.signature(member)} does not "
                            f"accept {missing_params} of Strategy.{name}"
                            f"{inspect.signature(base_member)}")
    return problems


def _typed(strategy: Any) -> list[str]:
    """Runtime type checks of what a built (not yet set up) strategy returns."""
    # imported here, not with the module: the suite's pytest plugin imports the check
    # table (and so this module) while pytest still starts, and typeguard imported then
    # makes pytest warn that it cannot rewrite typeguard's own pytest plugin
    import torch
    from typeguard import TypeCheckError, check_type

    from interlock.strategies.accelerators import Accelerator
    from interlock.strategies.collectives import Collective
    from interlock.strategies.environments import ClusterEnvironment
    from interlock.strategies.io import CheckpointIO
    from interlock.strategies.precision import Precision

    expected: dict[str, Any] = {
        "accelerator": Accelerator, "precision": Precision, "checkpoint_io": CheckpointIO,
        "cluster_environment": ClusterEnvironment, "collective": Collective,
        "world_size": int, "global_rank": int, "local_rank": int, "node_rank": int,
        "is_global_zero": bool, "root_device": torch.device,
        "data_parallel_size": int, "data_parallel_rank": int,
    }
    problems = []
    for name, kind in expected.items():
        try:
            check_type(getattr(strategy, name), kind)
        except TypeCheckError as error:
            problems.append(f"{type(strategy).__name__}.{name}: {error}")
        except Exception as error:  # a property that cannot answer before setup
            if name != "root_device":
                problems.append(f"{type(strategy).__name__}.{name} raised "
                                f"{type(error).__name__}: {error}")
    return problems


def check_declaration(name: str, runner: str) -> None:
    """Raises CheckFailed listing every problem found."""
    specs = registered(StrategySpec)
    if name not in specs:
        broken = [ep for ep in broken_entry_points("strategies") if name in ep.strategies]
        if broken:
            raise CheckFailed("; ".join(f"the {ep.describe()} failed to load, so none of "
                                        f"its strategies can run: {ep.error}"
                                        for ep in broken))
    spec = specs[name]
    problems = list(spec_problems(spec))
    try:
        factory = load_factory(spec)
    except ImportError as error:
        raise CheckFailed(f"the factory {spec.factory} cannot be imported: {error}") from None
    if isinstance(factory, type):
        problems += api_problems(factory)
    try:
        check_options(spec, factory)
    except ResolutionError as error:
        problems.append(str(error))
    accelerator = RUNNERS[runner]
    machine = runner_machine(runner, spec.requires)
    devices = 1 if spec.max_devices == 1 else 2
    parts = current_parts()
    supported = parts.accelerator_precisions[accelerator]
    # the spec's own precisions and the registered ones whose rows name the strategy
    taken = strategy_precisions(spec, accelerator)
    built = None
    for precision in parts.precision_names:
        declared = precision in taken
        try:
            p = plan(strategy=name, accelerator=accelerator, devices=devices,
                     precision=precision, machine=machine)
        except ResolutionError as error:
            if declared and precision in supported and error.code != "missing-package":
                problems.append(f"plan() refuses the declared precision {precision!r} on "
                                f"{accelerator}: {error}")
            continue
        if not declared:
            refused = spec.precision_refusals.get(accelerator, {}).get(precision)
            problems.append(f"plan() accepts {precision!r}, which {name} " + (
                f"refuses on {accelerator} ({refused})" if refused else "does not declare"))
            continue
        try:
            recipe(precision)  # the parity checks will need its reference
        except NoReference as error:
            problems.append(str(error))
        if built is None and accelerator == "cpu":
            built = p.build()
    if built is not None:
        problems += _typed(built)
    if problems:
        raise CheckFailed("; ".join(problems))
