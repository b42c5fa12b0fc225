"""`StrategySpec`: the registry row that declares what a strategy can do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from interlock.engine.memory import REPLICATED, MemoryTraits
from interlock.engine.registry import current_parts
from interlock.engine.tables import LauncherRow

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
#: families (see `interlock.engine.spec_problems.strategy_families`)
OTHER_FAMILY = "other"

#: the most steps a spec may ask the parity checks to take (each step costs the suite
#: time in every rank, for every precision)
MAX_PARITY_STEPS = 50



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
            the calling process: the launcher it uses unless ``launcher=`` asks for
            another.
        launchers: the other launchers it runs under, chosen with ``launcher=``
            (``plan(strategy="ddp", launcher="spawn")``); a launcher row may add itself
            (`LauncherRow.strategies`).
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
        preset_of: the strategy row this one was expanded from (a `StrategyPreset`:
            the same strategy under a named launcher and options); rows that name that
            strategy (precisions, accelerators) reach this one too. None for a row
            written out in full.
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
        memory: how the strategy holds a model (`interlock.engine.memory.MemoryTraits`:
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
    launchers: frozenset[str] = frozenset()
    multi_node: bool = True
    max_devices: int | None = None
    requires: tuple[str, ...] = ()
    options: Mapping[str, object] = field(default_factory=dict)
    substitutes: Mapping[str, str] = field(default_factory=dict)
    capabilities: frozenset[str] = frozenset()
    variant_of: str | None = None
    preset_of: str | None = None
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
        object.__setattr__(self, "launchers", frozenset(self.launchers))
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


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyPreset:
    """A name for a registered strategy under a given launcher and options.

    ``ddp_spawn`` is ``ddp`` started by the spawn launcher; a package that brings a
    launcher may name a strategy under it the same way (``ray_fsdp``). The registry
    expands a preset into a full `StrategySpec` (`expand_preset`) from the strategy
    it names, so every fact of that strategy is written once, in its own row.

    Attributes:
        name: the preset's registry name.
        strategy: the registered strategy it stands for (a built-in row or one
            registered before it).
        description: one line for the docs.
        launcher: the launcher it pins (one the strategy takes); None keeps the
            strategy's own launcher and its choice of others.
        options: keyword arguments added to the strategy's own ``options``.
        variant_of: as `StrategySpec.variant_of` (left out of the alternatives that
            refusals list).
    """

    name: str
    strategy: str
    description: str
    launcher: str | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    variant_of: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.options, Mapping):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __hash__(self) -> int:
        return hash((self.name, self.strategy, self.launcher))

    def __reduce__(self) -> tuple[object, ...]:
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields["options"] = dict(self.options)
        return (_rebuild_preset, (fields,))


def expand_preset(preset: StrategyPreset, base: StrategySpec,
                  launcher: LauncherRow | None = None) -> StrategySpec:
    """The full row ``preset`` stands for: ``base`` under the preset's name, launcher
    (whose row is ``launcher``) and options. A preset that pins a launcher takes no
    other (``launchers`` empty) and needs that launcher's packages."""
    pinned = preset.launcher is not None
    expanded = replace(
        base, name=preset.name, description=preset.description,
        launcher=preset.launcher if pinned else base.launcher,
        launchers=frozenset() if pinned else base.launchers,
        options={**base.options, **preset.options},
        variant_of=preset.variant_of,
        preset_of=base.preset_of or base.name,
    )
    return with_launcher(expanded, launcher) if launcher is not None else expanded


def with_launcher(spec: StrategySpec, launcher: LauncherRow) -> StrategySpec:
    """``spec`` started by ``launcher``: that launcher, and its packages required."""
    return replace(spec, launcher=launcher.name,
                   requires=tuple(dict.fromkeys((*spec.requires, *launcher.requires))))


def _rebuild_preset(fields: dict[str, object]) -> StrategyPreset:
    return StrategyPreset(**fields)  # type: ignore[arg-type]


#: the default traits of the single_device family, and of the families that shard
SINGLE = MemoryTraits(sharded=frozenset(), buffers="none")
SHARDED = MemoryTraits()


def _rebuild_spec(fields: dict[str, object]) -> StrategySpec:
    return StrategySpec(**fields)  # type: ignore[arg-type]
