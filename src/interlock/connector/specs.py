"""`StrategySpec`: the registry row that declares what a strategy can do."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from interlock.connector.memory import REPLICATED, MemoryTraits
from interlock.connector.parallelism import DIMS
from interlock.connector.parts_registry import current_parts
from interlock.connector.registration import FACTORY_PATTERN, suspects
from interlock.connector.tables import STRATEGY_PRECISION_PLUGINS

#: capability tags a spec may declare; the conformance suite runs the checks that
#: need them only for strategies that declare them (and fails those that do not hold)
CAPABILITIES: dict[str, str] = {
    "accumulation": "no_backward_sync skips gradient synchronisation, and gradients "
    "accumulated under it equal the large batch's",
    "clipping": "clip_gradients_norm and clip_gradients_value clip exactly the gradients "
    "of the optimizer given (unscaled first), so a model with one optimizer per "
    "submodule clips each on its own",
    "resharding": "a checkpoint saved at one world size loads at another",
    "timeout": "the strategy has a process-group `timeout` after which a rank that never "
    "reaches a collective becomes an error",
    "elastic": "`launch(max_restarts=N)` survives a rank that dies (SIGKILL, during a "
    "save too), raises or hangs (with `timeout`): every rank restarts and training "
    "resumed from the last checkpoint ends exactly where an uninterrupted run does",
    "engine_gradients": "a declared difference: gradients live in the strategy's own "
    "(partitioned) buffers, so a parameter's `.grad` stays None after backward "
    "(DeepSpeed's ZeRO engine); the suite checks exactly that instead of the gradient "
    "dtype",
    "parameter_offload": "a declared difference: between uses the parameters (or their "
    "shards) live in CPU memory, not on root_device (FSDP's CPU offload); the suite "
    "checks that they are on the CPU instead",
}

#: the family a third-party strategy declares when it belongs to none of the built-in
#: families (see `strategy_families`)
OTHER_FAMILY = "other"

#: the most steps a spec may ask the parity checks to take (each step costs the suite
#: time in every rank, for every precision)
MAX_PARITY_STEPS = 50

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_FACTORY = FACTORY_PATTERN


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategySpec:
    """Declares a strategy: its name, where its factory lives and what it supports.

    Attributes:
        name: registry name (lowercase, digits, underscores).
        factory: ``"package.module:attribute"`` of the strategy class or factory,
            imported only when a plan is built.
        description: one line for the docs and error messages.
        family: group shown in the docs: a built-in row's family (``"ddp"``,
            ``"fsdp"``, ...) or ``"other"``; `strategy_families` lists them.
        accelerators: accelerators it runs on.
        precisions: precisions it supports (further narrowed by the accelerator).
        launcher: launcher name from the launcher table, or None when it runs in
            the calling process.
        multi_node: whether it can span several nodes.
        max_devices: devices per node at most, if limited.
        requires: optional packages it needs.
        options: keyword arguments the factory receives; keys the factory's
            constructor does not take are refused when the plan is built
            (``unknown-option``).
        substitutes: per accelerator it does not support, the strategy to use instead.
        capabilities: free-form capability tags read by the conformance suite.
        variant_of: the strategy this one is a preset of; variants are left out of
            the alternatives that error messages list.
        precision_plugin: the precision plugin family the strategy needs for every
            precision (one of ``STRATEGY_PRECISION_PLUGINS``: ``"fsdp"``,
            ``"deepspeed"``, ``"xla"``); None takes the precision table's plugin.
        parity_tolerance: ``(rtol, atol)`` the conformance suite allows in training
            parity beyond the precision's own, for strategies that change numerics on
            purpose (gradient compression); None for exact strategies.
        precision_refusals: per accelerator, precisions the strategy declares but does
            not support on that accelerator, each with the reason (a measured fact, e.g.
            DeepSpeed's CPU accelerator has no float16); the engine refuses them there
            with ``unsupported-precision`` and that reason.
        parity_steps: optimizer steps the conformance suite's parity checks take, for
            strategies whose numerics change only after a warm-up (PowerSGD's
            ``start_powerSGD_iter``); None keeps the suite's defaults (3 steps for
            training parity, 2 for accumulation parity).
        parallel_dims: the dimensions of parallelism (`interlock.Parallelism`) a user
            may set above 1 with the ``parallelism=`` flag; any other must be 1
            (``unsupported-parallelism`` otherwise).
        default_parallelism: the degrees the strategy runs with when the flag is not
            given: per dimension an int, ``"auto"`` (what the others leave of the
            world; at most one) or ``"node"`` (the devices of one node); dimensions
            left out are 1.
        memory: how the strategy holds a model (`interlock.connector.memory.MemoryTraits`:
            what it shards, offloads and allocates), read by the memory estimate
            (``plan(model=...)``). None: by family: ``ddp`` keeps everything whole with
            gradient buckets, ``single_device`` whole with nothing else, any other family
            shards every state over its sharding group as FSDP does (`memory_traits`).
    """

    name: str
    factory: str
    description: str
    family: str
    accelerators: frozenset[str]
    precisions: frozenset[str]
    launcher: str | None
    multi_node: bool = True
    max_devices: int | None = None
    requires: tuple[str, ...] = ()
    options: Mapping[str, object] = field(default_factory=dict)
    substitutes: Mapping[str, str] = field(default_factory=dict)
    capabilities: frozenset[str] = frozenset()
    variant_of: str | None = None
    precision_plugin: str | None = None
    parity_tolerance: tuple[float, float] | None = None
    parity_steps: int | None = None
    precision_refusals: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    parallel_dims: frozenset[str] = frozenset()
    default_parallelism: Mapping[str, object] = field(
        default_factory=lambda: {"dp_replicate": "auto"})
    memory: MemoryTraits | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "accelerators", frozenset(self.accelerators))
        object.__setattr__(self, "precisions", frozenset(self.precisions))
        object.__setattr__(self, "requires", tuple(self.requires))
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "substitutes", MappingProxyType(dict(self.substitutes)))
        object.__setattr__(self, "parallel_dims", frozenset(self.parallel_dims))
        object.__setattr__(self, "default_parallelism",
                           MappingProxyType(dict(self.default_parallelism)))
        object.__setattr__(self, "precision_refusals", MappingProxyType({
            a: MappingProxyType(dict(r)) if isinstance(r, Mapping) else r
            for a, r in dict(self.precision_refusals).items()
        }))

    def __hash__(self) -> int:
        return hash((self.name, self.factory))

    def __reduce__(self) -> tuple[object, ...]:
        # mappingproxy does not pickle; specs travel to spawned workers with plans
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields["options"] = dict(self.options)
        fields["substitutes"] = dict(self.substitutes)
        fields["default_parallelism"] = dict(self.default_parallelism)
        fields["precision_refusals"] = {a: dict(r) for a, r in self.precision_refusals.items()}
        return (_rebuild_spec, (fields,))

    def precisions_on(self, accelerator: str) -> frozenset[str]:
        """The declared precisions less those refused on ``accelerator``."""
        return self.precisions - set(self.precision_refusals.get(accelerator, {}))

    @property
    def memory_traits(self) -> MemoryTraits:
        """``memory``, or the family's default when the row gives none."""
        if self.memory is not None:
            return self.memory
        if self.family == "ddp":
            return REPLICATED
        if self.family == "single_device":
            return SINGLE
        return SHARDED

    @property
    def interactive(self) -> bool:
        """Whether the strategy can start its processes from a notebook or REPL."""
        if self.launcher is None:
            return True
        row = current_parts().launchers.get(self.launcher)
        return row is not None and row.interactive


