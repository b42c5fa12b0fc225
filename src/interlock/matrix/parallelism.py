"""The parallelism section of the matrix: named layouts x strategies on a few profiles.

Each cell is what `plan()` answers when a strategy is asked for one layout (a value of
the ``parallelism=`` flag) on a machine profile: the mesh it resolves to, or the
refusal. Nothing here states a fact of its own; the layouts are only the questions.
``docs/compatibility.md`` shows the cells (see `interlock.matrix.compat`) and
``matrix.lock`` pins them (see `interlock.matrix.lock`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.errors import ResolutionError
from interlock.engine.parallelism import Degree, MeshLayout
from interlock.engine.planner import plan
from interlock.engine.specs import StrategySpec
from interlock.matrix.profiles import Profile, profile_named

#: the precision every cell is asked at
PRECISION = "32-true"

#: the strategy families the section covers, besides ``ddp`` itself (the other ddp
#: launch variants answer like it): every built-in non-variant row of these
FAMILIES: tuple[str, ...] = ("fsdp", "model_parallel", "deepspeed")

#: joins the dimensions of a resolved mesh in the documents ("pp2·dp_shard2·tp2")
SHAPE_SEPARATOR = "·"


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedLayout:
    """One question asked of every strategy: a value of the ``parallelism=`` flag.

    Attributes:
        key: short kebab-case id, used in matrix.lock.
        name: what the documents call it.
        flag: the ``parallelism=`` flag passed to `plan()`; None passes none (the
            strategy row's own default degrees).
    """

    key: str
    name: str
    flag: Mapping[str, Degree] | None

    def flag_text(self) -> str:
        """The flag as Python source: ``{"dp_replicate": 2, "dp_shard": 4}``; "not
        given" for None."""
        if self.flag is None:
            return "not given"
        items = (f'"{k}": ' + (f'"{v}"' if isinstance(v, str) else str(v))
                 for k, v in self.flag.items())
        return "{" + ", ".join(items) + "}"


def _layout(key: str, name: str, flag: Mapping[str, Degree] | None) -> NamedLayout:
    return NamedLayout(key=key, name=name,
                       flag=None if flag is None else MappingProxyType(dict(flag)))


#: The layouts shown, in row order. Those with an 'auto' degree fit any world; the
#: others are written for 8 ranks, so that a smaller world shows the fit check.
LAYOUTS: tuple[NamedLayout, ...] = (
    _layout("not-given", "not given", None),
    _layout("fsdp-all", "FSDP over all", {}),
    _layout("ddp", "DDP", {"dp_replicate": "auto", "dp_shard": 1}),
    _layout("hsdp-2x4", "HSDP 2 x 4", {"dp_replicate": 2, "dp_shard": 4}),
    _layout("fsdp-4-tp-2", "FSDP 4 x TP 2", {"dp_shard": 4, "tp": 2}),
    _layout("tp-2-fsdp-rest", "TP 2, FSDP over the rest", {"tp": 2}),
    _layout("tp-8", "TP 8", {"dp_shard": 1, "tp": 8}),
    _layout("pp-2-fsdp-2-tp-2", "PP 2 x FSDP 2 x TP 2", {"pp": 2, "dp_shard": 2, "tp": 2}),
    _layout("cp-2-fsdp-rest", "CP 2, FSDP over the rest", {"cp": 2}),
    _layout("tp-3", "TP 3", {"tp": 3}),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """A profile and the job geometry the section asks for on it.

    Attributes:
        profile: the machine profile's name (see `interlock.matrix.profiles`).
        devices: the devices flag (per node).
        num_nodes: the node count.
    """

    profile: str
    devices: int
    num_nodes: int

    @property
    def machine_profile(self) -> Profile:
        return profile_named(self.profile)

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


#: The profiles the section is computed on, in order. cuda-8-extras is 8 GPUs on one
#: node with deepspeed installed (so that deepspeed's cells answer about parallelism
#: rather than a missing package); slurm-2x4 is rank 0 of a SLURM step of 2 nodes x 4
#: GPUs (the geometry of its launch-environment cell); cpu-laptop with 4 processes
#: shows what the CPU refuses.
SETTINGS: tuple[Setting, ...] = (
    Setting(profile="cuda-8-extras", devices=8, num_nodes=1),
    Setting(profile="slurm-2x4", devices=4, num_nodes=2),
    Setting(profile="cpu-laptop", devices=4, num_nodes=1),
)


def strategies() -> tuple[StrategySpec, ...]:
    """The strategies the section covers, in registry order: ``ddp`` and every built-in
    non-variant row of `FAMILIES`."""
    return tuple(s for s in BUILTIN_STRATEGIES if s.variant_of is None
                 and (s.name == "ddp" or s.family in FAMILIES))


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """What `plan()` answers for one cell.

    Attributes:
        mesh: the resolved mesh, or None for a refusal.
        notes: the plan's notes (a resolved cell).
        code: the refusal's code.
        flag: the flag the refusal names.
        reason: the refusal's reason.
    """

    mesh: MeshLayout | None = None
    notes: tuple[str, ...] = ()
    code: str = ""
    flag: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.mesh is not None

    def degrees(self) -> tuple[tuple[str, int], ...]:
        """The dimensions of degree above 1, outermost first (a resolved cell)."""
        assert self.mesh is not None
        return tuple((d, n) for d, n in zip(self.mesh.dims, self.mesh.shape, strict=True)
                     if n != 1)

    def shape(self, separator: str = SHAPE_SEPARATOR) -> str:
        """The resolved mesh as the documents show it: ``pp2·dp_shard2·tp2`` (the
        dimensions of degree above 1; "one rank" when there are none)."""
        return separator.join(f"{d}{n}" for d, n in self.degrees()) or "one rank"

    def token(self) -> str:
        """The outcome as one line of matrix.lock: ``ok pp=2,dp_shard=2,tp=2`` or
        ``<code> <flag>`` (the reason is left out, as in the rest of the lock)."""
        if self.mesh is None:
            return f"{self.code} {self.flag}"
        return "ok " + (",".join(f"{d}={n}" for d, n in self.degrees()) or "one-rank")


def ask(setting: Setting, layout: NamedLayout, strategy: str) -> Answer:
    """`plan()`'s answer for one cell (accelerator "auto", precision `PRECISION`)."""
    try:
        result = plan(strategy=strategy, devices=setting.devices,
                      num_nodes=setting.num_nodes, precision=PRECISION,
                      machine=setting.machine_profile.machine,
                      parallelism=None if layout.flag is None else dict(layout.flag))
    except ResolutionError as error:
        return Answer(code=error.code, flag=error.flag, reason=error.reason)
    return Answer(mesh=result.mesh, notes=result.notes)


@dataclass(frozen=True, slots=True)
class Table:
    """One profile's cells: a row per layout (`LAYOUTS` order), a column per strategy."""

    setting: Setting
    strategies: tuple[StrategySpec, ...]
    rows: tuple[tuple[NamedLayout, tuple[Answer, ...]], ...]


def compute(settings: tuple[Setting, ...] = SETTINGS,
            layouts: tuple[NamedLayout, ...] = LAYOUTS) -> tuple[Table, ...]:
    """Every cell of the section, one `Table` per setting."""
    specs = strategies()
    return tuple(
        Table(setting=setting, strategies=specs, rows=tuple(
            (layout, tuple(ask(setting, layout, spec.name) for spec in specs))
            for layout in layouts))
        for setting in settings
    )


#: (profile, layout key, strategy)
ParallelismKey = tuple[str, str, str]


def outcomes(tables: tuple[Table, ...] | None = None) -> dict[ParallelismKey, str]:
    """Every cell's lock token (see `Answer.token`), keyed by (profile, layout key,
    strategy), in table order."""
    found: dict[ParallelismKey, str] = {}
    for table in compute() if tables is None else tables:
        for layout, cells in table.rows:
            for spec, answer in zip(table.strategies, cells, strict=True):
                found[(table.setting.profile, layout.key, spec.name)] = answer.token()
    return found


__all__ = [
    "FAMILIES",
    "LAYOUTS",
    "PRECISION",
    "SETTINGS",
    "Answer",
    "NamedLayout",
    "ParallelismKey",
    "Setting",
    "Table",
    "ask",
    "compute",
    "outcomes",
    "strategies",
]