#: the default traits of the single_device family, and of the families that shard
SINGLE = MemoryTraits(sharded=frozenset(), buffers="none")
SHARDED = MemoryTraits()


def _rebuild_spec(fields: dict[str, object]) -> StrategySpec:
    return StrategySpec(**fields)  # type: ignore[arg-type]


def strategy_families() -> tuple[str, ...]:
    """The values ``StrategySpec.family`` may take: the built-in rows' families, in
    table order, then ``"other"`` for a strategy that belongs to none of them."""
    # imported here: the built-in rows are StrategySpecs themselves
    from interlock.connector.builtin import BUILTIN_STRATEGIES

    return (*dict.fromkeys(s.family for s in BUILTIN_STRATEGIES), OTHER_FAMILY)


def spec_problems(spec: object) -> list[str]:
    """Everything wrong with a would-be spec, as sentences; empty when it is valid."""
    if not isinstance(spec, StrategySpec):
        return [f"expected a StrategySpec, got {type(spec).__name__}"]
    problems: list[str] = []
    if not isinstance(spec.name, str) or not _NAME.match(spec.name):
        problems.append(
            f"name {spec.name!r} must be lowercase letters, digits and underscores, "
            "starting with a letter"
        )
    if spec.name == "auto":
        problems.append("name 'auto' is reserved")
    if not isinstance(spec.factory, str) or not _FACTORY.match(spec.factory):
        problems.append(f"factory {spec.factory!r} must look like 'package.module:attribute'")
    if not isinstance(spec.description, str) or not spec.description.strip():
        problems.append("description must be a non-empty string")
    families = strategy_families()
    if spec.family not in families:
        problems.append(
            f"family {spec.family!r} is unknown; known: {', '.join(families)} "
            f"('{OTHER_FAMILY}' for a strategy that belongs to none of the others)"
        )
    parts = current_parts()
    if not spec.accelerators:
        problems.append("accelerators must name at least one accelerator")
    unknown = sorted(a for a in spec.accelerators if a not in parts.accelerators)
    if unknown:
        problems.append(
            f"accelerators {unknown} are unknown; known: {', '.join(parts.accelerators)}"
            + suspects(parts.broken["accelerators"])
        )
    if not spec.precisions:
        problems.append("precisions must name at least one precision")
    unknown = sorted(p for p in spec.precisions if p not in parts.precisions)
    if unknown:
        problems.append(f"precisions {unknown} are unknown; known: "
                        f"{', '.join(parts.precisions)}" + suspects(parts.broken["precisions"]))
    if spec.launcher is not None and spec.launcher not in parts.launchers:
        problems.append(
            f"launcher {spec.launcher!r} is unknown; known: {', '.join(parts.launchers)} or "
            "None" + suspects(parts.broken["launchers"])
        )
    if not isinstance(spec.multi_node, bool):
        problems.append("multi_node must be a bool")
    if spec.max_devices is not None and (
        not isinstance(spec.max_devices, int) or isinstance(spec.max_devices, bool)
        or spec.max_devices < 1
    ):
        problems.append("max_devices must be None or an int >= 1")
    # imported here: checking is for registration, not for every import of the engine
    from interlock.connector.part_problems import requires_problems

    problems.extend(requires_problems(spec.requires, parts.packages))
    if spec.precision_plugin is not None and (
        spec.precision_plugin not in STRATEGY_PRECISION_PLUGINS
    ):
        problems.append(
            f"precision_plugin {spec.precision_plugin!r} is unknown; known: "
            f"{', '.join(STRATEGY_PRECISION_PLUGINS)} or None"
        )
    for accelerator, refused in spec.precision_refusals.items():
        if accelerator not in spec.accelerators:
            problems.append(f"precision_refusals names accelerator {accelerator!r}, which "
                            "the strategy does not declare")
        if not isinstance(refused, Mapping) or not all(
            isinstance(p, str) and isinstance(why, str) and why.strip()
            for p, why in refused.items()
        ):
            problems.append(f"precision_refusals[{accelerator!r}] must map precisions to "
                            "non-empty reasons")
        elif not set(refused) <= spec.precisions:
            problems.append(f"precision_refusals[{accelerator!r}] names precisions the "
                            f"strategy does not declare: {sorted(set(refused) - spec.precisions)}")
    if spec.parity_tolerance is not None and not (
        isinstance(spec.parity_tolerance, tuple) and len(spec.parity_tolerance) == 2
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1
                for t in spec.parity_tolerance)
    ):
        problems.append("parity_tolerance must be None or (rtol, atol), each in [0, 1)")
    if spec.parity_steps is not None and (
        not isinstance(spec.parity_steps, int) or isinstance(spec.parity_steps, bool)
        or not 1 <= spec.parity_steps <= MAX_PARITY_STEPS
    ):
        problems.append(
            f"parity_steps must be None or an int from 1 to {MAX_PARITY_STEPS}"
        )
    unknown = sorted(c for c in spec.capabilities if c not in CAPABILITIES)
    if unknown:
        problems.append(
            f"capabilities {unknown} are unknown; known: {', '.join(CAPABILITIES)}"
        )
    problems.extend(_parallelism_problems(spec))
    if spec.memory is not None:
        problems.extend(spec.memory.problems() if isinstance(spec.memory, MemoryTraits)
                        else [f"memory must be a MemoryTraits or None, got "
                              f"{type(spec.memory).__name__}"])
    for accelerator in spec.substitutes:
        if accelerator not in parts.accelerators:
            problems.append(f"substitutes names unknown accelerator {accelerator!r}")
        elif accelerator in spec.accelerators:
            problems.append(
                f"substitutes names {accelerator!r}, which the strategy itself supports"
            )
    return problems



def _parallelism_problems(spec: StrategySpec) -> list[str]:
    """What is wrong with a spec's `parallel_dims` and `default_parallelism`."""
    problems: list[str] = []
    unknown = sorted(str(d) for d in spec.parallel_dims if d not in DIMS)
    if unknown:
        problems.append(f"parallel_dims {unknown} are unknown; known: {', '.join(DIMS)}")
    defaults = spec.default_parallelism
    if not isinstance(defaults, Mapping):
        return [*problems, "default_parallelism must map dimensions to degrees"]
    for dim, degree in defaults.items():
        if dim not in DIMS:
            problems.append(f"default_parallelism names {dim!r}, which is not a dimension; "
                            f"known: {', '.join(DIMS)}")
        elif not (degree in ("auto", "node") or (
                isinstance(degree, int) and not isinstance(degree, bool) and degree >= 1)):
            problems.append(f"default_parallelism[{dim!r}] = {degree!r} must be an int >= 1, "
                            "'auto' or 'node'")
    if sum(1 for d in defaults.values() if d == "auto") > 1:
        problems.append("default_parallelism may have at most one 'auto' degree")
    return problems
